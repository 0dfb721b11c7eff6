"""Tests for document sectioning: structure, budget, tiny sections, exact offsets."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from langchain_tag.extraction.sectioning import (
    MIN_SECTION_TOKENS,
    DocumentFormat,
    Section,
    detect_format,
    estimate_tokens,
    split_sections,
)

PEP8 = Path("pep8") / "pep-0008.rst"
NBA = Path("rulearena_nba") / "reference_rules.txt"

FILLER = (
    "Every request must be logged with its timestamp and the caller's identity. "
    "Requests without a caller are rejected before they reach the handler. "
    "Retries reuse the identity of the first attempt."
)


def _assert_sections(
    text: str,
    sections: Sequence[Section],
    *,
    document_id: str = "doc",
    max_tokens: int | None = None,
    length_function: Callable[[str], int] = estimate_tokens,
) -> None:
    """Offsets, order, exact coverage, ids, hashes and (optionally) the budget."""
    position = 0
    for index, section in enumerate(sections):
        assert section.index == index
        assert section.document_id == document_id
        assert section.section_id == f"{document_id}#{index:04d}"
        assert section.text == text[section.start : section.end]
        assert section.start >= position, "sections overlap or are out of order"
        assert not text[position : section.start].strip(), "text left out"
        assert section.text.strip()
        payload = "\x1f".join(section.heading_path) + "\n" + section.text
        expected = hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()
        assert section.content_hash == expected
        if max_tokens is not None and length_function(section.text) > max_tokens:
            assert len(section.text.split()) == 1, "over budget but splittable"
        position = section.end
    assert not text[position:].strip(), "text left out at the end"


def _words_only(text: str) -> int:
    return len(text.split())


# --- estimate_tokens, detect_format ---------------------------------------------------


def test_estimate_tokens_rounds_up() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abc") == 1
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("x" * 4000) == 1000


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("docs/guide.md", "markdown"),
        ("GUIDE.MARKDOWN", "markdown"),
        ("https://example.org/raw/guide.md?plain=1#top", "markdown"),
        ("pep-0008.rst", "rst"),
        ("notes.rest", "rst"),
    ],
)
def test_detect_format_by_extension_wins_over_content(
    source: str, expected: DocumentFormat
) -> None:
    assert detect_format("just some words", source) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("# Title\n\nBody text.\n", "markdown"),
        ("Intro.\n\n```python\nx = 1\n```\n", "markdown"),
        ("Title\n=====\n\nBody text.\n", "rst"),
        ("Title\n~~~~~\n\nBody text.\n", "rst"),
        ("=====\nTitle\n=====\n\nBody.\n", "rst"),
        ("Intro::\n\n    code\n", "rst"),
        ("Intro.\n\n.. code-block:: python\n\n   x = 1\n", "rst"),
        ("A long title here\n===\n\nThe underline is too short.\n", "text"),
        ("Article I\nThe parties agree.\n\nSection 2\nPayment is due.\n", "text"),
        ("Plain prose.\n\nMore prose.\n", "text"),
        ("", "text"),
    ],
)
def test_detect_format_by_content(text: str, expected: DocumentFormat) -> None:
    assert detect_format(text) == expected
    assert detect_format(text, "notes.txt") == expected
    assert detect_format(text, "no-extension") == expected


def test_detect_format_weighs_markdown_against_rst_signs() -> None:
    # Underlined titles are ambiguous; two ATX headings outweigh them.
    text = "Intro\n=====\n\n# One\n\ntext\n\n## Two\n\ntext\n"
    assert detect_format(text) == "markdown"
    assert detect_format(
        text + "\nMore\n~~~~\n\n.. note::\n\n   x\n\nx::\n\n  y\n"
    ) == ("rst")


# --- Markdown -------------------------------------------------------------------------

MARKDOWN = f"""# Deployment Guide

{FILLER}

## Install ##

Run this first:

```bash
# install the tool (a comment, not a heading)
pip install tool

# then check it
tool --version
```

{FILLER}

### Offline installs

{FILLER}

Configuration
-------------

{FILLER}

## Usage

