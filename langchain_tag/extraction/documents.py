"""Documents in: PDF, HTML, DOCX and text files as LangChain `Document`s.

A loaded document's `page_content` is what the extracting model reads and what every
rule's `source` offsets point into, so it is made once, here, and never changed
after: each rule's `source_text` is then a substring of it at its offsets.

- PDF (pypdf): each page's text layer, pages joined by `PAGE_SEPARATOR` (a blank
  line). `metadata["page_starts"]` holds the offset where each page starts;
  `pages_of` turns a span into the pages it is on, and `document_sections` never
  packs a section cut to the budget across a page start, so an edited page changes
  no other page's sections (nor their stored answers). A PDF without any text
  layer (scanned), or that opens only with a password, is refused.
- HTML (Beautiful Soup) and DOCX (python-docx): the visible text, one block a
  paragraph, headings written as Markdown ATX headings (`## Title`) so that
  sectioning follows them, list items and table rows one a line (cells separated
  by tabs), HTML `<pre>` blocks fenced. `metadata["markup"]` is "markdown".
- Any other file: UTF-8 text read as it is, as before (`read_text`), so a text
  file's offsets are the file's own; its markup is detected when it is sectioned.
  A PDF or DOCX file by its content (magic bytes) but not by its name is refused.
- A `Document` loaded elsewhere is taken as it is. One of LangChain's
  `PyPDFLoader` (a page, `metadata["page"]` 0-based) has its page number in its
  rules' lineage too (`page_starts_of`).

The text of PDF, HTML and DOCX files is normalised: Unicode NFC, Latin ligatures
(U+FB00-FB06) spelled out, no-break and other fixed-width spaces made spaces, soft
hyphens, zero-width spaces and byte-order marks removed, any line break made a
newline, trailing spaces and runs of blank lines dropped. A model copying a sentence
writes those characters the plain way; the text it copies from has them that way too.

The libraries are used directly, not LangChain's community loaders: the
`langchain-community` package is being sunset (importing it warns), and its loaders
keep neither page offsets nor headings, include script text (BSHTMLLoader) and leave
encrypted or scanned files to fail later or not at all.
"""

from __future__ import annotations

import io
import os
import re
import unicodedata
import zipfile
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from langchain_core.documents import Document

from langchain_tag._text import decode_text
from langchain_tag.errors import (
    DocumentError,
    TextEncodingError,
    describe_error,
)
from langchain_tag.extraction.sectioning import (
    DocumentFormat,
    Section,
    detect_format,
    split_sections,
)

if TYPE_CHECKING:
    from bs4.element import NavigableString, Tag
    from docx.table import Table
    from docx.text.paragraph import Paragraph

__all__ = [
    "DocumentLike",
    "load_document",
    "to_documents",
]

FileFormat = Literal["pdf", "html", "docx"]

DocumentLike = Document | str | os.PathLike[str]
"""A document as extraction takes it: a `Document`, its text, or its file's path."""

SUPPORTED_SUFFIXES: Mapping[str, FileFormat] = {
    ".pdf": "pdf",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".docx": "docx",
}
"""File suffixes with a loader of their own (`metadata["format"]`); any other file is
read as UTF-8 text."""

PAGE_SEPARATOR = "\n\n"
"""What joins a PDF's pages: a paragraph break, as a page break is in the text."""

_INSTALL = "pip install 'langchain-tag[documents]'"


# --- the public functions -------------------------------------------------------------


def load_document(path: str | os.PathLike[str]) -> Document:
    """Load one file as a `Document` for extraction, by its suffix.

    PDF, HTML and DOCX files are read by their loaders (see the module docstring);
    any other file as UTF-8 text, as it is. `metadata["source"]` is the path as
    given; PDF, HTML and DOCX documents also have `metadata["format"]`, and PDFs
    `metadata["pages"]` and `metadata["page_starts"]`.

    Args:
        path: The file.

    Returns:
        The document, with text to extract rules from.

    Raises:
        DocumentError: The file has no text, or cannot be read as its format says
            (encrypted, damaged, a scanned PDF, not UTF-8 text, a missing
            library); the message names the file and says what to do.
        OSError: The file cannot be read (missing, a directory, no permission).
    """
    what = os.fspath(path)
    file_format = SUPPORTED_SUFFIXES.get(Path(what).suffix.lower())
    if file_format is None:
        return _text_document(what)
    raw = Path(what).read_bytes()
    if not raw.strip():
        raise DocumentError(what, "the file is empty.", _NOTHING_TO_EXTRACT)
    return _LOADERS[file_format](what, raw)


