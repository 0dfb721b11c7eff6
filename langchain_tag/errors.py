"""The base of every exception langchain-tag raises: `except TAGError` catches them.

Each error keeps the builtin base it always had (`RulebookError` is still a
`ValueError`, `JudgmentError` a `RuntimeError`), so existing handlers keep working.
"""

from __future__ import annotations

__all__ = [
    "MissingVerdictLogError",
    "StoreLocationError",
    "TAGError",
    "VerdictLogWarning",
]


class TAGError(Exception):
    """Base class of the exceptions defined by langchain-tag."""


class StoreLocationError(TAGError, ValueError):
    """A store cannot be opened where it was asked for.

    A path that is a directory or cannot be written, a file that is not a database,
    a server that cannot be reached, or (read-only) a table that is not there.
    """


class MissingVerdictLogError(TAGError, LookupError):
    """A log opened read-only is not there: no such file, or not the log's tables."""


class VerdictLogWarning(UserWarning):
    """The verdict log could not be written; its records are kept in memory."""
