"""Verdict caches: bounded in memory, persistent and shared in SQLite."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache


def test_in_memory_cache_evicts_least_recently_used() -> None:
    cache = InMemoryVerdictCache(maxsize=3)
    for key in "abc":
        cache.update(key, key.upper())
    assert cache.lookup("a") == "A"  # now most recent
    cache.update("d", "D")
    assert cache.lookup("b") is None
    assert [cache.lookup(k) for k in "acd"] == ["A", "C", "D"]
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(ValueError, match="at least 1"):
        InMemoryVerdictCache(maxsize=0)


async def test_async_access_matches_sync(tmp_path: Path) -> None:
    for cache in (InMemoryVerdictCache(), SQLiteVerdictCache(tmp_path / "c.sqlite")):
        await cache.aupdate("k", '{"x": 1}')
        assert await cache.alookup("k") == '{"x": 1}'
        assert cache.lookup("k") == '{"x": 1}'
        assert await cache.alookup("missing") is None


def test_sqlite_cache_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "verdicts.sqlite"
    SQLiteVerdictCache(path).update("k", "v")
    reopened = SQLiteVerdictCache(path)
    assert reopened.lookup("k") == "v"
    reopened.update("k", "w")
    assert len(reopened) == 1
    assert SQLiteVerdictCache(path).lookup("k") == "w"


def test_sqlite_cache_from_many_threads(tmp_path: Path) -> None:
    cache = SQLiteVerdictCache(tmp_path / "threads.sqlite")

    def write(worker: int) -> None:
        for i in range(50):
            cache.update(f"{worker}-{i}", str(i))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 400
    assert cache.lookup("7-49") == "49"


def test_sqlite_cache_from_several_processes(tmp_path: Path) -> None:
    path = tmp_path / "processes.sqlite"
    writer = textwrap.dedent(
        """
        import sys
        from langchain_tag.cache import SQLiteVerdictCache
        cache = SQLiteVerdictCache(sys.argv[1])
        for i in range(100):
            cache.update(f"{sys.argv[2]}-{i}", str(i))
        """
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", writer, str(path), str(n)])  # noqa: S603
        for n in range(3)
    ]
    assert [p.wait(timeout=60) for p in processes] == [0, 0, 0]
    cache = SQLiteVerdictCache(path)
    assert len(cache) == 300
    assert all(cache.lookup(f"{n}-99") == "99" for n in range(3))
