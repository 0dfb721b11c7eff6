"""Documents in (`extraction/documents.py`): PDF, HTML and DOCX files for extraction.

Every file is made here, in `tmp_path`: PDFs written by hand (objects, a Helvetica
font, a content stream with one `Tj` per line, the cross-reference table), HTML as
bytes, DOCX with python-docx. Extraction runs on `ExtractionFakeChatModel`, which
quotes the sentences with normative cue words (must, should, never, ...) of each
section it is sent; its `calls` and `prompts` say what the model was really sent.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docx
import pypdf
import pytest
from docx.styles.styles import Styles
from langchain_core.documents import Document
from pypdf._crypt_providers import _fallback as fallback

from langchain_tag import cli
from langchain_tag.errors import DocumentError
from langchain_tag.extraction import aextract_rules, documents, extract_rules, prompts
from langchain_tag.extraction.documents import (
    PAGE_SEPARATOR,
    document_sections,
    load_document,
    load_documents,
    page_starts_of,
    pages_of,
    to_documents,
)
from langchain_tag.extraction.sectioning import Section, split_sections
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rulebook
from langchain_tag.testing import ExtractionFakeChatModel

# --- files made for the tests ---------------------------------------------------------

IMAGE_ONLY = None
"""A page drawn as an image, with no text layer: what a scanner writes."""


def pdf_bytes(pages: Sequence[Sequence[str] | None]) -> bytes:
    """A minimal PDF: one page per item, each line of text shown with `Tj`.

    A page given as `IMAGE_ONLY` draws a 1x1 gray image and no text; an empty list
    makes an empty page.
    """
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")
    tree = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    image = add(
        b"<< /Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace "
        b"/DeviceGray /BitsPerComponent 8 /Length 1 >>\nstream\n\x80\nendstream"
    )
    kids = []
    for lines in pages:
        if lines is IMAGE_ONLY:
            ops = ["q 612 0 0 792 0 0 cm /Im1 Do Q"]
        else:
            ops = ["BT /F1 12 Tf 14 TL 72 720 Td"] if lines else []
            for number, line in enumerate(lines):
                text = (
                    line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
                )
                ops.append(f"{'T* ' if number else ''}({text}) Tj")
            ops += ["ET"] if lines else []
        stream = "\n".join(ops).encode("latin-1")
        contents = add(
            b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream)
        )
        kids.append(
            add(
                f"<< /Type /Page /Parent {tree} 0 R /MediaBox [0 0 612 792] "
                f"/Resources << /Font << /F1 {font} 0 R >> /XObject << /Im1 {image} "
                f"0 R >> >> /Contents {contents} 0 R >>".encode()
            )
        )
    objects[catalog - 1] = f"<< /Type /Catalog /Pages {tree} 0 R >>".encode()
    kid_refs = " ".join(f"{kid} 0 R" for kid in kids)
    objects[tree - 1] = (
        f"<< /Type /Pages /Kids [{kid_refs}] /Count {len(kids)} >>".encode()
    )
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        catalog,
        xref,
    )
    return bytes(out)


def write_pdf(path: Path, pages: Sequence[Sequence[str] | None]) -> Path:
    path.write_bytes(pdf_bytes(pages))
    return path


# Each page opens with a numbered heading, then a sentence that states no rule (the
# fake quotes whole sentences: the heading goes with it). Pages are long enough to
# be sections of their own.
PAGE_1 = [
    "1. Badges",
    "Badges are issued by the front office on the first day of work.",
    "Employees must wear a badge at all times.",
    "Lost badges should be reported the same day.",
    "A new badge takes about two working days to be printed.",
]
PAGE_2 = [
    "2. Visitors",
    "Visitors are welcome on working days between nine and five.",
    "Visitors must sign in at the front desk.",
    "Staff should never lend a badge to a visitor.",
    "The front desk keeps the visitor book for one full year.",
]
PAGE_3 = [
    "3. Exits",
    "Every floor has two fire exits, one at each end of the corridor.",
    "Fire exits must never be blocked.",
    "Doors should close behind you.",
    "The exits are checked by the building manager every month.",
]
RULES = {
    "Employees must wear a badge at all times.": (1,),
    "Lost badges should be reported the same day.": (1,),
    "Visitors must sign in at the front desk.": (2,),
    "Staff should never lend a badge to a visitor.": (2,),
}
"""The source text of each rule extracted from `PAGE_1` and `PAGE_2`: its pages."""


def two_page_pdf(tmp_path: Path) -> Path:
    return write_pdf(tmp_path / "handbook.pdf", [PAGE_1, PAGE_2])


HTML = b"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Not in the text</title>
<style>p { color: red; } /* must not appear */</style>
<script>var rule = "You must not see this";</script></head>
<body>
<nav hidden>Hidden menu: you must click</nav>
<h1>Kitchen &amp; canteen rules</h1>
<p>Staff must wash their hands&nbsp;before handling food.
   Aprons should be   worn &mdash; always.</p>
<!-- a comment that must not appear -->
<h2>Storage</h2>
<ul><li>Raw meat must be stored <b>below</b> cooked food.</li>
<li>Labels should show the date.</li></ul>
<table><tr><th>Item</th><th>Limit</th></tr>
<tr><td>Fridge</td><td>5&deg;C</td></tr></table>
<pre>
# not a heading
keep   spacing
</pre>
<p style="display:none">Invisible: you must not read this.</p>
</body></html>
"""
HTML_TEXT = """\
# Kitchen & canteen rules

Staff must wash their hands before handling food. Aprons should be worn \u2014 always.

## Storage

- Raw meat must be stored below cooked food.
- Labels should show the date.

Item\tLimit
Fridge\t5\u00b0C

```
# not a heading
keep   spacing
```"""


