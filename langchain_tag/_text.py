"""Small text helpers shared by every stage: digests, slugs, batches, model answers.

`read_text` is the one reader of the text a user gives `tag` (documents, rulebooks,
labelled inputs, standard input): one behaviour, one message naming the file.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from langchain_tag.errors import TextEncodingError

_T = TypeVar("_T")

_THINKING = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL | re.IGNORECASE)
_CLOSING_THINKING = re.compile(r"</think(?:ing)?>", re.IGNORECASE)
_DECODER = json.JSONDecoder()


@functools.lru_cache(maxsize=64)
def digest(text: str) -> str:
    """SHA-256 of `text` as hex; cached, as one input is keyed against every rule."""
    return hashlib.sha256(text.encode()).hexdigest()


def check_text(text: object, what: str) -> str:
    """`text` if it is a str that can be encoded, else a clear error.

    Raises:
        TypeError: `text` is not a str.
        ValueError: `text` holds a lone surrogate (text decoded with
            `errors="surrogateescape"`, or cut inside a surrogate pair), which no
            model API and no hash accepts.
    """
    if not isinstance(text, str):
        msg = f"{what} must be a str, got {type(text).__name__}."
        raise TypeError(msg)
    bad = _lone_surrogate(text)
    if bad is not None:
        msg = (
            f"{what} holds a lone surrogate {text[bad]!r} at position {bad}, which "
            "is not valid Unicode text. Decode the source with errors='replace', or "
            "clean it with text.encode('utf-8', 'replace').decode('utf-8')."
        )
        raise ValueError(msg)
    return text


@functools.lru_cache(maxsize=64)
def _lone_surrogate(text: str) -> int | None:
    # Cached: one input is checked once for all the rules judged against it.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def slug(text: str, default: str, max_length: int | None = None) -> str:
    """Lower-case words joined by hyphens (`default` when none are left)."""
    words = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return words[:max_length] or default


def batches(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    """Consecutive slices of at most `size` items."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def strip_thinking(text: str) -> str:
    """`text` without reasoning blocks (`<think>...</think>`, `<thinking>...`)."""
    return _THINKING.sub("", text)