def load_documents(paths: Iterable[str | os.PathLike[str]]) -> list[Document]:
    """`load_document` for each path, in order; the first bad file raises."""
    return [load_document(path) for path in paths]


def to_documents(items: Iterable[DocumentLike]) -> list[Document]:
    """Documents as extraction takes them, each loaded once.

    A `Document` is kept as it is, a str is the text of a document, and a path
    (`pathlib.Path`, any `os.PathLike`) is loaded by `load_document`.

    Raises:
        DocumentError: A path's file cannot be loaded (see `load_document`), or a
            str of one line names an existing file: extracting rules from a file
            name would pay every phase for nothing, so it is refused.
        OSError: A path's file cannot be read.
    """
    documents = []
    for item in items:
        if isinstance(item, Document):
            documents.append(item)
        elif isinstance(item, os.PathLike):
            documents.append(load_document(item))
        else:
            _refuse_a_file_name(item)
            documents.append(Document(page_content=item))
    return documents


def _refuse_a_file_name(text: str) -> None:
    """Raise if `text`, one line, is the path of an existing file."""
    if "\n" in text or not text.strip():
        return
    try:
        is_file = Path(text).is_file()
    except (OSError, ValueError):  # too long for a path, or a NUL in it
        return
    if is_file:
        raise DocumentError(
            repr(text),
            "names a file, but a str is the text of a document.",
            f"Pass Path({text!r}) to load the file.",
        )


def document_sections(
    document: Document, document_id: str, *, max_tokens: int = 1500
) -> list[Section]:
    """A document's sections as extraction sends them (`split_sections`).

    The markup is the one its loader recorded (`metadata["markup"]`: "markdown" for
    HTML and DOCX, whose headings it writes as Markdown; "text" for PDFs), else it
    is detected from the document's source and content (`detect_format`). A PDF's
    page starts are `breaks`: an edited page changes no other page's sections.

    Args:
        document: The document.
        document_id: Its id, the prefix of its section ids.
        max_tokens: The budget of a section.
    """
    markup = document.metadata.get("markup")
    if markup not in get_args(DocumentFormat):
        markup = detect_format(document.page_content, document.metadata.get("source"))
    return split_sections(
        document.page_content,
        document_id,
        fmt=markup,
        max_tokens=max_tokens,
        breaks=page_starts_of(document) or (),
    )


def page_starts_of(document: Document) -> list[int] | None:
    """Where each page of the document starts in its text, as `pages_of` takes it.

    A loaded PDF has them in `metadata["page_starts"]`. A page loaded by LangChain's
    `PyPDFLoader` (`metadata["page"]`, 0-based) is page `page + 1` of its file, all
    of it: pages before it start, empty, at 0, so `pages_of` gives `(page + 1,)`.

    Args:
        document: The document.

    Returns:
        The page starts (the first is 0), or None for a document without pages.
    """
    starts = document.metadata.get("page_starts")
    if starts:
        return list(starts)
    page = document.metadata.get("page")
    if isinstance(page, int) and not isinstance(page, bool) and page >= 0:
        return [0] * (page + 1)
    return None


def pages_of(page_starts: Sequence[int], start: int, end: int) -> tuple[int, ...]:
    """The pages (1-based) the text `start:end` of a paged document is on.

    Args:
        page_starts: Where each page starts in the text, in order (the first is 0),
            as `metadata["page_starts"]` of a loaded PDF holds them. The separator
            after a page counts as that page's.
        start: Start offset of the span.
        end: Its exclusive end; an empty span is on the page of `start`.

    Returns:
        Consecutive page numbers, e.g. `(2,)` or `(2, 3)`; `()` without pages.
    """
    if not page_starts:
        return ()
    first = max(bisect_right(page_starts, start), 1)
    last = max(bisect_right(page_starts, max(start, end - 1)), first)
    return tuple(range(first, last + 1))


