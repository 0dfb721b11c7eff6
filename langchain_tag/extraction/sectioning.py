"""Split a document into sections, one per phase-1 LLM call.

Normative span detection runs one LLM call per section, so a section follows the
document's structure, fits a token budget, and maps back to the exact characters of
the original text. `split_sections` works in four steps:

1. **Structure.** The text is cut at its headings: Markdown ATX headings (outside
   fenced code) and setext headings; reStructuredText titles (underlined, optionally
   overlined, with a punctuation line at least as long as the title; levels in order
   of first appearance); in plain text, legal-style headings on their own line
   (``Article I``, ``SECTION 2.1``, ``§ 12``, ``Part II``, ``2.3 Scope`` ...). A
   heading's lines open its section's text, and `Section.heading_path` lists the
   enclosing titles. A section holding nothing but its title (a parent whose body
   starts with a sub-heading) is joined to its first child, so no call gets a bare
   title.
2. **Budget.** A section over `max_tokens` is cut at paragraph boundaries (blank
   lines). Literal blocks (RST ``::`` blocks and directives with their indented
   bodies, Markdown fenced code) are never cut and stay with a paragraph ending in
   ``:`` that introduces them. A paragraph over the budget on its own is cut at
   sentence ends (``.``, ``;``, ``!`` or ``?`` then whitespace), then at whitespace,
   never inside a word; the one exception is a literal block over the budget on its
   own, which is cut between its lines rather than sent whole. The pieces are packed
   greedily into parts, so an edit can only move part boundaries after it, within the
   same section. Given `breaks` (a PDF's page starts), no part is packed across one,
   so an edit moves no boundary outside its own page.
3. **Tiny sections.** A section (or part) under `MIN_SECTION_TOKENS` is merged into
   the one before it when both have the same parent (equal ``heading_path[:-1]``) and
   the merged text still fits `max_tokens`. The merged section keeps the first one's
   heading path; the later titles are in its text. This avoids one call per two-line
   section. Nothing is merged across one of `breaks`.
4. **Ids.** Sections are numbered in document order; `Section.content_hash` depends
   only on the heading path and the text, so unchanged sections keep their hash (and
   their cached extraction) when another part of the document is edited.

Whitespace between sections is left out, but sections never overlap and together hold
every other character of the document exactly once, and always
``section.text == text[section.start:section.end]``.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

DocumentFormat = Literal["markdown", "rst", "text"]

MIN_SECTION_TOKENS = 50
"""Sections under this many tokens are merged into their previous sibling."""

_FORMATS: tuple[str, ...] = get_args(DocumentFormat)
_MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd", ".mkdn"})
_RST_SUFFIXES = frozenset({".rst", ".rest"})


class Section(BaseModel):
    """One contiguous piece of a document, sized for one extraction call.

    ``text == document_text[start:end]`` for the document the section came from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    section_id: str = Field(min_length=1, description="'{document_id}#{index:04d}'.")
    document_id: str = Field(min_length=1)
    index: int = Field(ge=0, description="Position in the document's section list.")
    heading_path: tuple[str, ...] = Field(
        default=(), description="Titles of the enclosing headings, outermost first."
    )
    start: int = Field(ge=0, description="Character offset in the document.")
    end: int = Field(ge=0, description="Exclusive end offset.")
    text: str
    content_hash: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the heading path and text; a cache key for extraction.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Section:
        if self.end - self.start != len(self.text):
            msg = (
                f"text has {len(self.text)} characters but start..end "
                f"({self.start}..{self.end}) spans {self.end - self.start}"
            )
            raise ValueError(msg)
        return self


def _content_hash(heading_path: Sequence[str], text: str) -> str:
    """The `Section.content_hash` of a heading path and a text.

    sha256 hex of the titles joined by U+001F (which no title contains), a newline,
    then the text.
    """
    payload = "\x1f".join(heading_path) + "\n" + text
    # Lone surrogates (from lenient decoding) must not make hashing fail.
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def estimate_tokens(text: str) -> int:
    """Approximate token count: one token per four characters, rounded up.

    An offline stand-in for a tokenizer (tiktoken downloads its encodings at run
    time).
    """
    return (len(text) + 3) // 4