def end_of_thinking(text: str) -> int:
    """Where the last reasoning block of `text` ends (0 when there is none)."""
    closing = list(_CLOSING_THINKING.finditer(text))
    return closing[-1].end() if closing else 0


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Every JSON object that starts at a `{` of `text`, in order (nested ones too).

    Models wrap the JSON they were asked for in prose, code fences or reasoning;
    reasoning blocks are dropped first.
    """
    cleaned = strip_thinking(text)
    start = cleaned.find("{")
    while start != -1:
        try:
            value = _DECODER.raw_decode(cleaned, start)[0]
        except ValueError:
            value = None
        if isinstance(value, dict):
            yield value
        start = cleaned.find("{", start + 1)


def first_json_object(text: str, key: str | None = None) -> dict[str, Any] | None:
    """The first JSON object in `text` (having `key`, if given), or None."""
    return next((o for o in json_objects(text) if key is None or key in o), None)


def answer_text(message: object) -> str:
    """A model answer's text, or its tool calls' arguments as JSON when it has none.

    Structured output through tool calling leaves the text empty; the arguments
    are what a text parser can still read.
    """
    if message is None:
        return ""
    text = getattr(message, "text", None)
    if not isinstance(text, str):
        return str(message)
    calls = getattr(message, "tool_calls", None)
    if text.strip() or not isinstance(calls, list) or not calls:
        return text
    return json.dumps([call.get("args") for call in calls])


# --- a user's text files -----------------------------------------------------------
# UTF-8 (with or without the byte-order mark some editors write) and UTF-16 with its
# mark are read. Anything else is refused, never guessed: Latin-1 decodes any bytes,
# so a guess would turn a wrong encoding into silently wrong text. Unmarked UTF-16
# needs a check of its own: mostly-ASCII UTF-16 is valid UTF-8, a NUL every other
# byte.

STANDARD_INPUT = "standard input"
"""How `read_text` names a stream it is not told the name of."""

_BOMS = (
    # UTF-32 first: its little-endian mark starts with UTF-16's.
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)
_WIDE_SAMPLE = 4096
_WIDE_SHARE = 0.4
"""Share of NUL bytes on one side of the byte pairs that marks UTF-16 text."""
_SAVE_AS_UTF8 = (
    "Only UTF-8 (or UTF-16 with a byte-order mark) is read: save it as UTF-8"
)


def wide_encoding(raw: bytes) -> str | None:
    """The UTF-16 or UTF-32 encoding `raw` is in, as `iconv -f` names it, or None.

    Judged by a byte-order mark ("UTF-16", "UTF-32"), or, without one, by NUL
    bytes falling on one side of the byte pairs, as in UTF-16 text that is mostly
    ASCII ("UTF-16LE", "UTF-16BE").
    """
    for bom, name in _BOMS:
        if raw.startswith(bom):
            return name
    sample = raw[:_WIDE_SAMPLE]
    pairs = len(sample) // 2
    if pairs == 0 or b"\x00" not in sample:
        return None
    odd = sample[1::2].count(0) / pairs
    even = sample[0::2].count(0) / pairs
    if odd >= _WIDE_SHARE and even < _WIDE_SHARE:
        return "UTF-16LE"
    if even >= _WIDE_SHARE and odd < _WIDE_SHARE:
        return "UTF-16BE"
    return None


def read_text(
    source: str | os.PathLike[str] | IO[bytes], *, what: str | None = None
) -> str:
    """The text of a user's file or byte stream, or an error saying what to do.

    Accepts UTF-8, with or without a byte-order mark, and UTF-16 with its mark;
    the mark is not part of the text. Line endings are left as they are.

    Args:
        source: A file path, or a binary stream (`sys.stdin.buffer`).
        what: How errors name it; default the path, or "standard input".

    Raises:
        TextEncodingError: Another encoding (Latin-1, unmarked UTF-16, UTF-32),
            or binary data (NUL bytes): the message names the file, the offset
            and line of the first bad byte, and says to save it as UTF-8.
        OSError: The file cannot be read; callers word that themselves.
    """
    if isinstance(source, (str, os.PathLike)):
        return decode_text(Path(source).read_bytes(), what=what or os.fspath(source))
    return decode_text(source.read(), what=what or STANDARD_INPUT)


def json_lines(text: str) -> list[str]:
    """The lines of JSON-lines text: split at newlines only (a CR before one dropped).

    Not `str.splitlines`, which also splits at U+2028, U+2029, U+0085 and other
    characters that `json.dumps(ensure_ascii=False)` writes raw inside strings.
    """
    return [line.removesuffix("\r") for line in text.split("\n")]


def decode_text(raw: bytes, *, what: str) -> str:
    """`read_text` for bytes already read; `what` names them in errors.

    Raises:
        TextEncodingError: See `read_text`.
    """
    wide = wide_encoding(raw)
    if wide not in {None, "UTF-16"}:
        raise TextEncodingError(
            what,
            f"is {wide} text, not UTF-8.",
            f"Convert it first, e.g. `iconv -f {wide} -t UTF-8`, or save it as UTF-8 "
            "from its editor.",
        )
    encoding = "utf-16" if wide else "utf-8-sig"  # both drop the byte-order mark
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as error:
        line = raw[: error.start].decode(encoding, "replace").count("\n") + 1
        raise TextEncodingError(
            what,
            f"is not {wide or 'UTF-8'} text (byte 0x{raw[error.start]:02x} at offset "
            f"{error.start}, line {line}).",
            f"{_SAVE_AS_UTF8}, e.g. `iconv -f latin1 -t UTF-8` if it is Latin-1.",
        ) from None
    if "\x00" in text:
        # A NUL is no character of any text a user writes: binary data.
        before = text[: text.index("\x00")]
        offset = 2 + len(before.encode("utf-16-le")) if wide else raw.index(0)
        raise TextEncodingError(
            what,
            f"contains NUL bytes (at offset {offset}), so it is not a text file.",
            f"{_SAVE_AS_UTF8}; for a PDF or a word-processor file, take its text "
            "first (e.g. with a LangChain document loader).",
        )
    return text
