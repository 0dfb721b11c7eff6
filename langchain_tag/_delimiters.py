"""Delimiting untrusted text inside prompts, for every stage.

Each data block is delimited by a tag carrying a digest of its own content, such as
<input-3f9a...>. Text cannot contain the closing tag of the block it sits in (that
would need a digest of itself), so no input or rule text can end its block early.
"""

from __future__ import annotations

import functools
import re

from langchain_tag._text import digest

_DELIMITER = re.compile(r"<\s*/?\s*(?:input|rule|section)\b[^<>]{0,80}>", re.IGNORECASE)
CHAT_TEMPLATE_TOKENS = re.compile(
    r"<\|(?:im_start|im_end|system|user|assistant|endoftext|eot_id|start_header_id|"
    r"end_header_id|begin_of_text)\|>|\[/?INST\]|<</?SYS>>|<(?:start|end)_of_turn>"
)
"""Special tokens of common chat templates (ChatML, Llama 2 and 3, Gemma). A server
that tokenizes prompts with special tokens enabled reads these as turn boundaries,
in data too, so data has them escaped."""
_ENTITIES = str.maketrans({"<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;"})


def data_tag(name: str, text: str) -> str:
    """The delimiter tag name of a data block holding `text`, e.g. `input-3f9a...`.

    It carries 64 bits of the text's SHA-256: deterministic (prompts and provider
    prefix caches stay stable) and impossible for the text to contain.
    """
    return f"{name}-{digest(text)[:16]}"


@functools.lru_cache(maxsize=64)
def escape_delimiters(text: str) -> str:
    """Neutralise delimiter tags and chat-template special tokens in untrusted text.

    Tags named like our blocks (`</input>`, `< /rule >`, `<section id=1>`) and
    special tokens such as `<|im_start|>` or `[INST]` get their brackets written as
    HTML entities, so they neither close a block nor start a turn. Cached: one input
    is escaped once for all M rules judged against it.
    """
    for pattern in (_DELIMITER, CHAT_TEMPLATE_TOKENS):
        text = pattern.sub(lambda found: found.group(0).translate(_ENTITIES), text)
    return text