def detect_format(text: str, source: str | None = None) -> DocumentFormat:
    """Guess the markup of a document, from its file name or else its content.

    ``.md``/``.markdown`` give Markdown and ``.rst``/``.rest`` reStructuredText;
    any other name (``.txt`` included) falls back to the content. By content,
    Markdown-only signs (ATX headings, fenced code) are weighed against RST-only signs
    (overlined titles, title adornments other than ``=`` and ``-``, directives,
    ``::`` literal blocks). Underlined titles alone are read as RST (a Markdown setext
    heading splits the same way). Anything else is plain text.

    Args:
        text: The document.
        source: Its path or URL, if known.

    Returns:
        ``"markdown"``, ``"rst"`` or ``"text"``.
    """
    if source:
        suffix = PurePath(source.split("?", 1)[0].split("#", 1)[0]).suffix.lower()
        if suffix in _MARKDOWN_SUFFIXES:
            return "markdown"
        if suffix in _RST_SUFFIXES:
            return "rst"
    doc = _Doc(text)
    markdown = _markdown_structure(doc)
    markdown_signs = sum(not h.setext for h in markdown.headings) + len(
        markdown.regions
    )
    rst = _rst_structure(doc)
    rst_signs = len(rst.regions) + sum(
        h.overlined or h.adornment not in "=-" for h in rst.headings
    )
    if markdown_signs > rst_signs:
        return "markdown"
    if rst_signs or rst.headings:
        return "rst"
    return "text"


def split_sections(
    text: str,
    document_id: str,
    *,
    fmt: DocumentFormat | None = None,
    max_tokens: int = 1500,
    length_function: Callable[[str], int] = estimate_tokens,
    breaks: Sequence[int] = (),
) -> list[Section]:
    """Split a document into sections for per-section extraction calls.

    See the module docstring for the rules (structure, budget, tiny sections).

    Args:
        text: The whole document, exactly as offsets should refer to it.
        document_id: Id of the document; prefixes every `Section.section_id`.
        fmt: Markup of the document; None detects it from the content.
        max_tokens: Budget per section, measured with `length_function`. Only a
            single word longer than the budget can exceed it.
        length_function: Size of a text in tokens.
        breaks: Offsets, in order, that a section cut to fit the budget never
            packs across, nor a tiny section is merged across, such as the page
            starts of a PDF: an edit on one page then changes no part of another.
            A section that fits stays whole.

    Returns:
        The sections in document order; an empty list for a blank document.

    Raises:
        ValueError: `document_id` is empty, `max_tokens` is below 1 or `fmt` is
            unknown.
    """
    if not document_id:
        msg = "document_id must not be empty"
        raise ValueError(msg)
    if max_tokens < 1:
        msg = f"max_tokens must be at least 1, got {max_tokens}"
        raise ValueError(msg)
    if fmt is None:
        fmt = detect_format(text)
    if fmt not in _FORMATS:
        msg = f"unknown document format {fmt!r}; expected one of {_FORMATS}"
        raise ValueError(msg)
    doc = _Doc(text)
    structure = _PARSERS[fmt](doc)

    def fits(start: int, end: int) -> bool:
        if length_function is estimate_tokens:  # skip the copy: only length counts
            return (end - start + 3) // 4 <= max_tokens
        return length_function(text[start:end]) <= max_tokens

    parts: list[_Part] = []
    for raw in _join_bare_headings(_raw_sections(doc, structure.headings)):
        parts.extend(_budget_parts(doc, structure, raw, fits, breaks))
    merged = _merge_tiny(text, parts, fits, length_function, breaks)
    return [
        Section(
            section_id=f"{document_id}#{index:04d}",
            document_id=document_id,
            index=index,
            heading_path=part.path,
            start=part.start,
            end=part.end,
            text=text[part.start : part.end],
            content_hash=_content_hash(part.path, text[part.start : part.end]),
        )
        for index, part in enumerate(merged)
    ]