# --- normalising the text of PDF, HTML and DOCX files ------------------------------

_NOTHING_TO_EXTRACT = "There is no text to extract rules from."

_CHARACTERS = str.maketrans(
    {
        # Ligatures as fonts set them; PDF text layers often keep them.
        "\ufb00": "ff",
        "\ufb01": "fi",
        "\ufb02": "fl",
        "\ufb03": "ffi",
        "\ufb04": "ffl",
        "\ufb05": "st",
        "\ufb06": "st",
        # Fixed-width and no-break spaces (U+3000, the ideographic space, is kept).
        **dict.fromkeys(
            ["\u00a0", "\u1680", "\u202f", "\u205f"]
            + [chr(c) for c in range(0x2000, 0x200B)],
            " ",
        ),
        # Invisible: a soft hyphen, zero-width spaces, a byte-order mark.
        **dict.fromkeys(["\u00ad", "\u200b", "\u2060", "\ufeff"], None),
        **dict.fromkeys(["\r", "\v", "\f", "\x85", "\u2028", "\u2029"], "\n"),
    }
)
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)
_BLANK_LINES = re.compile(r"\n{3,}")


def _normalised(text: str) -> str:
    """The text as the model will read and quote it (see the module docstring)."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n"))
    text = _CONTROLS.sub("", text.translate(_CHARACTERS))
    return _BLANK_LINES.sub("\n\n", _TRAILING_SPACE.sub("", text)).strip("\n")


def _missing(what: str, package: str, kind: str) -> DocumentError:
    """The error for a missing optional library: it names the extra to install."""
    return DocumentError(
        what,
        f"reading {kind} files needs {package}, which is not installed.",
        f"Install the documents extra: `{_INSTALL}`.",
    )


def _document(
    what: str, text: str, file_format: FileFormat, **metadata: Any
) -> Document:
    """The loaded document, or an error when no text is left."""
    if not text.strip():
        raise DocumentError(what, "has no text.", _NOTHING_TO_EXTRACT)
    markup = "text" if file_format == "pdf" else "markdown"
    return Document(
        page_content=text,
        metadata={"source": what, "format": file_format, "markup": markup, **metadata},
    )


_PDF_MAGIC = b"%PDF-"
_ZIP_MAGIC = b"PK\x03\x04"


def _text_document(what: str) -> Document:
    raw = Path(what).read_bytes()
    # A PDF or DOCX file misnamed: read as text it is either refused with the
    # wrong advice (not UTF-8) or, a PDF's syntax being ASCII, extracted from.
    kind = (
        "a PDF"
        if raw.startswith(_PDF_MAGIC)
        else "a DOCX file"
        if raw.startswith(_ZIP_MAGIC) and b"word/" in raw
        else None
    )
    if kind is not None:
        suffix = ".pdf" if kind == "a PDF" else ".docx"
        raise DocumentError(
            what,
            f"looks like {kind}, but its name does not end in {suffix}, so it would "
            "be read as text.",
            f"Name it {suffix} (or pass it as a {suffix} path).",
        )
    try:
        text = decode_text(raw, what=what)
    except TextEncodingError as error:
        fix = error.fix
        if "NUL bytes" in error.problem:
            formats = ", ".join(sorted(SUPPORTED_SUFFIXES))
            fix += f" Files ending in {formats} are loaded by format."
        raise DocumentError(what, error.problem, fix) from None
    if not text.strip():
        raise DocumentError(what, "the file is empty.", _NOTHING_TO_EXTRACT)
    return Document(page_content=text, metadata={"source": what})


# --- PDF ------------------------------------------------------------------------------


def _load_pdf(what: str, raw: bytes) -> Document:
    try:
        import pypdf  # noqa: PLC0415 - the documents extra
    except ImportError:
        raise _missing(what, "pypdf", "PDF") from None
    qpdf = "e.g. `qpdf --decrypt --password=... in.pdf out.pdf`"
    try:
        reader = pypdf.PdfReader(io.BytesIO(raw))
        # pypdf has tried the empty password, which owner-only protection uses.
        locked = reader.is_encrypted and (
            reader.decrypt("") == pypdf.PasswordType.NOT_DECRYPTED
        )
        pages = [] if locked else [_normalised(p.extract_text()) for p in reader.pages]
    except pypdf.errors.DependencyError as error:
        # AES needs `cryptography`, which the extra installs (`pypdf[crypto]`).
        raise DocumentError(
            what,
            f"is encrypted with AES, which pypdf cannot decrypt here ({error}).",
            f"Install the documents extra (`{_INSTALL}`), or decrypt it first "
            f"({qpdf}).",
        ) from None
    except Exception as error:  # noqa: BLE001 - pypdf fails on damaged files in many ways
        raise DocumentError(
            what,
            f"cannot be read as a PDF ({describe_error(error)}).",
            "Check that it is a PDF and not damaged: open it in a PDF viewer, or "
            "repair it (e.g. `qpdf in.pdf repaired.pdf`).",
        ) from None
    if locked:
        raise DocumentError(
            what,
            "is encrypted: it opens only with a password.",
            f"Decrypt it first ({qpdf}).",
        )
    if not pages:
        raise DocumentError(what, "has no pages.", _NOTHING_TO_EXTRACT)
    if not any(pages):
        raise DocumentError(
            what,
            f"has no text layer (scanned?): none of its {len(pages)} page(s) holds "
            "text.",
            f"Run OCR on it first (e.g. `ocrmypdf {what} ocr.pdf`), then pass the "
            "result.",
        )
    starts, offset = [], 0
    for page in pages:
        starts.append(offset)
        offset += len(page) + len(PAGE_SEPARATOR)
    return _document(
        what,
        PAGE_SEPARATOR.join(pages),
        "pdf",
        pages=len(pages),
        page_starts=starts,
    )


# --- blocks of text, as HTML and DOCX files are rendered ---------------------------


@dataclass(frozen=True)
class _Block:
    """A paragraph, heading, list item or table row of the rendered text."""

    text: str
    group: int | None = None
    """Blocks of one list or one table share a group and are one line each."""


def _joined(blocks: Iterable[_Block]) -> str:
    """The blocks, a blank line between them, a newline within a list or a table."""
    out: list[str] = []
    previous: _Block | None = None
    for block in blocks:
        if previous is not None:
            same = block.group is not None and block.group == previous.group
            out.append("\n" if same else "\n\n")
        out.append(block.text)
        previous = block
    return "".join(out)


def _heading(level: int, title: str) -> str:
    """A Markdown ATX heading, the level kept to Markdown's six."""
    return "#" * min(max(level, 1), 6) + " " + title


