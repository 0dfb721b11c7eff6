"""What the PostgreSQL tests share: the server `bash scripts/postgres` starts."""

from __future__ import annotations

import os

import pytest

URI_VARIABLE = "TAG_TEST_POSTGRES_URI"


@pytest.fixture(scope="module")
def uri() -> str:
    """The server's URI; skips the module when there is none to reach."""
    found = os.environ.get(URI_VARIABLE)
    if not found:
        pytest.skip(f"{URI_VARIABLE} is not set (`bash scripts/postgres start`)")
    import psycopg  # noqa: PLC0415 - the postgres extra, for these tests only

    try:
        psycopg.connect(found, connect_timeout=5).close()
    except psycopg.Error as error:
        pytest.skip(f"PostgreSQL at {URI_VARIABLE} is unreachable: {error}")
    return found
