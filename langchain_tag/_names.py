"""Options given by name: a table's entry, or the object itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

_NamedT = TypeVar("_NamedT")


def named(value: str | _NamedT, table: Mapping[str, _NamedT], kind: str) -> _NamedT:
    """`value` itself, or the entry of `table` it names.

    Raises:
        ValueError: A name not in `table` (the message lists the names).
    """
    if not isinstance(value, str):
        return value
    if value not in table:
        msg = f"Unknown {kind} {value!r}; choose from {sorted(table)}."
        raise ValueError(msg)
    return table[value]