# --- HTML -----------------------------------------------------------------------------

# HTML collapses these; a no-break space next to them is one space in text too.
_HTML_SPACE = re.compile(r"[ \t\n\r\f\u00a0]+")
# Not <head> itself but what it holds: html.parser leaves a page's body inside an
# unclosed <head>.
_HIDDEN = frozenset(
    "title meta link base script style noscript template svg canvas iframe object "  # noqa: SIM905
    "embed audio video select datalist".split()
)
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_BLOCK_TAGS = frozenset(
    "address article aside blockquote body caption center dd details dialog div dl "  # noqa: SIM905
    "dt fieldset figcaption figure footer form header hgroup hr html legend main menu "
    "nav p search section summary".split()
)
_BREAKING = (
    _BLOCK_TAGS
    | set(_HEADINGS)
    | set(
        "br caption li ol pre table tbody td tfoot th thead tr ul".split()  # noqa: SIM905
    )
)
"""Elements that end a line of text where they start and end: not inline."""
_DISPLAY_NONE = re.compile(r"display\s*:\s*none", re.IGNORECASE)
_BR = object()
"""A line break in the inline text being gathered."""


def _load_html(what: str, raw: bytes) -> Document:
    try:
        import bs4  # noqa: PLC0415 - the documents extra
    except ImportError:
        raise _missing(what, "beautifulsoup4", "HTML") from None
    soup = bs4.BeautifulSoup(raw, "html.parser", from_encoding=_html_encoding(raw))
    renderer = _HTMLText(bs4.element.Tag, bs4.element.NavigableString)
    text = _normalised(_joined(renderer.render(soup)))
    if not text.strip():
        raise DocumentError(what, "has no visible text.", _NOTHING_TO_EXTRACT)
    return _document(what, text, "html")