# --- Lines --------------------------------------------------------------------------

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


class _Doc:
    """The text cut into lines (without their line ends), with their offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts: list[int] = []
        self.lines: list[str] = []
        for match in _LINE.finditer(text):
            self.starts.append(match.start())
            self.lines.append(match.group().rstrip("\r\n"))
        self.blank = [not line.strip() for line in self.lines]

    def __len__(self) -> int:
        return len(self.lines)

    def end_of(self, line: int) -> int:
        """Offset just after the last non-whitespace character of a line."""
        return self.starts[line] + len(self.lines[line].rstrip())

    def indent(self, line: int) -> int:
        text = self.lines[line]
        return len(text) - len(text.lstrip())


@dataclass(frozen=True)
class _Heading:
    first: int  # line indices, inclusive
    last: int
    level: int
    title: str
    setext: bool = False  # Markdown: underlined rather than ATX
    adornment: str = ""  # RST: the underline character
    overlined: bool = False  # RST


@dataclass(frozen=True)
class _Region:
    """Lines kept in one piece: a literal block, a directive, front matter."""

    first: int  # line indices, inclusive
    last: int
    kind: Literal["literal", "prose"]


@dataclass(frozen=True)
class _Structure:
    headings: list[_Heading]
    regions: list[_Region]


def _region_mask(n_lines: int, regions: Sequence[_Region]) -> list[bool]:
    mask = [False] * n_lines
    for region in regions:
        mask[region.first : region.last + 1] = [True] * (region.last - region.first + 1)
    return mask


def _opens_block(doc: _Doc, line: int, headings: Sequence[_Heading]) -> bool:
    """Whether a line starts a block: first line, after a blank line or a heading."""
    return (
        line == 0
        or doc.blank[line - 1]
        or bool(headings and headings[-1].last == line - 1)
    )


# --- Markdown -----------------------------------------------------------------------

_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*\Z")
_FENCE = re.compile(r" {0,3}(?:(`{3,})[^`]*|(~{3,}).*)\Z")
_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*\Z")
_LIST_ITEM = re.compile(r"[ \t]*(?:[-*+]|\d{1,9}[.)])(?:[ \t]|\Z)")
_FRONT_MATTER_END = frozenset({"---", "..."})


def _markdown_regions(doc: _Doc) -> list[_Region]:
    """YAML front matter and fenced code blocks (an unclosed fence runs to the end)."""
    regions: list[_Region] = []
    i = 0
    if doc.lines and doc.lines[0].rstrip() == "---":
        for j in range(1, len(doc)):
            if doc.lines[j].rstrip() in _FRONT_MATTER_END:
                regions.append(_Region(0, j, "literal"))
                i = j + 1
                break
    while i < len(doc):
        opening = _FENCE.match(doc.lines[i])
        if opening is None:
            i += 1
            continue
        fence = opening.group(1) or opening.group(2)
        closing = re.compile(rf" {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*\Z")
        last = len(doc) - 1
        for j in range(i + 1, len(doc)):
            if closing.match(doc.lines[j]):
                last = j
                break
        while last > i and doc.blank[last]:
            last -= 1
        regions.append(_Region(i, last, "literal"))
        i = last + 1
    return regions


def _setext_title(doc: _Doc, line: int, in_region: Sequence[bool]) -> str | None:
    """The title if `line` is a one-line paragraph underlined with = or -."""
    below = line + 1
    if below >= len(doc) or in_region[line] or in_region[below] or doc.blank[line]:
        return None
    underline = _SETEXT.match(doc.lines[below])
    title = doc.lines[line].strip()
    if (
        underline is None
        or doc.indent(line) > 3  # noqa: PLR2004 - four spaces make indented code
        or _ATX.match(doc.lines[line])
        or _LIST_ITEM.match(doc.lines[line])
        or _FENCE.match(doc.lines[line])
    ):
        return None
    marks = underline.group(1)
    # Under a longer title, a lone "-" or "--" is more likely a list item or a typo.
    return title if len(marks) >= min(3, len(title)) else None


def _markdown_structure(doc: _Doc) -> _Structure:
    regions = _markdown_regions(doc)
    in_region = _region_mask(len(doc), regions)
    headings: list[_Heading] = []
    i = 0
    while i < len(doc):
        if in_region[i] or doc.blank[i]:
            i += 1
            continue
        atx = _ATX.match(doc.lines[i])
        if atx is not None and atx.group(2):
            headings.append(_Heading(i, i, len(atx.group(1)), atx.group(2).strip()))
        elif _opens_block(doc, i, headings):
            title = _setext_title(doc, i, in_region)
            if title is not None:
                level = 1 if doc.lines[i + 1].strip()[0] == "=" else 2
                headings.append(_Heading(i, i + 1, level, title, setext=True))
                i += 1
        i += 1
    return _Structure(headings, regions)


# --- reStructuredText ---------------------------------------------------------------

_ADORNMENT_CHARS = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_DIRECTIVE = re.compile(r"[ \t]*\.\.[ \t]+(\w[\w.+:-]*?)::(?:[ \t]|\Z)")
_CODE_DIRECTIVES = frozenset(
    "code code-block sourcecode literalinclude parsed-literal doctest testcode "  # noqa: SIM905
    "testoutput ipython math raw productionlist".split()
)


def _adornment(line: str) -> str | None:
    """The character of an RST adornment line (one punctuation mark repeated)."""
    stripped = line.rstrip()
    if (
        len(stripped) < 2  # noqa: PLR2004 - one character is a bullet or a typo
        or stripped in {"::", ".."}  # a literal block marker, a comment
        or stripped[0] not in _ADORNMENT_CHARS
        or stripped.count(stripped[0]) != len(stripped)
    ):
        return None
    return stripped[0]


def _indented_body_end(doc: _Doc, line: int, base_indent: int) -> int:
    """Last non-blank line of the block indented deeper than `base_indent`."""
    last = line
    for j in range(line + 1, len(doc)):
        if doc.blank[j]:
            continue
        if doc.indent(j) <= base_indent:
            break
        last = j
    return last


def _rst_regions(doc: _Doc) -> list[_Region]:
    """Directives with their bodies, and the indented bodies of ``::`` paragraphs."""
    regions: list[_Region] = []
    i = 0
    while i < len(doc):
        if doc.blank[i]:
            i += 1
            continue
        directive = _DIRECTIVE.match(doc.lines[i])
        if directive is not None:
            last = _indented_body_end(doc, i, doc.indent(i))
            code = directive.group(1).lower() in _CODE_DIRECTIVES
            regions.append(_Region(i, last, "literal" if code else "prose"))
            i = last + 1
            continue
        end = i  # last line of the paragraph starting at i
        while (
            end + 1 < len(doc)
            and not doc.blank[end + 1]
            and not _DIRECTIVE.match(doc.lines[end + 1])
        ):
            end += 1
        body = end + 1
        while body < len(doc) and doc.blank[body]:
            body += 1
        if (
            doc.lines[end].rstrip().endswith("::")
            and body < len(doc)
            and doc.indent(body) > doc.indent(i)
        ):
            last = _indented_body_end(doc, end, doc.indent(i))
            regions.append(_Region(body, last, "literal"))
            end = last
        i = end + 1
    return regions


def _rst_title_at(
    doc: _Doc, line: int, in_region: Sequence[bool]
) -> tuple[int, str, bool, str] | None:
    """(last line, adornment, overlined, title) of a section title starting here."""
    lines = doc.lines
    over = _adornment(lines[line])
    if over is not None:
        if line + 2 >= len(doc) or any(in_region[line : line + 3]):
            return None
        title = lines[line + 1].strip()
        under = lines[line + 2].rstrip()
        if (
            title
            and _adornment(title) is None
            and _adornment(under) == over
            and min(len(under), len(lines[line].rstrip())) >= len(title)
        ):
            return line + 2, over, True, title
        return None
    title = lines[line].rstrip()
    if line + 1 >= len(doc) or in_region[line] or in_region[line + 1]:
        return None
    underline = _adornment(lines[line + 1])
    if (
        underline is None
        or title[:1].isspace()
        or title.startswith("..")
        or len(lines[line + 1].rstrip()) < len(title)
    ):
        return None
    return line + 1, underline, False, title


def _rst_structure(doc: _Doc) -> _Structure:
    regions = _rst_regions(doc)
    in_region = _region_mask(len(doc), regions)
    styles: dict[tuple[str, bool], int] = {}  # levels in order of first appearance
    headings: list[_Heading] = []
    i = 0
    while i < len(doc):
        found = None
        if not doc.blank[i] and not in_region[i] and _opens_block(doc, i, headings):
            found = _rst_title_at(doc, i, in_region)
        if found is None:
            i += 1
            continue
        last, adornment, overlined, title = found
        level = styles.setdefault((adornment, overlined), len(styles) + 1)
        headings.append(
            _Heading(i, last, level, title, adornment=adornment, overlined=overlined)
        )
        i = last + 1
    return _Structure(headings, regions)


# --- Plain text ---------------------------------------------------------------------

_ROMAN = r"(?=[IVXLCDM])M{0,4}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})"
_NUMBER = rf"(?:\d+(?:\.\d+)*[A-Za-z]?|{_ROMAN}|{_ROMAN.lower()}|[A-Z])"
_KEYWORD_HEADING = re.compile(
    r"[ \t]{0,3}(?:(?P<kw>(?i:part|chapter|article|section|rule|appendix|schedule|"
    rf"annex|exhibit))[ \t]+|(?P<sign>§)§?[ \t]*)(?P<num>{_NUMBER})\b(?P<rest>.*)\Z"
)
_NUMBERED_HEADING = re.compile(
    r"[ \t]{0,3}(?P<num>\d+(?:\.\d+)+\.?|\d+\.)(?:[ \t]+(?P<rest>\S.*?))?[ \t]*\Z"
)
_KEYWORD_LEVELS = dict.fromkeys(("part", "appendix", "schedule", "annex", "exhibit"), 1)
_KEYWORD_LEVELS |= {"chapter": 2, "article": 3, "section": 4, "§": 4, "rule": 5}
_NUMBERED_BASE_LEVEL = 10  # numbered headings nest under keyword headings
_MAX_KEYWORD_HEADING = 120
_MAX_NUMBERED_HEADING = 80
_TITLE_SEPARATORS = ".:,;)-\u2013\u2014 \t"


def _title_like(rest: str) -> bool:
    """Whether what follows a heading number reads as a title, not a sentence."""
    title = rest.lstrip(_TITLE_SEPARATORS)
    return not title or title[0].isupper() or title[0].isdigit() or title[0] in "\"'(“"


def _continues_text(doc: _Doc, line: int, *, numbered: bool) -> bool:
    """Whether the next line carries on the sentence (or list item) of `line`."""
    below = line + 1
    if below >= len(doc) or doc.blank[below]:
        return False
    if doc.lines[below].lstrip()[0].islower():
        return True
    # An indented next line continues a numbered list item.
    return numbered and doc.indent(below) > doc.indent(line)


def _text_heading(doc: _Doc, line: int) -> tuple[int, str, bool] | None:
    """(level, title, numbered) of a legal-style or numbered heading line."""
    text = doc.lines[line].rstrip()
    keyword = _KEYWORD_HEADING.match(text)
    if keyword is not None:
        if len(text) >= _MAX_KEYWORD_HEADING or not _title_like(keyword.group("rest")):
            return None
        kind = (keyword.group("kw") or keyword.group("sign")).lower()
        return _KEYWORD_LEVELS[kind], text.strip(), False
    numbered = _NUMBERED_HEADING.match(text)
    if numbered is None or len(text) >= _MAX_NUMBERED_HEADING:
        return None
    rest = numbered.group("rest")
    if rest is not None and (not _title_like(rest) or rest[-1] in ".,;:!?"):
        return None
    depth = numbered.group("num").rstrip(".").count(".") + 1
    return _NUMBERED_BASE_LEVEL + depth, text.strip(), True


def _text_structure(doc: _Doc) -> _Structure:
    headings: list[_Heading] = []
    last_text = max((i for i in range(len(doc)) if not doc.blank[i]), default=-1)
    for i in range(len(doc)):
        if doc.blank[i] or not _opens_block(doc, i, headings):
            continue
        found = _text_heading(doc, i)
        if found is None:
            continue
        level, title, numbered = found
        # A numbered heading must be followed by text: a lone "12." at the end of a
        # document is a page number.
        if (numbered and i == last_text) or _continues_text(doc, i, numbered=numbered):
            continue
        headings.append(_Heading(i, i, level, title))
    return _Structure(headings, [])


_PARSERS: dict[str, Callable[[_Doc], _Structure]] = {
    "markdown": _markdown_structure,
    "rst": _rst_structure,
    "text": _text_structure,
}


# --- Sections -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Raw:
    """A structural section: lines `first` to `stop` (exclusive)."""

    first: int
    stop: int
    path: tuple[str, ...]
    bare: bool  # only its heading, no body


@dataclass(frozen=True)
class _Part:
    start: int
    end: int
    path: tuple[str, ...]


def _raw_sections(doc: _Doc, headings: Sequence[_Heading]) -> list[_Raw]:
    raws: list[_Raw] = []
    if not headings or headings[0].first > 0:
        stop = headings[0].first if headings else len(doc)
        raws.append(_Raw(0, stop, (), bare=False))
    stack: list[tuple[int, str]] = []
    for k, heading in enumerate(headings):
        while stack and stack[-1][0] >= heading.level:
            stack.pop()
        stack.append((heading.level, heading.title))
        stop = headings[k + 1].first if k + 1 < len(headings) else len(doc)
        bare = all(doc.blank[heading.last + 1 : stop])
        raws.append(_Raw(heading.first, stop, tuple(t for _, t in stack), bare=bare))
    return raws


def _join_bare_headings(raws: Sequence[_Raw]) -> Iterator[_Raw]:
    """Join each section holding only its title to its first child."""
    first: int | None = None
    for k, raw in enumerate(raws):
        start = raw.first if first is None else first
        child = raws[k + 1].path if k + 1 < len(raws) else ()
        if (
            raw.bare
            and len(child) > len(raw.path)
            and child[: len(raw.path)] == raw.path
        ):
            first = start
            continue
        first = None
        yield replace(raw, first=start)


@dataclass(frozen=True, slots=True)
class _Block:
    """A span of text split only when it exceeds the budget; `kind` says how."""

    start: int
    end: int
    kind: str
    parts: tuple[_Block, ...] = ()


def _blocks(doc: _Doc, structure: _Structure, first: int, stop: int) -> list[_Block]:
    """The paragraphs and regions of lines `first`..`stop`, introductions glued."""
    region_at = {region.first: region for region in structure.regions}
    blocks: list[_Block] = []
    i = first
    while i < stop:
        if doc.blank[i]:
            i += 1
            continue
        region = region_at.get(i)
        if region is None:
            end = i
            while (
                end + 1 < stop and not doc.blank[end + 1] and end + 1 not in region_at
            ):
                end += 1
            blocks.append(_Block(doc.starts[i], doc.end_of(end), "paragraph"))
            i = end + 1
            continue
        last = min(region.last, stop - 1)
        block = _Block(doc.starts[i], doc.end_of(last), region.kind)
        intro = blocks[-1] if blocks else None
        # "Correct:" / "as in::" belongs with the code it introduces.
        if (
            intro is not None
            and intro.kind == "paragraph"
            and doc.text[intro.end - 1] == ":"
        ):
            block = _Block(intro.start, block.end, "group", (intro, block))
            blocks.pop()
        blocks.append(block)
        i = last + 1
    return blocks


_BLANK_LINES = re.compile(r"(?:\r\n|\r|\n)(?:[^\S\r\n]*(?:\r\n|\r|\n))+")
# Where each kind of piece is cut off from the next.
_SEPARATORS = {
    "paragraph": _BLANK_LINES,
    "chunk": _BLANK_LINES,
    "sentence": re.compile(r"[.;!?][\"'\u2019\u201d\u00bb)\]]*\s+"),
    "line": re.compile(r"\r\n|\r|\n"),
    "word": re.compile(r"\s+"),
}


def _split_at(
    text: str, start: int, end: int, separator: re.Pattern[str]
) -> list[tuple[int, int]]:
    """The spans between matches of `separator`, without trailing whitespace.

    Spans that are all whitespace are left out.
    """
    spans: list[tuple[int, int]] = []
    position = start
    for stop in [m.end() for m in separator.finditer(text, start, end)] + [end]:
        chunk = text[position:stop].rstrip()
        if chunk.strip():
            spans.append((position, position + len(chunk)))
        position = stop
    return spans


# How each kind of block is cut when it is over budget, coarsest first.
_REFINEMENTS: dict[str, tuple[str, ...]] = {
    "group": (),  # into its parts
    "prose": ("paragraph", "sentence", "word"),
    "paragraph": ("sentence", "word"),
    "sentence": ("word",),
    "literal": ("chunk", "line", "word"),
    "chunk": ("line", "word"),
    "line": ("word",),
    "word": (),
}


def _refine(text: str, block: _Block) -> Sequence[_Block]:
    if block.parts:
        return block.parts
    for kind in _REFINEMENTS[block.kind]:
        spans = _split_at(text, block.start, block.end, _SEPARATORS[kind])
        if len(spans) > 1:
            return [_Block(start, end, kind) for start, end in spans]
    return ()


def _leaves(
    text: str, block: _Block, fits: Callable[[int, int], bool]
) -> Iterator[_Block]:
    """The block, or its finest needed pieces when it does not fit the budget."""
    pieces = () if fits(block.start, block.end) else _refine(text, block)
    if not pieces:
        yield block
        return
    for piece in pieces:
        yield from _leaves(text, piece, fits)


def _budget_parts(
    doc: _Doc,
    structure: _Structure,
    raw: _Raw,
    fits: Callable[[int, int], bool],
    breaks: Sequence[int] = (),
) -> list[_Part]:
    """The section's span, cut into greedily packed parts that fit the budget.

    No part is packed across one of `breaks`.
    """
    blocks = _blocks(doc, structure, raw.first, raw.stop)
    if not blocks:
        return []
    if fits(blocks[0].start, blocks[-1].end):
        return [_Part(blocks[0].start, blocks[-1].end, raw.path)]
    spans: list[tuple[int, int]] = []
    start, end = blocks[0].start, blocks[0].start
    for block in blocks:
        for leaf in _leaves(doc.text, block, fits):
            # A break between the part so far and this piece: a bisect, not a scan.
            crossed = bisect_right(breaks, leaf.start) > bisect_right(breaks, end)
            if start == end or (fits(start, leaf.end) and not crossed):
                end = leaf.end
            else:
                spans.append((start, end))
                start, end = leaf.start, leaf.end
    spans.append((start, end))
    return [_Part(start, end, raw.path) for start, end in spans]


def _merge_tiny(
    text: str,
    parts: Sequence[_Part],
    fits: Callable[[int, int], bool],
    length_function: Callable[[str], int],
    breaks: Sequence[int] = (),
) -> list[_Part]:
    """Merge parts under `MIN_SECTION_TOKENS` into their previous sibling.

    Never across one of `breaks`: a tiny last page would otherwise join the page
    before, and an edit of either would send both again.
    """
    merged: list[_Part] = []
    for part in parts:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and previous.path[:-1] == part.path[:-1]
            and bisect_right(breaks, part.start) == bisect_right(breaks, previous.end)
            and length_function(text[part.start : part.end]) < MIN_SECTION_TOKENS
            and fits(previous.start, part.end)
        ):
            merged[-1] = replace(previous, end=part.end)
        else:
            merged.append(part)
    return merged