{FILLER}
"""


def test_markdown_headings_paths_and_fenced_code() -> None:
    sections = split_sections(MARKDOWN, "doc", fmt="markdown")
    _assert_sections(MARKDOWN, sections)
    paths = [s.heading_path for s in sections]
    assert paths == [
        ("Deployment Guide",),
        ("Deployment Guide", "Install"),
        ("Deployment Guide", "Install", "Offline installs"),
        ("Deployment Guide", "Configuration"),
        ("Deployment Guide", "Usage"),
    ]
    # The heading line opens its section's text; closing hashes stay in the text.
    assert sections[1].text.startswith("## Install ##\n")
    assert "# install the tool" in sections[1].text
    assert sections[3].text.startswith("Configuration\n-------------\n")
    assert detect_format(MARKDOWN) == "markdown"
    assert split_sections(MARKDOWN, "doc") == sections


def test_markdown_hashtags_tilde_fences_and_unclosed_fences() -> None:
    text = (
        "#hashtag is not a heading\n\n~~~\n# inside tilde fence\n~~~\n\n"
        "Intro\n\n```\n# unclosed fence runs to the end\n\n## still code\n"
    )
    sections = split_sections(text, "doc", fmt="markdown")
    _assert_sections(text, sections)
    assert [s.heading_path for s in sections] == [()]


def test_markdown_fenced_code_is_never_split_inside() -> None:
    code = "\n\n".join(f"step_{i}()  # does step {i}" for i in range(12))
    text = f"# Steps\n\n{FILLER}\n\nDo this:\n\n```python\n{code}\n```\n\n{FILLER}\n"
    fence_start = text.index("```python")
    fence_end = text.index("```\n\n", fence_start + 3) + 3
    intro_start = text.index("Do this:")
    sections = split_sections(text, "doc", fmt="markdown", max_tokens=120)
    _assert_sections(text, sections, max_tokens=120)
    assert len(sections) > 1
    for section in sections:
        for offset in (section.start, section.end):
            assert not intro_start < offset < fence_end
    assert any(s.start == intro_start and s.end >= fence_end for s in sections)
    assert fence_start > intro_start


# --- reStructuredText -----------------------------------------------------------------

RST = f"""=============
 Style Guide
=============

{FILLER}

Layout
======

{FILLER}

Indentation
-----------

Write it like this::

    Not a title
    ===========

    def f():
        return 1

{FILLER}

Blank Lines
-----------

.. code-block:: python

   # A comment
   ===========

   x = 1

{FILLER}

Naming
======

Class Names
-----------

{FILLER}

Details
~~~~~~~

{FILLER}
"""


def test_rst_titles_levels_and_literal_blocks() -> None:
    sections = split_sections(RST, "doc", fmt="rst")
    _assert_sections(RST, sections)
    paths = [s.heading_path for s in sections]
    assert paths == [
        ("Style Guide",),
        ("Style Guide", "Layout"),
        ("Style Guide", "Layout", "Indentation"),
        ("Style Guide", "Layout", "Blank Lines"),
        ("Style Guide", "Naming", "Class Names"),
        ("Style Guide", "Naming", "Class Names", "Details"),
    ]
    assert "Not a title\n    ===========" in sections[2].text
    assert "# A comment\n   ===========" in sections[3].text
    # A bare title ("Naming") is joined to its first child.
    assert sections[4].text.startswith("Naming\n======\n\nClass Names\n")
    assert sections[0].text.startswith("=============\n Style Guide\n")


def test_rst_levels_follow_first_appearance_not_the_character() -> None:
    text = (
        f"Top\n~~~\n\n{FILLER}\n\nChild\n=====\n\n{FILLER}\n\nNext\n~~~~\n\n{FILLER}\n"
    )
    sections = split_sections(text, "doc", fmt="rst")
    _assert_sections(text, sections)
    assert [s.heading_path for s in sections] == [
        ("Top",),
        ("Top", "Child"),
        ("Next",),
    ]


def test_rst_literal_blocks_are_kept_with_their_introduction() -> None:
    body = "\n\n".join(f"    line_{i} = {i}" for i in range(20))
    text = f"Title\n=====\n\n{FILLER}\n\nFor example::\n\n{body}\n\n{FILLER}\n"
    literal_start = text.index("For example::")
    literal_end = text.index("line_19 = 19") + len("line_19 = 19")
    budget = estimate_tokens(text[literal_start:literal_end]) + 5
    sections = split_sections(text, "doc", fmt="rst", max_tokens=budget)
    _assert_sections(text, sections, max_tokens=budget)
    assert [(s.start, s.end) for s in sections][1] == (literal_start, literal_end)
    assert len(sections) == 3


def test_literal_block_over_budget_alone_is_cut_between_lines() -> None:
    body = "\n".join(f"    value_{i} = compute({i}, {i + 1})" for i in range(40))
    text = f"Code::\n\n{body}\n"
    sections = split_sections(text, "doc", fmt="rst", max_tokens=60)
    _assert_sections(text, sections, max_tokens=60)
    assert len(sections) > 1
    for section in sections[1:]:
        assert text[section.start - 1] == "\n"
        assert section.text.startswith("    value_")


# --- Plain text -----------------------------------------------------------------------

LEGAL = f"""MASTER SERVICES AGREEMENT

