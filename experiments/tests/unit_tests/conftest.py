"""Unit tests run with network sockets disabled, as the library's do."""

from tests.unit_tests.conftest import (
    HANG_GUARD,
    clock,
    held_llm,
    loopback,
    overlapping,
    overlapping_llm,
    pytest_runtest_setup,
)

__all__ = [
    "HANG_GUARD",
    "clock",
    "held_llm",
    "loopback",
    "overlapping",
    "overlapping_llm",
    "pytest_runtest_setup",
]