def write_docx(path: Path) -> Path:
    document = docx.Document()
    document.add_heading("Workshop safety", 1)
    document.add_paragraph("Goggles must be worn near the lathe.")
    document.add_paragraph("Check the guard first", style="List Bullet")
    document.add_paragraph("Tie back long hair", style="List Bullet")
    document.add_heading("Tools", 2)
    document.add_paragraph("Blunt blades should be replaced\u00a0at once.")
    table = document.add_table(rows=2, cols=2)
    for (row, column), text in {
        (0, 0): "Tool",
        (0, 1): "Rule",
        (1, 0): "Saw",
        (1, 1): "Never leave it running.",
    }.items():
        table.cell(row, column).text = text
    document.add_paragraph("Report every injury.")
    document.save(str(path))
    return path


DOCX_TEXT = """\
# Workshop safety

Goggles must be worn near the lathe.

- Check the guard first
- Tie back long hair

## Tools

Blunt blades should be replaced at once.

Tool\tRule
Saw\tNever leave it running.

Report every injury."""


def test_docx_styles_are_read_once_not_per_paragraph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: python-docx's default-style lookup ran for every paragraph (~0.7 ms
    # each: 13.6 s for 20,000 paragraphs; bench in the closing note).
    lookups = 0
    default = Styles.default

    def counted(self: Styles, style_type: Any) -> Any:
        nonlocal lookups
        lookups += 1
        return default(self, style_type)

    monkeypatch.setattr(Styles, "default", counted)
    path = write_docx(tmp_path / "safety.docx")
    document = docx.Document(str(path))
    for i in range(200):
        document.add_paragraph(f"Rule {i}: wash hands.")
    document.save(str(path))
    lookups = 0
    text = load_document(path).page_content
    assert text.startswith("# Workshop safety\n\nGoggles")
    assert "- Check the guard first" in text  # list styles still read
    assert "## Tools" in text
    assert lookups <= 1


def test_a_docx_too_large_once_unzipped_or_too_long_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_docx(tmp_path / "safety.docx")
    monkeypatch.setattr(documents, "MAX_DOCX_INFLATED", 1024)
    with pytest.raises(DocumentError, match=r"inflates to .* MiB once unzipped"):
        load_document(path)
    monkeypatch.setattr(documents, "MAX_DOCX_INFLATED", 256 << 20)
    monkeypatch.setattr(documents, "MAX_DOCX_PARAGRAPHS", 5)
    with pytest.raises(DocumentError, match="has more than 5 paragraphs") as refused:
        load_document(path)
    assert "safety.docx" in str(refused.value)


# --- PDF ------------------------------------------------------------------------------