def _html_encoding(raw: bytes) -> str | None:
    """The encoding of an HTML file that declares none: UTF-8, else windows-1252.

    None when it declares one (a byte-order mark, `<meta charset>`): Beautiful Soup
    decodes by it. Otherwise Beautiful Soup would guess from the bytes, which goes
    wrong on short texts (cp1252 "être" read as "ętre"); valid UTF-8 is UTF-8, and
    other bytes are windows-1252, the default the HTML standard gives pages that
    declare no encoding.
    """
    from bs4.dammit import EncodingDetector  # noqa: PLC0415 - the documents extra

    if (
        EncodingDetector.strip_byte_order_mark(raw)[1] is not None
        or EncodingDetector.find_declared_encoding(raw, is_html=True) is not None
    ):
        return None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "windows-1252"
    return "utf-8"


class _HTMLText:
    """The visible text of an HTML tree as blocks, headings written as Markdown."""

    def __init__(self, tag: type[Tag], string: type[NavigableString]) -> None:
        self.tag = tag
        self.string = string
        self.blocks: list[_Block] = []
        self.inline: list[object] = []
        self.groups = 0

    def render(self, root: Tag) -> list[_Block]:
        self._children(root)
        self._flush()
        return self.blocks

    def _flush(self, prefix: str = "", group: int | None = None) -> None:
        """The inline text gathered so far as a block (none if it is blank)."""
        lines: list[str] = []
        current: list[str] = []
        for piece in [*self.inline, _BR]:
            if piece is _BR:
                line = _HTML_SPACE.sub(" ", "".join(current)).strip()
                if line:
                    lines.append(line)
                current = []
            else:
                current.append(str(piece))
        self.inline = []
        if lines:
            self.blocks.append(_Block(prefix + "\n".join(lines), group))

    def _hidden(self, tag: Tag) -> bool:
        return (
            tag.name in _HIDDEN
            or tag.has_attr("hidden")
            or bool(_DISPLAY_NONE.search(str(tag.get("style") or "")))
        )

    def _text(self, tag: Tag) -> str:
        """The visible text inside `tag` as one line; blocks in it become spaces."""
        return _HTML_SPACE.sub(" ", "".join(self._pieces(tag))).strip()

    def _pieces(self, tag: Tag) -> Iterator[str]:
        for child in tag.children:
            if isinstance(child, self.tag):
                yield from self._inline_text(child)
            elif type(child) is self.string:  # not a comment, a doctype, CDATA
                yield str(child)

    def _inline_text(self, tag: Tag) -> Iterator[str]:
        """A child's visible text, set apart by spaces if it is a block."""
        if self._hidden(tag):
            return
        space = " " if tag.name in _BREAKING else ""
        yield space
        yield from self._pieces(tag)
        yield space

    def _children(self, tag: Tag) -> None:
        for child in tag.children:
            if isinstance(child, self.tag):
                self._element(child)
            elif type(child) is self.string:
                self.inline.append(str(child))

    def _element(self, tag: Tag) -> None:
        name = tag.name
        if self._hidden(tag):
            return
        if name == "br":
            self.inline.append(_BR)
        elif name in _HEADINGS:
            self._flush()
            if title := self._text(tag):
                self.blocks.append(_Block(_heading(_HEADINGS[name], title)))
        elif name in {"ul", "ol"}:
            self._flush()
            self.groups += 1
            self._list(tag, depth=0, group=self.groups)
        elif name == "table":
            self._flush()
            self._table(tag)
        elif name == "pre":
            self._flush()
            self._pre(tag)
        elif name in _BLOCK_TAGS or name == "li":
            self._flush()
            self._children(tag)
            self._flush()
        else:
            self._children(tag)

    def _list(self, tag: Tag, depth: int, group: int) -> None:
        start = str(tag.get("start") or "1")
        number = int(start) if start.isdigit() else 1
        for item in tag.find_all("li", recursive=False):
            if self._hidden(item):
                continue
            marker = f"{number}. " if tag.name == "ol" else "- "
            number += 1
            prefix = "  " * depth + marker
            for child in item.children:
                if not isinstance(child, self.tag):
                    if type(child) is self.string:
                        self.inline.append(str(child))
                elif child.name in {"ul", "ol"}:
                    self._flush(prefix, group)
                    # Text after a sub-list continues the item, under its text.
                    prefix = "  " * depth + " " * len(marker)
                    self._list(child, depth + 1, group)
                else:
                    self.inline += self._inline_text(child)
            self._flush(prefix, group)

    def _table(self, table: Tag) -> None:
        self.groups += 1
        caption = table.find("caption")
        if isinstance(caption, self.tag) and (text := self._text(caption)):
            self.blocks.append(_Block(text))
        for row in table.find_all("tr"):
            if row.find_parent("table") is not table or self._hidden(row):
                continue  # a row of a nested table: in its cell's text
            cells = [
                self._text(cell)
                for cell in row.find_all(["td", "th"], recursive=False)
                if not self._hidden(cell)
            ]
            if any(cells):
                self.blocks.append(_Block("\t".join(cells), self.groups))

    def _pre(self, tag: Tag) -> None:
        code = tag.get_text().strip("\n").rstrip()
        if not code.strip():
            return
        # A fence longer than any run of backticks in the code, as Markdown needs.
        runs = [len(run) for run in re.findall(r"`+", code)]
        fence = "`" * max(3, max(runs, default=0) + 1)
        self.blocks.append(_Block(f"{fence}\n{code}\n{fence}"))