Article I Definitions
{FILLER}

Section 1.1 Scope
{FILLER}

Section 7 of this Agreement applies to renewals
and is not a heading.

1. When applying this clause would make the agreement less readable, even
   for someone who knows it, do not apply it.

2.3 Payment Terms
{FILLER}

§ 12
{FILLER}

ARTICLE II
{FILLER}

Part III: Termination
{FILLER}

Chapter 4
{FILLER}

Rule 5
{FILLER}
"""


def test_plain_text_legal_and_numbered_headings() -> None:
    sections = split_sections(LEGAL, "doc", fmt="text")
    _assert_sections(LEGAL, sections)
    paths = [s.heading_path for s in sections]
    assert paths == [
        (),
        ("Article I Definitions",),
        ("Article I Definitions", "Section 1.1 Scope"),
        ("Article I Definitions", "Section 1.1 Scope", "2.3 Payment Terms"),
        ("Article I Definitions", "§ 12"),
        ("ARTICLE II",),
        ("Part III: Termination",),
        ("Part III: Termination", "Chapter 4"),
        ("Part III: Termination", "Chapter 4", "Rule 5"),
    ]
    assert "Section 7 of this Agreement" in sections[2].text
    assert "1. When applying" in sections[2].text
    assert detect_format(LEGAL) == "text"


def test_plain_text_without_headings_is_split_into_paragraphs() -> None:
    paragraphs = [f"Paragraph {i}. {FILLER}" for i in range(8)]
    text = "\n\n".join(paragraphs) + "\n"
    sections = split_sections(text, "doc", max_tokens=100)
    _assert_sections(text, sections, max_tokens=100)
    assert all(s.heading_path == () for s in sections)
    starts = {text.index(p) for p in paragraphs}
    assert all(s.start in starts for s in sections)
    ends = {text.index(p) + len(p.rstrip()) for p in paragraphs}
    assert all(s.end in ends for s in sections)


# --- Budget ---------------------------------------------------------------------------


def test_oversized_section_is_split_at_paragraphs_keeping_its_path() -> None:
    text = "# Rules\n\n" + "\n\n".join(f"Rule {i}. {FILLER}" for i in range(10))
    sections = split_sections(text, "doc", fmt="markdown", max_tokens=150)
    _assert_sections(text, sections, max_tokens=150)
    assert len(sections) > 2
    assert all(s.heading_path == ("Rules",) for s in sections)
    for section in sections[1:]:
        assert text[section.start - 2 : section.start] == "\n\n"
        assert section.text.startswith("Rule ")


def test_oversized_paragraph_is_split_at_sentence_ends() -> None:
    sentences = [
        f"Clause {i} applies to every order; it has no exception" for i in range(30)
    ]
    text = ". ".join(sentences) + "!"
    sections = split_sections(text, "doc", fmt="text", max_tokens=40)
    _assert_sections(text, sections, max_tokens=40)
    assert len(sections) > 3
    for section in sections:
        assert section.text[-1] in ".;!"
        assert section.text[0].isupper() or section.text.startswith("it ")


def test_paragraph_without_sentence_ends_is_split_at_whitespace() -> None:
    text = " ".join(f"token{i}" for i in range(2000))
    sections = split_sections(text, "doc", max_tokens=50)
    _assert_sections(text, sections, max_tokens=50)
    for section in sections:
        assert section.start == 0 or text[section.start - 1] == " "
        assert section.end == len(text) or text[section.end] == " "
    assert " ".join(s.text for s in sections) == text


def test_a_word_longer_than_the_budget_is_kept_whole() -> None:
    word = "x" * 400
    text = f"Short intro here.\n\n{word}\n\nShort outro here."
    sections = split_sections(text, "doc", max_tokens=20)
    _assert_sections(text, sections, max_tokens=20)
    assert [s.text for s in sections] == [
        "Short intro here.",
        word,
        "Short outro here.",
    ]


def test_custom_length_function_sets_the_budget() -> None:
    text = "\n\n".join(f"one two three four five six {i}." for i in range(20))
    sections = split_sections(text, "doc", max_tokens=15, length_function=_words_only)
    _assert_sections(text, sections, max_tokens=15, length_function=_words_only)
    assert all(_words_only(s.text) <= 15 for s in sections)
    assert len(sections) == 10


# --- Tiny sections --------------------------------------------------------------------


def test_tiny_sibling_is_merged_into_the_previous_section() -> None:
    text = (
        f"# Guide\n\n{FILLER}\n\n## Alpha\n\n{FILLER}\n\n## Beta\n\nShort.\n\n"
        "## Gamma\n\nAlso short.\n"
    )
    sections = split_sections(text, "doc", fmt="markdown")
    _assert_sections(text, sections)
    assert [s.heading_path for s in sections] == [("Guide",), ("Guide", "Alpha")]
    assert sections[1].text.endswith("## Gamma\n\nAlso short.")


def test_tiny_section_under_another_parent_is_not_merged() -> None:
    text = f"# One\n\n## Child\n\n{FILLER}\n\n# Two\n\n## Other\n\nShort.\n"
    sections = split_sections(text, "doc", fmt="markdown")
    _assert_sections(text, sections)
    assert [s.heading_path for s in sections] == [
        ("One", "Child"),
        ("Two", "Other"),
    ]
    assert estimate_tokens(sections[1].text) < MIN_SECTION_TOKENS


def test_tiny_section_is_not_merged_past_the_budget() -> None:
    text = f"# A\n\n{FILLER}\n\n# B\n\nShort.\n"
    merged = split_sections(text, "doc", fmt="markdown", max_tokens=1500)
    assert [s.heading_path for s in merged] == [("A",)]
    budget = estimate_tokens(f"# A\n\n{FILLER}".rstrip()) + 1
    kept = split_sections(text, "doc", fmt="markdown", max_tokens=budget)
    _assert_sections(text, kept, max_tokens=budget)
    assert [s.heading_path for s in kept] == [("A",), ("B",)]


def test_bare_parent_heading_joins_its_first_child() -> None:
    text = f"# Parent\n\n## Child\n\n{FILLER}\n\n## Sibling\n\n{FILLER}\n"
    sections = split_sections(text, "doc", fmt="markdown")
    _assert_sections(text, sections)
    assert [s.heading_path for s in sections] == [
        ("Parent", "Child"),
        ("Parent", "Sibling"),
    ]
    assert sections[0].text.startswith("# Parent\n\n## Child\n")


# --- Edge cases -----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " ", "\n\n\t\n", "\r\n\r\n"])
def test_blank_documents_give_no_sections(text: str) -> None:
    assert split_sections(text, "doc") == []


def test_crlf_and_cr_line_endings_keep_exact_offsets() -> None:
    lf = f"Title\n=====\n\n{FILLER}\n\nSub\n---\n\n{FILLER}\n\n{FILLER}\n"
    for newline in ("\r\n", "\r"):
        text = lf.replace("\n", newline)
        sections = split_sections(text, "doc")
        _assert_sections(text, sections)
        assert [s.heading_path for s in sections] == [("Title",), ("Title", "Sub")]
        small = split_sections(text, "doc", max_tokens=40)
        _assert_sections(text, small, max_tokens=40)
        assert len(small) > 2
        assert all(not s.text.endswith(("\r", "\n")) for s in small)


@pytest.mark.parametrize(
    ("text", "fmt", "last"),
    [
        (f"# A\n\n{FILLER}\n\n# B", "markdown", "# B"),
        (f"A\n==\n\n{FILLER}\n\nB\n==", "rst", "B\n=="),
        (f"Article 1\n{FILLER}\n\nArticle 2\n", "text", "Article 2"),
    ],
)
def test_heading_as_the_last_line(text: str, fmt: DocumentFormat, last: str) -> None:
    sections = split_sections(text, "doc", fmt=fmt)
    _assert_sections(text, sections)
    # The last heading is a tiny sibling, merged into the section before it.
    assert len(sections) == 1
    assert sections[0].text.endswith(f"\n\n{last}")
    budget = estimate_tokens(text.rstrip()) - 1  # too small for the merge
    bare = split_sections(text, "doc", fmt=fmt, max_tokens=budget)
    _assert_sections(text, bare, max_tokens=budget)
    assert len(bare) == 2
    assert bare[-1].text == last
    assert bare[-1].heading_path == (last.splitlines()[0].lstrip("# "),)


def test_unicode_text_keeps_exact_offsets() -> None:
    text = (
        "Règles générales\n================\n\n"
        "Le café ☕ doit être servi chaud. Ça va? Oui! 🚀🚀 naïve cafe\u0301.\n\n"
        "規則\n====\n\n"
        + "すべての注文は記録されなければならない。 " * 40
        + "\n\n"
        + "\u00a0".join(["mot"] * 200)
    )
    for max_tokens in (15, 60, 1500):
        sections = split_sections(text, "doc", max_tokens=max_tokens)
        _assert_sections(text, sections, max_tokens=max_tokens)
    sections = split_sections(text, "doc")
    assert sections[0].heading_path == ("Règles générales",)
    assert sections[-1].heading_path == ("規則",)


def test_lone_surrogates_do_not_break_hashing() -> None:
    text = "Broken \udc80 byte.\n\nAnother paragraph."
    sections = split_sections(text, "doc")
    _assert_sections(text, sections)


def test_same_content_gives_the_same_hash_anywhere() -> None:
    section = f"## Refunds\n\n{FILLER}"
    first = split_sections(f"# Policy\n\nIntro.\n\n{section}\n", "a", fmt="markdown")
    second = split_sections(
        f"Preamble.\n\n# Policy\n\n{FILLER}\n\n{section}\n", "b", fmt="markdown"
    )
    assert first[-1].text == second[-1].text == section
    assert first[-1].content_hash == second[-1].content_hash
    assert first[-1].start != second[-1].start
    moved = split_sections(f"# Other\n\nIntro.\n\n{section}\n", "a", fmt="markdown")
    assert moved[-1].text == section
    assert moved[-1].content_hash != first[-1].content_hash  # the path counts


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        split_sections("text", "doc", max_tokens=0)
    with pytest.raises(ValueError, match="document_id"):
        split_sections("text", "")
    with pytest.raises(ValueError, match="format"):
        split_sections("text", "doc", fmt="html")  # type: ignore[arg-type]


def test_section_model_checks_its_offsets_and_is_frozen() -> None:
    section = split_sections("Some text.", "doc")[0]
    with pytest.raises(ValidationError, match="spans"):
        Section(**{**section.model_dump(), "end": section.end + 1})
    with pytest.raises(ValidationError, match="extra"):
        Section(**{**section.model_dump(), "extra": 1})
    with pytest.raises(ValidationError):
        section.text = "changed"  # type: ignore[misc]
    assert Section.model_validate(section.model_dump(mode="json")) == section


_PIECES = (
    "# Heading {n}",
    "## Sub heading {n}",
    "Title {n}\n==========",
    "Sub {n}\n---------",
    "Article {n}",
    "Section {n}.1 Scope",
    "{n}. Numbered",
    "```\n# code {n}\n\nmore code\n```",
    "Example::\n\n    literal {n}\n\n    Not a title\n    ===========",
    ".. code-block:: python\n\n   x = {n}\n\n   y = {n}",
    "A sentence {n}. Another one; and more! Really? Yes.",
    "word " * 80,
    "longword" * 60,
    "(a) Clause {n} applies.\n(b) Clause {n} does not.",
    "Ünïcödé ☕ 規則 {n}.",
    "   indented {n}",
    "",
    "   ",
)


@pytest.mark.parametrize("seed", range(60))
def test_generated_documents_keep_every_invariant(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test data, not cryptography
    lines = [
        rng.choice(_PIECES).format(n=rng.randint(1, 20))
        for _ in range(rng.randint(0, 60))
    ]
    text = rng.choice(["\n", "\r\n", "\n\n"]).join(lines)
    if rng.random() < 0.3:
        text = text.replace("\n", "\r\n")
    for fmt in (None, "markdown", "rst", "text"):
        for max_tokens in (8, 40, 1500):
            sections = split_sections(text, "gen", fmt=fmt, max_tokens=max_tokens)
            _assert_sections(text, sections, document_id="gen", max_tokens=max_tokens)


# --- Real documents -------------------------------------------------------------------


def _code_block_spans(text: str) -> list[tuple[int, int]]:
    """Spans of the `.. code-block::` directives of an RST text, found naively."""
    spans = []
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for i, line in enumerate(lines):
        match = re.match(r"( *)\.\. code-block::", line)
        if match is None:
            continue
        base, last = len(match.group(1)), i
        for j in range(i + 1, len(lines)):
            if not lines[j].strip():
                continue
            if len(lines[j]) - len(lines[j].lstrip()) <= base:
                break
            last = j
        spans.append((offsets[i], offsets[last] + len(lines[last].rstrip())))
    return spans


@pytest.mark.requires_data
def test_pep8_sections(data_dir: Path) -> None:
    path = data_dir / PEP8
    text = path.read_text(encoding="utf-8")
    assert detect_format(text) == "rst"
    assert detect_format(text, str(path)) == "rst"
    sections = split_sections(text, "pep8", max_tokens=1500)  # timed: bench_text.py
    _assert_sections(text, sections, document_id="pep8", max_tokens=1500)
    assert 20 < len(sections) < 60
    paths = {s.heading_path for s in sections}
    assert ("Code Lay-out", "Imports") in paths
    assert ("Code Lay-out", "Indentation") in paths
    assert (
        "Naming Conventions",
        "Prescriptive: Naming Conventions",
        "Class Names",
    ) in (paths)
    imports = next(s for s in sections if s.heading_path[-1:] == ("Imports",))
    assert imports.text.startswith("Imports\n-------\n")
    assert sections[0].heading_path == ()
    assert sections[0].text.startswith("PEP: 8\n")
    assert split_sections(text, "pep8") == sections


@pytest.mark.requires_data
@pytest.mark.parametrize("max_tokens", [150, 400, 1500])
def test_pep8_code_blocks_are_never_split(data_dir: Path, max_tokens: int) -> None:
    text = (data_dir / PEP8).read_text(encoding="utf-8")
    sections = split_sections(text, "pep8", max_tokens=max_tokens)
    _assert_sections(text, sections, document_id="pep8", max_tokens=max_tokens)
    blocks = _code_block_spans(text)
    assert len(blocks) > 50
    for start, end in blocks:
        for section in sections:
            assert not start < section.start < end
            assert not start < section.end < end


@pytest.mark.requires_data
def test_pep8_edit_only_changes_nearby_section_hashes(data_dir: Path) -> None:
    text = (data_dir / PEP8).read_text(encoding="utf-8")
    before = split_sections(text, "pep8")
    titles = {title for s in before for title in s.heading_path}
    words = list(re.finditer(r"[A-Za-z]{4,}", text))
    checked = 0
    for word in words[::120]:
        line_start = text.rfind("\n", 0, word.start()) + 1
        line_end = text.find("\n", word.end())
        if text[line_start:line_end].strip() in titles:
            continue  # renaming a title changes the path of its subsections
        for replacement in ("x", word.group() + "-edited"):
            edited = text[: word.start()] + replacement + text[word.end() :]
            after = split_sections(edited, "pep8")
            _assert_sections(edited, after, document_id="pep8")
            hashes = {s.content_hash for s in after}
            where = next(s.index for s in before if s.start <= word.start() < s.end)
            changed = [s.index for s in before if s.content_hash not in hashes]
            assert where in changed
            assert all(abs(index - where) <= 1 for index in changed), (word, changed)
            checked += 1
    assert checked > 40


@pytest.mark.requires_data
def test_nba_sections(data_dir: Path) -> None:
    path = data_dir / NBA
    text = path.read_text(encoding="utf-8")
    assert detect_format(text, str(path)) == "markdown"
    # Timed by benchmarks/bench_text.py.
    sections = split_sections(text, "nba", fmt=detect_format(text, str(path)))
    _assert_sections(text, sections, document_id="nba", max_tokens=1500)
    titles = re.findall(r"^# (.+)$", text, flags=re.MULTILINE)
    assert {s.heading_path[0] for s in sections} == set(titles)
    assert all(s.heading_path for s in sections)
    assert (
        "By-Laws, Section 7: NBA Draft",
        "7.03 First Round Draft Choice",
    ) in {s.heading_path for s in sections}
    # Lettered clauses are paragraphs, never headings.
    assert not any(title.startswith("(") for s in sections for title in s.heading_path)
    # Sections that were cut for the budget start at a clause.
    assert all(
        s.text.startswith(("#", "(", "|")) or s.text[0].isupper() for s in sections
    )


@pytest.mark.requires_data
@pytest.mark.parametrize("max_tokens", [100, 300, 800])
def test_real_documents_at_small_budgets(data_dir: Path, max_tokens: int) -> None:
    for name in (PEP8, NBA):
        text = (data_dir / name).read_text(encoding="utf-8")
        sections = split_sections(text, "d", max_tokens=max_tokens)
        _assert_sections(text, sections, document_id="d", max_tokens=max_tokens)


def test_a_section_cut_to_fit_is_never_packed_across_a_break() -> None:
    pages = [
        "\n\n".join(f"Page {p} paragraph {n} must be read." for n in range(3))
        for p in (1, 2, 3)
    ]
    text = "\n\n".join(pages)
    starts = [text.index(page) for page in pages]
    packed = split_sections(text, "d", fmt="text", max_tokens=40)
    assert any(s.start < starts[1] < s.end for s in packed)  # crosses a page
    cut = split_sections(text, "d", fmt="text", max_tokens=40, breaks=starts)
    assert not any(s.start < b < s.end for s in cut for b in starts)
    assert "".join(text[s.start : s.end] for s in cut).replace("\n", "") == (
        text.replace("\n", "")
    )
    # A section that fits the budget stays whole, breaks or not.
    whole = split_sections(text, "d", fmt="text", max_tokens=1500, breaks=starts)
    assert [(s.start, s.end) for s in whole] == [(0, len(text))]


def test_a_tiny_part_is_never_merged_across_a_break() -> None:
    # Three pages, the last one line: merged into page 2, an edit of page 3 would
    # send page 2 again.
    pages = [FILLER, FILLER, "Be brief."]
    text = "\n\n".join(pages)
    starts = [0, len(FILLER) + 2, 2 * len(FILLER) + 4]
    budget = estimate_tokens(f"{FILLER}\n\n{FILLER}") - 1
    merged = split_sections(text, "d", fmt="text", max_tokens=budget)
    assert [s.text for s in merged] == [FILLER, f"{FILLER}\n\nBe brief."]
    paged = split_sections(text, "d", fmt="text", max_tokens=budget, breaks=starts)
    _assert_sections(text, paged, document_id="d", max_tokens=budget)
    assert [s.text for s in paged] == pages