def test_a_pdf_is_its_pages_joined_with_their_offsets(tmp_path: Path) -> None:
    path = two_page_pdf(tmp_path)
    doc = load_document(path)
    first, second = "\n".join(PAGE_1), "\n".join(PAGE_2)
    assert doc.page_content == first + PAGE_SEPARATOR + second
    assert doc.metadata == {
        "source": str(path),
        "format": "pdf",
        "markup": "text",
        "pages": 2,
        "page_starts": [0, len(first) + len(PAGE_SEPARATOR)],
    }
    start = doc.metadata["page_starts"][1]
    assert doc.page_content[start:].startswith("2. Visitors")
    # What pypdf reads, page by page, is what the document holds.
    reader = pypdf.PdfReader(path)
    assert [p.extract_text() for p in reader.pages] == [first, second]


def test_pages_without_text_among_pages_with_text_keep_the_numbering(
    tmp_path: Path,
) -> None:
    path = write_pdf(tmp_path / "gaps.pdf", [PAGE_1, [], IMAGE_ONLY, PAGE_3])
    doc = load_document(path)
    assert doc.metadata["pages"] == 4
    text, starts = doc.page_content, doc.metadata["page_starts"]
    exits = text.index("Fire exits must never be blocked.")
    assert pages_of(starts, exits, exits + 33) == (4,)
    badge = text.index("Employees must")
    assert pages_of(starts, badge, badge + 10) == (1,)
    assert text.split(PAGE_SEPARATOR) == ["\n".join(PAGE_1), "", "", "\n".join(PAGE_3)]


@pytest.mark.parametrize(
    ("start", "end", "pages"),
    [
        (0, 5, (1,)),
        (9, 10, (1,)),  # the last character of page 1
        (10, 11, (2,)),  # the first of page 2
        (8, 12, (1, 2)),  # across the page break
        (5, 25, (1, 2, 3)),
        (20, 20, (3,)),  # an empty span is on the page where it is
        (24, 99, (3,)),  # past the end: the last page
    ],
)
def test_pages_of(start: int, end: int, pages: tuple[int, ...]) -> None:
    assert pages_of([0, 10, 20], start, end) == pages


def test_pages_of_a_document_without_pages_is_empty() -> None:
    assert pages_of([], 0, 10) == ()