# --- DOCX -----------------------------------------------------------------------------

_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_HEADING_STYLE = re.compile(r"heading\s*([1-9])", re.IGNORECASE)

MAX_DOCX_INFLATED = 256 << 20
"""The most a DOCX file may hold once unzipped (256 MiB): a 20,000-paragraph
document is ~5 MiB; a file that inflates beyond this is refused before parsing."""
MAX_DOCX_PARAGRAPHS = 200_000
"""The most paragraphs (and table rows) a DOCX file may have: ~4,000 pages."""


def _load_docx(what: str, raw: bytes) -> Document:
    try:
        import docx  # noqa: PLC0415 - the documents extra
    except ImportError:
        raise _missing(what, "python-docx", "DOCX") from None
    if raw.startswith(_OLE_MAGIC):
        # Word writes a password-protected file as an OLE container, as it writes .doc.
        encrypted = "EncryptedPackage".encode("utf-16-le") in raw
        problem = (
            "is encrypted: it opens only with a password."
            if encrypted
            else "is a Word 97-2003 document (.doc), not a .docx file."
        )
        fix = (
            "Save it without a password first (Word: File > Info > Protect Document)."
            if encrypted
            else "Save it as .docx (Word, or `libreoffice --convert-to docx`) first."
        )
        raise DocumentError(what, problem, fix)
    _check_inflated_size(what, raw)
    try:
        document = docx.Document(io.BytesIO(raw))
        styles = _StyleNames(document)
        blocks = list(_docx_blocks(what, document.iter_inner_content(), styles))
    except DocumentError:
        raise
    except Exception as error:  # noqa: BLE001 - python-docx fails on damaged files in many ways
        raise DocumentError(
            what,
            f"cannot be read as a DOCX file ({describe_error(error)}).",
            "Check that it is a Word .docx document and not damaged: open it in Word "
            "or LibreOffice and save it again.",
        ) from None
    return _document(what, _normalised(_joined(blocks)), "docx")


