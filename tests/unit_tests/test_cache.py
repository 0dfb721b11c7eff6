"""Verdict caches: `BaseStore`s, bounded in memory, persistent and shared in SQLite."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from langchain_core.stores import BaseStore

from langchain_tag.cache import (
    InMemoryVerdictCache,
    SQLiteConnections,
    SQLiteVerdictCache,
)


def test_in_memory_cache_evicts_least_recently_used() -> None:
    cache = InMemoryVerdictCache(maxsize=3)
    cache.mset([(key, key.upper()) for key in "abc"])
    assert cache.mget(["a"]) == ["A"]  # now most recent
    cache.mset([("d", "D")])
    assert cache.mget(["b"]) == [None]
    assert cache.mget(list("acd")) == ["A", "C", "D"]
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(ValueError, match="at least 1"):
        InMemoryVerdictCache(maxsize=0)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_caches_are_langchain_stores(tmp_path: Path, kind: str) -> None:
    cache: BaseStore[str, str] = (
        InMemoryVerdictCache()
        if kind == "memory"
        else SQLiteVerdictCache(tmp_path / "c")
    )
    assert isinstance(cache, BaseStore)
    await cache.amset([("k", '{"x": 1}'), ("k2", "v2"), ("other", "o")])
    assert await cache.amget(["k", "missing", "k2"]) == ['{"x": 1}', None, "v2"]
    assert cache.mget(["k"]) == ['{"x": 1}']
    assert sorted(cache.yield_keys()) == ["k", "k2", "other"]
    assert sorted(cache.yield_keys(prefix="k")) == ["k", "k2"]
    cache.mdelete(["k", "missing"])
    await cache.amdelete(["other"])
    assert cache.mget(["k", "k2", "other"]) == [None, "v2", None]
    assert cache.mget([]) == []
    cache.mset([])


def test_sqlite_cache_reads_many_keys_at_once(tmp_path: Path) -> None:
    cache = SQLiteVerdictCache(tmp_path / "many.sqlite")
    cache.mset([(str(i), str(i)) for i in range(1500)])
    keys = [str(i) for i in range(1600)]
    assert cache.mget(keys) == [str(i) for i in range(1500)] + [None] * 100


def test_sqlite_cache_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "verdicts.sqlite"
    SQLiteVerdictCache(path).mset([("k", "v")])
    reopened = SQLiteVerdictCache(path)
    assert reopened.mget(["k"]) == ["v"]
    reopened.mset([("k", "w")])
    assert len(reopened) == 1
    assert SQLiteVerdictCache(path).mget(["k"]) == ["w"]


def test_sqlite_cache_from_many_threads(tmp_path: Path) -> None:
    cache = SQLiteVerdictCache(tmp_path / "threads.sqlite")

    def write(worker: int) -> None:
        for i in range(50):
            cache.mset([(f"{worker}-{i}", str(i))])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 400
    assert cache.mget(["7-49"]) == ["49"]


def test_sqlite_cache_from_several_processes(tmp_path: Path) -> None:
    path = tmp_path / "processes.sqlite"
    writer = textwrap.dedent(
        """
        import sys
        from langchain_tag.cache import SQLiteVerdictCache
        cache = SQLiteVerdictCache(sys.argv[1])
        for i in range(100):
            cache.mset([(f"{sys.argv[2]}-{i}", str(i))])
        """
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", writer, str(path), str(n)])  # noqa: S603
        for n in range(3)
    ]
    assert [p.wait(timeout=60) for p in processes] == [0, 0, 0]
    cache = SQLiteVerdictCache(path)
    assert len(cache) == 300
    assert cache.mget([f"{n}-99" for n in range(3)]) == ["99"] * 3


def test_read_only_connections_change_nothing_and_refuse_writes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "odd?name#.sqlite"  # URI characters in the name are literal
    cache = SQLiteVerdictCache(path)
    cache.mset([("k", "v")])
    before = path.read_bytes()
    reading = SQLiteConnections(path, read_only=True)
    assert reading.get().execute("SELECT count(*) FROM verdicts").fetchone() == (1,)
    with pytest.raises(PermissionError, match="read-only"), reading.writing():
        pass
    reading.close()
    assert path.read_bytes() == before
    missing = SQLiteConnections(tmp_path / "new" / "x.sqlite", read_only=True)
    assert not (tmp_path / "new").exists()  # no directory made
    with pytest.raises(sqlite3.OperationalError):
        missing.get()