def test_a_scanned_pdf_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "scanned.pdf", [IMAGE_ONLY, IMAGE_ONLY])
    with pytest.raises(DocumentError) as caught:
        load_document(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: has no text layer (scanned?)")
    assert "2 page(s)" in message
    assert "ocrmypdf" in message
    assert "\n" not in message


def test_an_encrypted_pdf_is_refused_with_what_to_do(tmp_path: Path) -> None:
    writer = pypdf.PdfWriter(clone_from=two_page_pdf(tmp_path))
    writer.encrypt("secret")
    path = tmp_path / "locked.pdf"
    writer.write(path)
    with pytest.raises(DocumentError, match=r"locked\.pdf: is encrypted") as caught:
        load_document(path)
    assert "qpdf --decrypt" in str(caught.value)


@pytest.mark.parametrize("algorithm", ["RC4-128", "AES-256"])
def test_a_pdf_protected_by_an_owner_password_only_loads(
    tmp_path: Path, algorithm: str
) -> None:
    # No password is needed to open it (only to change it): its text is readable.
    writer = pypdf.PdfWriter(clone_from=two_page_pdf(tmp_path))
    writer.encrypt(user_password="", owner_password="owner", algorithm=algorithm)  # noqa: S106
    path = tmp_path / "protected.pdf"
    writer.write(path)
    plain = load_document(tmp_path / "handbook.pdf")
    assert load_document(path).page_content == plain.page_content


def test_an_aes_pdf_without_cryptography_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = pypdf.PdfWriter(clone_from=two_page_pdf(tmp_path))
    writer.encrypt(user_password="", owner_password="owner", algorithm="AES-256")  # noqa: S106
    path = tmp_path / "protected.pdf"
    writer.write(path)
    # What pypdf does when neither cryptography nor pycryptodome is installed.
    monkeypatch.setattr(pypdf._encryption, "aes_cbc_decrypt", fallback.aes_cbc_decrypt)
    with pytest.raises(
        DocumentError, match=r"protected\.pdf: is encrypted with AES"
    ) as e:
        load_document(path)
    assert "pip install 'langchain-tag[documents]'" in str(e.value)
    assert "qpdf --decrypt" in str(e.value)


def test_a_file_that_is_not_a_pdf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.pdf"
    path.write_text("These are notes, saved with the wrong suffix.\n")
    with pytest.raises(DocumentError, match=r"notes\.pdf: cannot be read as a PDF"):
        load_document(path)


# --- HTML -----------------------------------------------------------------------------


def test_html_is_its_visible_text_with_markdown_headings(tmp_path: Path) -> None:
    path = tmp_path / "kitchen.html"
    path.write_bytes(HTML)
    doc = load_document(path)
    assert doc.page_content == HTML_TEXT
    assert doc.metadata == {"source": str(path), "format": "html", "markup": "markdown"}
    # The headings are the sections' structure; the fenced "# ..." line is not.
    sections = document_sections(doc, "kitchen", max_tokens=30)
    assert [s.heading_path for s in sections] == [
        ("Kitchen & canteen rules",),
        ("Kitchen & canteen rules", "Storage"),
        ("Kitchen & canteen rules", "Storage"),
    ]
    assert sections[-1].text.endswith("# not a heading\nkeep   spacing\n```")


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        # Declared in a <meta> tag.
        (
            '<meta charset="windows-1252"><p>Caf\u00e9 \u201cmust\u201d</p>'.encode(
                "cp1252"
            ),
            "Caf\u00e9 \u201cmust\u201d",
        ),
        (
            (
                b'<meta http-equiv="Content-Type" content="text/html; '
                b'charset=iso-8859-1"><p>Na\xefve</p>'
            ),
            "Na\u00efve",
        ),
        # Undeclared: UTF-8 when it decodes, with or without a byte-order mark.
        ("<p>Na\u00efve caf\u00e9</p>".encode(), "Na\u00efve caf\u00e9"),
        (b"\xef\xbb\xbf<p>\xe2\x82\xac 5</p>", "\u20ac 5"),
        # Else windows-1252, as browsers read it; not a guess from the bytes.
        (
            "<p>Le caf\u00e9 doit \u00eatre \u201cchaud\u201d.</p>".encode("cp1252"),
            "Le caf\u00e9 doit \u00eatre \u201cchaud\u201d.",
        ),
        (
            "<p>Caf\u00e9 \u00e0 5 \u20ac</p>".encode("cp1252"),
            "Caf\u00e9 \u00e0 5 \u20ac",
        ),
    ],
)
def test_html_is_decoded_by_its_declared_encoding_else_utf8_else_windows_1252(
    tmp_path: Path, raw: bytes, text: str
) -> None:
    path = tmp_path / "page.htm"
    path.write_bytes(raw)
    assert load_document(path).page_content == text


def test_a_page_left_inside_an_unclosed_head_is_read(tmp_path: Path) -> None:
    path = tmp_path / "sloppy.html"
    path.write_bytes(b"<html><head><title>T</title><p>Staff must wash hands.</p>")
    assert load_document(path).page_content == "Staff must wash hands."


def test_loaded_text_is_normalised_as_a_model_quotes_it(tmp_path: Path) -> None:
    # Ligatures, no-break spaces, soft hyphens, zero-width spaces, CRLF line ends
    # and decomposed accents: a model copying the sentence writes none of them.
    path = tmp_path / "odd.html"
    path.write_bytes(
        "<pre>Sta\ufb00 must\u00a0re\u00adport\u200b o\ufb03ce caf\u0065\u0301"
        "\r\nvisits.\r\n</pre>".encode()
    )
    assert load_document(path).page_content == (
        "```\nStaff must report office caf\u00e9\nvisits.\n```"
    )


# --- DOCX -----------------------------------------------------------------------------


def test_docx_is_its_paragraphs_headings_lists_and_tables(tmp_path: Path) -> None:
    path = write_docx(tmp_path / "workshop.docx")
    doc = load_document(path)
    assert doc.page_content == DOCX_TEXT
    assert doc.metadata == {"source": str(path), "format": "docx", "markup": "markdown"}
    sections = document_sections(doc, "w", max_tokens=20)
    assert sections[-1].heading_path == ("Workshop safety", "Tools")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (
            b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
            + "EncryptedPackage".encode("utf-16-le"),
            "is encrypted",
        ),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 64, "is a Word 97-2003"),
        (b"PK\x03\x04 a broken zip", "cannot be read as a DOCX file"),
    ],
    ids=["encrypted", "legacy-doc", "damaged"],
)
def test_a_docx_that_cannot_be_read_is_refused(
    tmp_path: Path, raw: bytes, problem: str
) -> None:
    path = tmp_path / "policy.docx"
    path.write_bytes(raw)
    with pytest.raises(DocumentError, match=rf"policy\.docx: {problem}"):
        load_document(path)