def _check_inflated_size(what: str, raw: bytes) -> None:
    """Refuse a DOCX whose parts inflate beyond `MAX_DOCX_INFLATED`, before parsing.

    A non-zip file passes: python-docx says it is no DOCX.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            inflated = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return
    if inflated > MAX_DOCX_INFLATED:
        raise DocumentError(
            what,
            f"inflates to {inflated >> 20:,} MiB once unzipped, more than the "
            f"{MAX_DOCX_INFLATED >> 20} MiB a DOCX file may hold here.",
            "Split the document, or save its text as Markdown or plain text and "
            "extract from that.",
        )


class _StyleNames:
    """Each paragraph style's name and the names it is based on, read once.

    python-docx looks the document's default style up again for every paragraph
    that has no style of its own (~0.7 ms each: 13.6 s for 20,000 paragraphs).
    """

    def __init__(self, document: Any) -> None:
        from docx.enum.style import WD_STYLE_TYPE  # noqa: PLC0415 - the documents extra

        self._chains: dict[str, list[str]] = {}
        for style in document.styles:
            if style.type == WD_STYLE_TYPE.PARAGRAPH:
                self._chains[style.style_id] = _style_chain(style)
        default = document.styles.default(WD_STYLE_TYPE.PARAGRAPH)
        self._default = [] if default is None else _style_chain(default)

    def of(self, paragraph: Paragraph) -> list[str]:
        """The paragraph's style name and those it is based on, nearest first."""
        style_id = paragraph._p.style  # noqa: SLF001 - its w:pStyle, or None
        return self._chains.get(style_id, self._default) if style_id else self._default


def _style_chain(style: Any) -> list[str]:
    names: list[str] = []
    while style is not None and len(names) < 8:  # noqa: PLR2004 - a cycle guard
        names.append(style.name or "")
        style = style.base_style
    return names


def _docx_blocks(
    what: str, content: Iterator[Paragraph | Table], styles: _StyleNames
) -> Iterator[_Block]:
    from docx.table import Table  # noqa: PLC0415 - the documents extra

    group = 0
    in_list = False
    for count, paragraph in enumerate(content, 1):
        if count > MAX_DOCX_PARAGRAPHS:
            problem = (
                f"has more than {MAX_DOCX_PARAGRAPHS:,} paragraphs and tables, "
                "more than a DOCX file may have here."
            )
            fix = "Split the document and extract each part."
            raise DocumentError(what, problem, fix)
        if isinstance(paragraph, Table):
            group += 1
            yield from _docx_rows(paragraph, group)
            in_list = False
            continue
        text = paragraph.text.strip()
        if not text:
            continue
        style = styles.of(paragraph)
        level = _heading_level(style)
        depth = _list_depth(paragraph, style)
        if level is not None:
            yield _Block(_heading(level, " ".join(text.split())))
        elif depth is not None:
            if not in_list:
                group += 1
            yield _Block("  " * depth + "- " + text, group)
        else:
            yield _Block(text)
        in_list = depth is not None and level is None


def _docx_rows(table: Table, group: int) -> Iterator[_Block]:
    for row in table.rows:
        cells, seen = [], set()
        for cell in row.cells:
            if id(cell._tc) in seen:  # noqa: SLF001 - merged cells repeat the same element
                continue
            seen.add(id(cell._tc))  # noqa: SLF001
            cells.append(" ".join(cell.text.split()))
        if any(cells):
            yield _Block("\t".join(cells), group)


def _heading_level(styles: Sequence[str]) -> int | None:
    for name in styles:
        if name.lower() == "title":
            return 1
        if found := _HEADING_STYLE.fullmatch(name.strip()):
            return int(found.group(1))
    return None


def _list_depth(paragraph: Paragraph, styles: Sequence[str]) -> int | None:
    """The list level of a list item (0 outermost), None for other paragraphs."""
    # python-docx has no public API for numbering: it is the paragraph's w:numPr,
    # where list 0 means "not in a list".
    element = paragraph._p  # noqa: SLF001
    if element.xpath("./w:pPr/w:numPr/w:numId[@w:val='0']"):
        return None
    if element.xpath("./w:pPr/w:numPr"):
        level = element.xpath("./w:pPr/w:numPr/w:ilvl/@w:val")
        return int(level[0]) if level and str(level[0]).isdigit() else 0
    if any(name.lower().startswith("list ") for name in styles):
        return 0
    return None


_LOADERS: dict[FileFormat, Callable[[str, bytes], Document]] = {
    "pdf": _load_pdf,
    "html": _load_html,
    "docx": _load_docx,
}
