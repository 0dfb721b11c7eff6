"""The verdict cache on a real PostgreSQL server, as several machines would share it.

Needs a PostgreSQL server: set `TAG_TEST_POSTGRES_URI` (`scripts/postgres start`
prints it for a throwaway local one); the tests skip when it is unset or
unreachable. Each test writes a table of its own name and drops it. A "machine"
here is a thread with its own `PostgresVerdictCache` (its own pool of connections).
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from langchain_tag.cache import PostgresVerdictCache, open_verdict_cache
from langchain_tag.matching import ApplicabilityJudge, Verdict
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

pytestmark = pytest.mark.postgres


@pytest.fixture
def table(uri: str) -> Iterator[str]:
    """A table name no other run uses; the table is dropped afterwards."""
    name = f"test_cache_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def machine(uri: str, table: str) -> Iterator[Callable[..., PostgresVerdictCache]]:
    """Opens a cache on the shared table, as one machine would; all closed after."""
    opened: list[PostgresVerdictCache] = []

    def open_cache(conninfo: str | None = None, **kwargs: Any) -> PostgresVerdictCache:
        cache = PostgresVerdictCache(conninfo or uri, table=table, **kwargs)
        opened.append(cache)
        return cache

    yield open_cache
    for cache in opened:
        cache.close()


def test_a_pair_judged_on_one_machine_is_not_paid_for_on_another(
    machine: Callable[..., PostgresVerdictCache],
) -> None:
    rules = trigger_rulebook(6).rules
    texts = [f"input {i} names trigger-{i % 6:03d} and more" for i in range(24)]
    shards = [texts[0::2], texts[1::2]]  # `--shard 1/2` and `--shard 2/2`
    models = [RuleAwareFakeChatModel(), RuleAwareFakeChatModel()]
    judges = [ApplicabilityJudge(llm=llm, cache=machine()) for llm in models]
    start = threading.Barrier(2)

    def run(judge: ApplicabilityJudge, shard: list[str]) -> list[list[Verdict]]:
        start.wait()  # both machines judge at the same time
        return [judge.judge_rules(text, rules) for text in shard]

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = list(pool.map(run, judges, shards))
        assert [llm.calls for llm in models] == [12 * 6, 12 * 6]
        # Each machine now judges the other's shard: every pair is in the cache.
        again = list(pool.map(run, judges, reversed(shards)))
    assert [llm.calls for llm in models] == [12 * 6, 12 * 6]
    assert [[v.applies for v in text] for text in again[0]] == [
        [v.applies for v in text] for text in first[1]
    ]
    assert all(v.cached for shard in again for text in shard for v in text)
    assert sum(v.applies for shard in first for text in shard for v in text) == 24


async def test_keys_by_prefix_across_pages_and_machines(
    machine: Callable[..., PostgresVerdictCache],
) -> None:
    writer, reader = machine(), machine()
    batches = [f"batch:{i:05d}" for i in range(2100)]  # three pages of keys
    writer.mset([(key, "pending") for key in batches])
    writer.mset([("verdict:a", "{}"), ("batch_x", "not a batch"), ("batch%", "no")])
    assert list(reader.yield_keys(prefix="batch:")) == batches
    assert list(reader.yield_keys(prefix="batch%")) == ["batch%"]  # literal %
    assert list(reader.yield_keys(prefix="batch_")) == ["batch_x"]  # literal _
    assert len(list(reader.yield_keys())) == len(reader) == 2103
    # BaseStore's async methods run the sync ones in a worker thread.
    await reader.amset([("verdict:b", "{}")])
    assert await writer.amget(["verdict:b", "verdict:c"]) == ["{}", None]
    assert [k async for k in writer.ayield_keys(prefix="verdict:")] == [
        "verdict:a",
        "verdict:b",
    ]
    await writer.amdelete(batches)
    assert list(reader.yield_keys(prefix="batch:")) == []


def test_concurrent_writers_of_the_same_keys_neither_fail_nor_deadlock(
    machine: Callable[..., PostgresVerdictCache],
) -> None:
    keys = [f"k{i:03d}" for i in range(200)]
    caches = [machine(), machine()]
    start = threading.Barrier(8)

    def write(writer: int) -> None:
        cache = caches[writer % 2]
        shuffled = random.Random(writer)  # noqa: S311 - an order, not a secret
        start.wait()
        for round_ in range(15):
            order = shuffled.sample(keys, len(keys))
            # A key twice in one call: its last value is kept.
            pairs = [(key, f"stale {writer}") for key in order[:5]]
            cache.mset([*pairs, *((key, f"{writer}.{round_}") for key in order)])

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(write, range(8)))
    values = caches[0].mget(keys)
    assert len(caches[1]) == 200
    assert all(value is not None and value.endswith(".14") for value in values)


def test_read_only_cache_reads_and_the_server_refuses_its_writes(
    uri: str, machine: Callable[..., PostgresVerdictCache]
) -> None:
    machine().mset([("k", "v")])
    reading = machine(read_only=True)
    assert reading.mget(["k"]) == ["v"]
    with pytest.raises(PermissionError, match="read-only"):
        reading.mset([("k", "w")])
    # Past the cache's own check, the session itself refuses.
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        reading._connections.run(
            lambda conn: conn.execute(f"DELETE FROM {reading.table}")  # noqa: S608
        )
    opened = open_verdict_cache(uri, table=reading.table)
    assert isinstance(opened, PostgresVerdictCache)
    assert opened.mget(["k"]) == ["v"]
    opened.close()


def test_connections_the_server_dropped_are_replaced(
    uri: str, machine: Callable[..., PostgresVerdictCache]
) -> None:
    name = f"tag-cache-{uuid.uuid4().hex[:8]}"
    cache = machine(conninfo=make_conninfo(uri, application_name=name), max_size=4)
    cache.mset([("k", "v")])
    with psycopg.connect(uri, autocommit=True) as admin:
        (killed,) = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (name,),
        ).fetchone() or (0,)
    assert killed >= 1
    assert cache.mget(["k"]) == ["v"]
    cache.mset([("k", "w")])
    assert cache.mget(["k"]) == ["w"]