# --- any file: empty, text, missing libraries -----------------------------------------


def _empty_docx(path: Path) -> None:
    docx.Document().save(str(path))


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("empty.pdf", b"", "the file is empty"),
        ("blank.pdf", pdf_bytes([[], []]), "has no text layer (scanned?)"),
        ("empty.html", b"", "the file is empty"),
        ("script.html", b"<script>must()</script><p> </p>", "has no visible text"),
        ("empty.docx", None, "has no text"),
        ("empty.txt", b" \n\n", "the file is empty"),
    ],
)
def test_a_document_without_text_is_refused(
    tmp_path: Path, name: str, content: bytes | None, problem: str
) -> None:
    path = tmp_path / name
    if content is None:
        _empty_docx(path)
    else:
        path.write_bytes(content)
    with pytest.raises(DocumentError, match=f"^{re.escape(f'{path}: {problem}')}"):
        load_document(path)


def test_text_files_are_read_as_they_are(tmp_path: Path) -> None:
    # Not normalised: a text file's offsets stay the file's own.
    path = tmp_path / "guide.md"
    path.write_bytes("# Guide\r\n\r\nNames\u00a0must be short.\r\n".encode())
    doc = load_document(path)
    assert doc.page_content == "# Guide\r\n\r\nNames\u00a0must be short.\r\n"
    assert doc.metadata == {"source": str(path)}
    # Sectioned by its suffix's markup, as before.
    assert [s.heading_path for s in document_sections(doc, "guide")] == [("Guide",)]


@pytest.mark.parametrize("name", ["handbook.txt", "handbook"])
@pytest.mark.parametrize(
    ("kind", "suffix"), [("a PDF", ".pdf"), ("a DOCX file", ".docx")]
)
def test_a_pdf_or_docx_under_another_name_is_refused(
    tmp_path: Path, name: str, kind: str, suffix: str
) -> None:
    path = tmp_path / name
    if suffix == ".pdf":
        write_pdf(path, [PAGE_1])
    else:
        write_docx(path)
    with pytest.raises(DocumentError) as caught:
        load_document(path)
    assert str(caught.value) == (
        f"{path}: looks like {kind}, but its name does not end in {suffix}, so it "
        f"would be read as text. Name it {suffix} (or pass it as a {suffix} path)."
    )
    # Named as what it is, it loads.
    assert load_document(path.rename(path.with_suffix(suffix))).page_content


def test_a_binary_file_with_another_suffix_says_which_suffixes_are_loaded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "handbook.odt"
    path.write_bytes(b"PK\x03\x04\x00\x00binary")
    with pytest.raises(DocumentError, match=r"handbook\.odt: contains NUL bytes") as e:
        load_document(path)
    assert ".docx, .htm, .html, .pdf, .xhtml are loaded by format" in str(e.value)


