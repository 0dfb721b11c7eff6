"""The base of every exception langchain-tag raises: `except TAGError` catches them.

Each error keeps the builtin base it always had (`RulebookError` is still a
`ValueError`, `JudgmentError` a `RuntimeError`), so existing handlers keep working.
"""

from __future__ import annotations

__all__ = ["TAGError"]


class TAGError(Exception):
    """Base class of the exceptions defined by langchain-tag."""
