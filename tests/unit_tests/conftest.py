"""Unit tests run with network sockets disabled (Unix sockets stay, for asyncio)."""

from __future__ import annotations

import pytest
from pytest_socket import disable_socket


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Disable internet sockets before every unit test."""
    disable_socket(allow_unix_socket=True)