@pytest.mark.parametrize(
    ("suffix", "module"), [(".pdf", "pypdf"), (".html", "bs4"), (".docx", "docx")]
)
def test_a_missing_library_names_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str, module: str
) -> None:
    real_import = builtins.__import__

    def without(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.partition(".")[0] == module:
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(builtins, "__import__", without)
    path = tmp_path / f"file{suffix}"
    path.write_bytes(b"some bytes")
    with pytest.raises(DocumentError) as caught:
        load_document(path)
    assert str(caught.value).startswith(f"{path}: reading ")
    assert "pip install 'langchain-tag[documents]'" in str(caught.value)


def test_load_documents_and_to_documents(tmp_path: Path) -> None:
    pdf, html = two_page_pdf(tmp_path), tmp_path / "kitchen.html"
    html.write_bytes(HTML)
    loaded = load_documents([pdf, str(html)])
    assert [d.metadata["format"] for d in loaded] == ["pdf", "html"]
    given = Document(page_content="Staff must wait.", metadata={"source": "x"})
    assert to_documents([given, "Text must stay text.", html]) == [
        given,
        Document(page_content="Text must stay text."),
        loaded[1],
    ]


def test_a_str_naming_a_file_is_refused_before_any_model_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    two_page_pdf(tmp_path)
    fake = ExtractionFakeChatModel()
    expected = (
        "'handbook.pdf': names a file, but a str is the text of a document. "
        "Pass Path('handbook.pdf') to load the file."
    )
    with pytest.raises(DocumentError, match=f"^{re.escape(expected)}$"):
        extract_rules(["handbook.pdf"], llm=fake, checkpoint=None)
    assert fake.calls == 0
    # Text that only looks like a file name, or has more than one line, is text.
    texts = ["missing.pdf", "handbook.pdf\nmust be read."]
    assert [d.page_content for d in to_documents(texts)] == texts


# --- extraction from loaded files -----------------------------------------------------


def check_verbatim(rulebook: Rulebook, documents: Sequence[Document]) -> None:
    """Every rule's source text is the loaded text at the rule's offsets."""
    texts = {
        d.document_id: doc.page_content
        for d, doc in zip(rulebook.documents, documents, strict=True)
    }
    assert rulebook.rules
    for rule in rulebook.rules:
        assert rule.source is not None
        text = texts[rule.source.document_id]
        assert text[rule.source.start : rule.source.end] == rule.source_text


def test_rules_from_pdf_html_and_docx_quote_the_loaded_text(tmp_path: Path) -> None:
    html = tmp_path / "kitchen.html"
    html.write_bytes(HTML)
    paths = [two_page_pdf(tmp_path), html, write_docx(tmp_path / "workshop.docx")]
    fake = ExtractionFakeChatModel()
    rulebook = extract_rules(paths, llm=fake, checkpoint=None)
    check_verbatim(rulebook, load_documents(paths))
    assert {r.source.document_id for r in rulebook.rules if r.source} == {
        "handbook",
        "kitchen",
        "workshop",
    }
    # What the model was sent is the loaded text: no script, no markup.
    sent = "\n".join(fake.prompts)
    assert "You must not see this" not in sent
    assert "Invisible" not in sent
    assert "Raw meat must be stored below cooked food." in sent


def test_pdf_rules_carry_their_pages(tmp_path: Path) -> None:
    path = two_page_pdf(tmp_path)
    rulebook = extract_rules([path], llm=ExtractionFakeChatModel(), checkpoint=None)
    check_verbatim(rulebook, [load_document(path)])
    assert {rule.source_text: rule.lineage.pages for rule in rulebook.rules} == RULES
    # Documents of other formats have no pages.
    html = tmp_path / "kitchen.html"
    html.write_bytes(HTML)
    rulebook = extract_rules([html], llm=ExtractionFakeChatModel(), checkpoint=None)
    assert all(rule.lineage.pages == () for rule in rulebook.rules)


def test_a_page_loaded_by_pypdfloader_carries_its_page(tmp_path: Path) -> None:
    # LangChain's PyPDFLoader: a Document per page, `metadata["page"]` 0-based.
    page = Document(
        page_content="\n".join(PAGE_2), metadata={"page": 2, "source": "x.pdf"}
    )
    assert page_starts_of(page) == [0, 0, 0]
    rulebook = extract_rules([page], llm=ExtractionFakeChatModel(), checkpoint=None)
    assert rulebook.rules
    assert all(rule.lineage.pages == (3,) for rule in rulebook.rules)


@pytest.mark.parametrize(
    ("metadata", "starts"),
    [
        ({"page_starts": [0, 40]}, [0, 40]),
        ({"page": 0}, [0]),
        ({"page": True}, None),
        ({"page": "2"}, None),
        ({"page": -1}, None),
        ({}, None),
    ],
)
def test_page_starts_of(metadata: dict[str, Any], starts: list[int] | None) -> None:
    assert page_starts_of(Document(page_content="x", metadata=metadata)) == starts


def test_async_extraction_and_the_retriever_take_paths(tmp_path: Path) -> None:
    path = two_page_pdf(tmp_path)
    rulebook = asyncio.run(
        aextract_rules([path], llm=ExtractionFakeChatModel(), checkpoint=None)
    )
    assert {rule.source_text: rule.lineage.pages for rule in rulebook.rules} == RULES

    fake, saved = ExtractionFakeChatModel(), tmp_path / "handbook.rulebook.json"
    for _ in range(2):  # then loaded: the file records the same PDF
        retriever = TAGRetriever.from_documents(
            [path], llm=fake, rulebook_path=saved, extraction={"checkpoint": None}
        )
        assert len(retriever.rulebook) == len(RULES)
    assert fake.calls == full_calls(path)


def full_calls(path: Path) -> int:
    fake = ExtractionFakeChatModel()
    extract_rules([path], llm=fake, checkpoint=None)
    return fake.calls


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("scanned.pdf", pdf_bytes([IMAGE_ONLY]), "has no text layer"),
        ("notes.pdf", b"not a PDF at all", "cannot be read as a PDF"),
        ("empty.html", b"", "the file is empty"),
    ],
)
def test_bad_files_are_refused_before_any_model_call(
    tmp_path: Path, name: str, content: bytes, problem: str
) -> None:
    good = two_page_pdf(tmp_path)
    bad = tmp_path / name
    bad.write_bytes(content)
    fake = ExtractionFakeChatModel()
    expected = f"^{re.escape(f'{bad}: {problem}')}"
    with pytest.raises(DocumentError, match=expected):
        extract_rules([good, bad], llm=fake, checkpoint=None)
    with pytest.raises(DocumentError, match=expected):
        TAGRetriever.from_documents([good, bad], llm=fake)
    assert fake.calls == 0


