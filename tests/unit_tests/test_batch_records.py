"""The batch lane's job records: their tables, and where they are kept.

Also the move of the previous version's cache keys into the tables. PostgreSQL's
tables are tested in `tests/integration_tests/test_batch_records_postgres.py`.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.stores import BaseStore, InMemoryStore

from langchain_tag.batch import _records
from langchain_tag.batch._records import (
    ANSWERS,
    RECORDS,
    JobRecord,
    JobRecords,
    job_records,
)
from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache

ENDPOINT = "https://api.example/v1/"


def _record(file_id: str, created: int = 100, **changes: Any) -> JobRecord:
    fields: dict[str, Any] = {
        "provider": "openai",
        "endpoint": ENDPOINT,
        "lane": "judge",
        "input_file_id": file_id,
        "custom_ids": [f"{file_id}-a", f"{file_id}-b"],
        "created": created,
    }
    return JobRecord(**{**fields, **changes})


def _legacy(record: JobRecord) -> str:
    """`record` as the previous version stored it, under a cache key."""
    return json.dumps(
        {
            "lane": record.lane,
            "endpoint": record.endpoint,
            "file_id": record.input_file_id,
            "batch_id": record.batch_id,
            "custom_ids": record.custom_ids,
            "created": record.created,
        }
    )


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name for (name,) in rows}


def _keys(path: Path, prefix: str = "tag-batch:") -> list[str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT key FROM verdicts ORDER BY key").fetchall()
    return [key for (key,) in rows if key.startswith(prefix)]


@pytest.fixture(params=["memory", "sqlite", "keyed"])
def records(request: pytest.FixtureRequest, tmp_path: Path) -> JobRecords:
    stores: dict[str, Callable[[], BaseStore[str, str]]] = {
        "memory": InMemoryVerdictCache,
        "sqlite": lambda: SQLiteVerdictCache(tmp_path / "cache.sqlite"),
        "keyed": InMemoryStore,  # a LangChain store the lane has no table in
    }
    return job_records(stores[request.param]())


# --- what every kind keeps ------------------------------------------------------------


def test_records_are_saved_replaced_and_listed_oldest_first(
    records: JobRecords,
) -> None:
    records.save(_record("file-2", created=200))
    records.save(_record("file-1", created=100))
    records.save(_record("file-x", endpoint="https://other.example/v1/"))
    records.save(_record("file-e", lane="execute"))
    records.save(_record("file-2", created=200, batch_id="batch_2", state="created"))
    listed = records.jobs("openai", ENDPOINT, "judge")
    assert [(r.input_file_id, r.batch_id, r.state) for r in listed] == [
        ("file-1", None, "uploaded"),
        ("file-2", "batch_2", "created"),
    ]
    assert listed[0].custom_ids == ["file-1-a", "file-1-b"]
    assert all(r.updated > 0 for r in listed)  # stamped when saved
    assert records.jobs("anthropic", ENDPOINT, "judge") == []
    stored = records.get(_record("file-2"))
    assert stored is not None
    assert stored.batch_id == "batch_2"
    assert records.get(_record("file-9")) is None


def test_a_state_change_never_brings_back_a_deleted_record(
    records: JobRecords,
) -> None:
    records.save(_record("file-1", batch_id="batch_1"))
    records.set_state(_record("file-1"), "in_progress")
    stored = records.get(_record("file-1"))
    assert stored is not None
    assert (stored.batch_id, stored.state) == ("batch_1", "in_progress")
    records.delete(_record("file-1"))
    records.set_state(_record("file-1"), "completed")  # another process collected it
    assert records.get(_record("file-1")) is None


def test_finishing_stores_the_answers_and_drops_the_record(
    records: JobRecords,
) -> None:
    record = _record("file-1", batch_id="batch_1")
    records.save(record)
    records.finish(record, {"b": '{"n": 2}', "a": '{"n": 1}'})
    assert records.jobs("openai", ENDPOINT, "judge") == []
    assert records.answers("openai", "judge", iter(["c", "a", "b"])) == {
        "a": '{"n": 1}',
        "b": '{"n": 2}',
    }
    assert list(records.answers("openai", "judge", ["b", "a"])) == ["b", "a"]
    assert records.answered("openai", "judge", ["a", "c"]) == {"a"}
    assert records.answered("openai", "execute", ["a"]) == set()  # another lane
    records.forget("openai", "judge", ["a"])
    assert records.answered("openai", "judge", ["a", "b"]) == {"b"}


def test_many_answers_are_read_in_pages(records: JobRecords) -> None:
    ids = [f"id-{i:04d}" for i in range(1_200)]  # past SQLite's 999 parameters
    records.finish(_record("file-1"), {i: i.upper() for i in ids})
    assert records.answers("openai", "judge", ids) == {i: i.upper() for i in ids}
    assert records.answered("openai", "judge", [*ids, "other"]) == set(ids)
    records.forget("openai", "judge", ids)
    assert records.answered("openai", "judge", ids) == set()


# --- where they are kept --------------------------------------------------------------


def test_an_sqlite_cache_s_records_are_tables_in_its_file_on_its_connections(
    tmp_path: Path,
) -> None:
    cache = SQLiteVerdictCache(tmp_path / "cache.sqlite")
    records = job_records(cache)
    assert job_records(cache) is records  # opened once per cache
    assert records._connections is cache._connections  # type: ignore[attr-defined]
    records.save(_record("file-1"))
    cache.mset([("verdict", "{}")])
    assert _tables(cache.path) == {"verdicts", "batch_jobs", "batch_job_answers"}
    assert list(cache.yield_keys()) == ["verdict"]  # no record among the verdicts
    # Another process (another cache object on the file) sees the record.
    again = job_records(SQLiteVerdictCache(cache.path))
    assert [r.input_file_id for r in again.jobs("openai", ENDPOINT, "judge")] == [
        "file-1"
    ]


def test_an_in_memory_cache_s_records_and_answers_are_never_evicted() -> None:
    cache = InMemoryVerdictCache(maxsize=1)
    records = job_records(cache)
    assert job_records(cache) is records
    assert job_records(InMemoryVerdictCache()) is not records
    records.save(_record("file-1"))
    records.finish(_record("file-2"), {"a": "1", "b": "2"})
    cache.mset([("x", "1"), ("y", "2")])  # the cache evicts x
    assert len(cache) == 1
    assert [r.input_file_id for r in records.jobs("openai", ENDPOINT, "judge")] == [
        "file-1"
    ]
    assert records.answered("openai", "judge", ["a", "b"]) == {"a", "b"}


def test_another_store_keeps_them_under_the_previous_version_s_keys() -> None:
    store = InMemoryStore()
    records = job_records(store)
    records.save(_record("file-1"))
    records.finish(_record("file-2"), {"a": "1"})
    assert sorted(store.yield_keys()) == [
        f"{ANSWERS}judge:a",
        f"{RECORDS}judge:file-1",
    ]
    # And reads records that version wrote there.
    store.mset([(f"{RECORDS}judge:file-0", _legacy(_record("file-0", created=1)))])
    listed = records.jobs("openai", ENDPOINT, "judge")
    assert [(r.input_file_id, r.state) for r in listed] == [
        ("file-0", "uploaded"),
        ("file-1", "uploaded"),
    ]


def test_a_cache_table_named_as_a_batch_table_is_refused(tmp_path: Path) -> None:
    cache = SQLiteVerdictCache(tmp_path / "cache.sqlite", table="batch_job_answers")
    with pytest.raises(ValueError, match="give the cache another table name"):
        job_records(cache)


# --- the previous version's keys ------------------------------------------------------


def _previous_version(path: Path) -> None:
    """A cache as the previous version left it: records and answers as keys."""
    cache = SQLiteVerdictCache(path)
    waiting = _record("file-1", batch_id="batch_1")
    cache.mset(
        [
            ("verdict-key", '{"applies": true}'),
            (f"{RECORDS}judge:file-1", _legacy(waiting)),
            (f"{RECORDS}judge:file-2", _legacy(_record("file-2", created=200))),
            (f"{RECORDS}execute:file-3", "not json"),
            (f"{ANSWERS}judge:a:b", '{"answer": 1}'),
            (f"{ANSWERS}execute:h", '{"answer": 2}'),
        ]
    )


def test_the_previous_version_s_keys_move_into_the_tables_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cache.sqlite"
    _previous_version(path)
    with caplog.at_level(logging.WARNING):
        records = job_records(SQLiteVerdictCache(path))
    listed = records.jobs("openai", ENDPOINT, "judge")
    assert [(r.input_file_id, r.batch_id, r.state) for r in listed] == [
        ("file-1", "batch_1", "created"),
        ("file-2", None, "uploaded"),
    ]
    assert listed[0].custom_ids == ["file-1-a", "file-1-b"]
    assert records.answers("openai", "judge", ["a:b"]) == {"a:b": '{"answer": 1}'}
    assert records.answers("openai", "execute", ["h"]) == {"h": '{"answer": 2}'}
    # The unreadable record is left where it was, and said so; verdicts untouched.
    assert _keys(path) == [f"{RECORDS}execute:file-3"]
    assert "unreadable" in caplog.text
    cache = SQLiteVerdictCache(path)
    assert cache.mget(["verdict-key"]) == ['{"applies": true}']
    # Opened again (another process): nothing moved twice, nothing overwritten.
    records.set_state(listed[0], "in_progress")
    again = job_records(cache)
    assert [r.state for r in again.jobs("openai", ENDPOINT, "judge")] == [
        "in_progress",
        "uploaded",
    ]


def test_a_move_that_fails_midway_leaves_everything_where_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cache.sqlite"
    _previous_version(path)
    before = _keys(path)

    def killed(*_: Any) -> bool:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(_records._TableJobRecords, "_moved_answer", killed)
        with pytest.raises(KeyboardInterrupt):
            job_records(SQLiteVerdictCache(path))
    assert _keys(path) == before
    assert _tables(path) == {"verdicts"}  # the tables' creation rolled back too
    records = job_records(SQLiteVerdictCache(path))
    assert len(records.jobs("openai", ENDPOINT, "judge")) == 2
    assert _keys(path) == [f"{RECORDS}execute:file-3"]
