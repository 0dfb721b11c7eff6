"""The base of every exception langchain-tag raises: `except TAGError` catches them.

Each error keeps the builtin base it always had (`RulebookError` is still a
`ValueError`, `JudgmentError` a `RuntimeError`), so existing handlers keep working.
"""

from __future__ import annotations

__all__ = ["StoreLocationError", "TAGError"]


class TAGError(Exception):
    """Base class of the exceptions defined by langchain-tag."""


class StoreLocationError(TAGError, ValueError):
    """A store cannot be opened where it was asked for.

    A path that is a directory or cannot be written, a file that is not a database,
    a server that cannot be reached, or (read-only) a table that is not there.
    """