# --- tag extract ----------------------------------------------------------------------


def test_tag_extract_reads_a_pdf(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    path = two_page_pdf(tmp_path)
    model = ExtractionFakeChatModel()
    monkeypatch.setattr("langchain_tag.models.default_chat_model", lambda **_: model)
    argv = ["extract", path.name, "-o", "out.json", "--no-checkpoint", "-q"]
    assert cli.main(argv) == 0
    assert "wrote 4 rules to out.json" in capsys.readouterr().out
    rulebook = Rulebook.load("out.json")
    check_verbatim(rulebook, [load_document(path.name)])
    assert {rule.source_text: rule.lineage.pages for rule in rulebook.rules} == RULES
    assert [d.source for d in rulebook.documents] == ["handbook.pdf"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (pdf_bytes([IMAGE_ONLY]), "has no text layer (scanned?)"),
        (b"%PDF-1.4\n1 0 obj\n<< /Type", "cannot be read as a PDF"),
    ],
    ids=["scanned", "damaged"],
)
def test_tag_extract_refuses_a_bad_pdf_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    content: bytes,
    problem: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    # The command quiets pypdf's logger for the process: not beyond this test.
    monkeypatch.setattr(logging.getLogger("pypdf"), "level", logging.NOTSET)
    two_page_pdf(tmp_path)
    Path("bad.pdf").write_bytes(content)
    made: list[ExtractionFakeChatModel] = []

    def make(**_: Any) -> ExtractionFakeChatModel:
        made.append(ExtractionFakeChatModel())
        return made[-1]

    monkeypatch.setattr("langchain_tag.models.default_chat_model", make)
    argv = ["extract", "handbook.pdf", "bad.pdf", "-o", "out.json", "-q"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tag extract: error: bad.pdf: {problem}")
    assert err.count("\n") == 1  # one line: no traceback
    # pypdf's warnings about the damage would be printed too (logging's last resort).
    assert not [r for r in caplog.records if r.name.startswith("pypdf")]
    assert made == []  # refused before a model was made
    assert not Path("out.json").exists()


# --- re-extraction after an edit ------------------------------------------------------

PHASE_MARKERS = {
    "spans": prompts.SPAN_DETECTION_SYSTEM.split("{domain}")[0],
    "atomics": prompts.DECOMPOSITION_SYSTEM.split("{domain}")[0],
    "rules": prompts.OPERATIONALISATION_SYSTEM.split("{domain}")[0],
    "relations": prompts.RELATIONS_SYSTEM.split("{domain}")[0],
}


def sent_by_phase(fake: ExtractionFakeChatModel) -> dict[str, list[str]]:
    sent: dict[str, list[str]] = {phase: [] for phase in PHASE_MARKERS}
    for prompt in fake.prompts:
        phase = next(p for p, marker in PHASE_MARKERS.items() if marker in prompt)
        sent[phase].append(prompt)
    return sent


@pytest.mark.parametrize("edited_page", [1, 2])
def test_an_edited_page_sends_only_its_sections_again(
    tmp_path: Path, edited_page: int
) -> None:
    db = tmp_path / "run.sqlite"
    pages = [PAGE_1, PAGE_2, PAGE_3]
    path = write_pdf(tmp_path / "handbook.pdf", pages)
    first = ExtractionFakeChatModel()
    before = extract_rules([path], llm=first, checkpoint=db)
    assert len(sent_by_phase(first)["spans"]) == 3  # a section per page

    # The page gets longer: every offset after the edit moves.
    edited = [list(page) for page in pages]
    edited[edited_page - 1][1] = "All employees, temporary staff included, must too."
    write_pdf(path, edited)
    second = ExtractionFakeChatModel()
    after = extract_rules([path], llm=second, checkpoint=db)

    sent = sent_by_phase(second)
    new_line = edited[edited_page - 1][1]
    assert len(sent["spans"]) == 1
    for phase in ("spans", "atomics", "rules"):
        assert sent[phase], phase
        for prompt in sent[phase]:  # only the edited page's text
            assert new_line in prompt or "must too" in prompt
            others = [p for n, p in enumerate(edited, 1) if n != edited_page]
            assert not any(line in prompt for page in others for line in page[1:])
    # Rules of other pages are unchanged, offsets moved with the text.
    check_verbatim(after, [load_document(path)])
    unchanged = {r.rule_id for r in before.rules} & {r.rule_id for r in after.rules}
    assert len(unchanged) == len(after.rules) - 1


def test_an_edited_page_moves_no_section_of_another_page(tmp_path: Path) -> None:
    # Without headings a PDF is one section, cut to the budget. Packed across pages,
    # page 2 growing would move every later cut: all ten pages sent again.
    pages = [
        [
            f"Item {n}.{i} must be checked by the staff on duty every week."
            for i in range(15)
        ]
        for n in range(1, 11)
    ]
    edited = [list(page) for page in pages]
    edited[1] += [f"Visitor {i} must be escorted at all times." for i in range(20)]
    path = write_pdf(tmp_path / "checks.pdf", pages)
    before = load_document(path)
    db = tmp_path / "run.sqlite"
    extract_rules([path], llm=ExtractionFakeChatModel(), checkpoint=db, skip_phases=[4])
    write_pdf(path, edited)
    after = load_document(path)

    def changed(sections: Sequence[Sequence[Section]]) -> int:
        old, new = ({s.content_hash for s in each} for each in sections)
        return len(new - old)

    packed = [
        split_sections(d.page_content, "checks", fmt="text") for d in (before, after)
    ]
    assert changed(packed) == len(packed[1]) > 1
    paged = [document_sections(d, "checks") for d in (before, after)]
    assert (len(paged[1]), changed(paged)) == (10, 1)

    fake = ExtractionFakeChatModel()
    extract_rules([path], llm=fake, checkpoint=db, skip_phases=[4])
    spans = sent_by_phase(fake)["spans"]
    assert len(spans) == 1
    assert "Visitor 19 must" in spans[0]
    assert "Item 1.0 " not in spans[0]
    assert "Item 3.0 " not in spans[0]


class JoiningFakeChatModel(ExtractionFakeChatModel):
    """Quotes as models do: the line breaks of a wrapped sentence become spaces."""

    def _rules(self, prompt: str, user: str) -> dict[str, Any]:
        answer = super()._rules(prompt, user)
        for rule in answer["rules"]:
            rule["source_text"] = " ".join(rule["source_text"].split())
        return answer


def test_a_quote_of_a_wrapped_sentence_is_the_loaded_text(tmp_path: Path) -> None:
    # A PDF's lines end where the page's lines end, inside sentences.
    wrapped = [
        "1. Badges",
        "Badges are issued by the front office on the first day of work.",
        "Employees must wear a badge at all times,",
        "also on site visits and at events.",
    ]
    path = write_pdf(tmp_path / "wrapped.pdf", [wrapped])
    rulebook = extract_rules([path], llm=JoiningFakeChatModel(), checkpoint=None)
    check_verbatim(rulebook, [load_document(path)])
    assert [rule.source_text for rule in rulebook.rules] == ["\n".join(wrapped[2:])]
