"""A PostgreSQL checkpointer for a self-hosted LangGraph server (`langgraph dev`).

Name it in the server's langgraph.json to keep every thread's checkpoints in
PostgreSQL instead of the server's own files:

    "checkpointer": {"path": "./graphs/checkpointer.py:postgres_checkpointer"}

The database is `TAG_POSTGRES_URI` (`postgresql://user:password@host:5432/db`); the
tables are created on first use. Needs `langgraph-checkpoint-postgres` and
`psycopg[binary,pool]`. LangGraph Platform and `langgraph up` bring their own
PostgreSQL checkpointer and do not need this.
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from langchain_tag.query_graph import checkpoint_serializer

URI_VARIABLE = "TAG_POSTGRES_URI"
POOL_SIZE = 10
"""Connections at most: concurrent runs share them instead of queueing on one."""


@asynccontextmanager
async def postgres_checkpointer() -> AsyncIterator[AsyncPostgresSaver]:
    """An `AsyncPostgresSaver` on a connection pool, for the server's lifetime.

    Raises:
        RuntimeError: `TAG_POSTGRES_URI` is not set.
    """
    uri = os.environ.get(URI_VARIABLE)
    if not uri:
        msg = (
            f"{URI_VARIABLE} is not set: the langgraph.json checkpointer "
            "graphs/checkpointer.py:postgres_checkpointer needs the PostgreSQL "
            "URI, e.g. postgresql://user:password@host:5432/db"
        )
        raise RuntimeError(msg)
    # The settings the saver expects of its connections (as from_conn_string sets).
    connection = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(
        uri,
        connection_class=AsyncConnection[DictRow],
        max_size=POOL_SIZE,
        kwargs=connection,
        open=False,
    ) as pool:
        saver = AsyncPostgresSaver(pool, serde=checkpoint_serializer())
        await saver.setup()
        yield saver
