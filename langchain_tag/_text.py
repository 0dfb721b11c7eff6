"""Small text helpers shared by every stage: digests, slugs, batches, model answers."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

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


def describe_error(error: BaseException) -> str:
    """`Type: message`, or the type alone when the message is empty."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


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
