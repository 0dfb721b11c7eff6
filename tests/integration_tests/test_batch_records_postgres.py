"""The batch lane's job records in PostgreSQL, beside a `PostgresVerdictCache`.

Needs a PostgreSQL server: set `TAG_TEST_POSTGRES_URI` (`scripts/postgres start`);
the tests skip when it is unset or unreachable. Each test works in a schema of its
own (the lane's tables have fixed names), dropped afterwards.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from langchain_openai import ChatOpenAI
from psycopg.conninfo import make_conninfo

from langchain_tag import Rule
from langchain_tag.batch import BatchSettings, judge_in_batch
from langchain_tag.batch._records import ANSWERS, RECORDS, JobRecord, job_records
from langchain_tag.cache import PostgresVerdictCache
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.testing import (
    BatchScript,
    FakeBatchServer,
    FakeClock,
    RuleAwareFakeChatModel,
)

pytestmark = pytest.mark.postgres

ENDPOINT = "https://api.example/v1/"


@pytest.fixture
def schema(uri: str) -> Iterator[str]:
    """A connection string whose tables go in a new schema, dropped afterwards."""
    name = f"test_batch_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    yield make_conninfo(uri, options=f"-c search_path={name}")
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
def machine(schema: str) -> Iterator[Any]:
    """Opens a verdict cache in the schema, as one machine would; all closed after."""
    opened: list[PostgresVerdictCache] = []

    def open_cache() -> PostgresVerdictCache:
        cache = PostgresVerdictCache(schema)
        opened.append(cache)
        return cache

    yield open_cache
    for cache in opened:
        cache.close()


def _record(file_id: str, created: int = 100, **changes: Any) -> JobRecord:
    fields: dict[str, Any] = {
        "provider": "openai",
        "endpoint": ENDPOINT,
        "lane": "judge",
        "input_file_id": file_id,
        "custom_ids": [f"{file_id}-a"],
        "created": created,
    }
    return JobRecord(**{**fields, **changes})


def _tables(schema: str) -> set[str]:
    with psycopg.connect(schema) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema()"
        )
        return {name for (name,) in rows}


def test_records_and_answers_live_in_tables_of_the_cache_s_database(
    machine: Any, schema: str
) -> None:
    cache = machine()
    records = job_records(cache)
    assert job_records(cache) is records
    assert records._connections is cache._connections  # type: ignore[attr-defined]
    assert _tables(schema) == {
        "tag_verdicts",
        "tag_batch_jobs",
        "tag_batch_job_answers",
    }
    records.save(_record("file-2", created=200))
    records.save(_record("file-1"))
    records.save(_record("file-2", created=200, batch_id="batch_2", state="created"))
    other = job_records(machine())  # another machine
    listed = other.jobs("openai", ENDPOINT, "judge")
    assert [(r.input_file_id, r.batch_id) for r in listed] == [
        ("file-1", None),
        ("file-2", "batch_2"),
    ]
    other.set_state(listed[1], "in_progress")
    stored = records.get(listed[1])
    assert stored is not None
    assert stored.state == "in_progress"
    records.finish(listed[1], {"b": "2", "a": "1"})
    other.set_state(listed[1], "completed")  # collected meanwhile: not brought back
    assert records.get(listed[1]) is None
    ids = [f"id-{i:04d}" for i in range(1_200)]
    records.finish(listed[0], {i: i.upper() for i in ids})
    assert other.jobs("openai", ENDPOINT, "judge") == []
    assert list(other.answers("openai", "judge", ["b", "a", "c"]).items()) == [
        ("b", "2"),
        ("a", "1"),
    ]
    assert other.answered("openai", "judge", ids) == set(ids)
    other.forget("openai", "judge", [*ids, "a"])
    assert other.answered("openai", "judge", [*ids, "a", "b"]) == {"b"}


def test_machines_opening_at_once_move_the_previous_version_s_keys_once(
    machine: Any,
) -> None:
    legacy = {
        "lane": "judge",
        "endpoint": ENDPOINT,
        "file_id": "file-1",
        "batch_id": "batch_1",
        "custom_ids": ["k1", "k2"],
        "created": 100,
    }
    machine().mset(
        [
            ("verdict", "{}"),
            (f"{RECORDS}judge:file-1", json.dumps(legacy)),
            *((f"{ANSWERS}execute:h{i:04d}", f"body {i}") for i in range(1_100)),
        ]
    )
    caches = [machine() for _ in range(4)]
    together = threading.Barrier(len(caches), timeout=30)

    def open_records(cache: PostgresVerdictCache) -> Any:
        together.wait()
        return job_records(cache)

    with ThreadPoolExecutor(len(caches)) as pool:
        opened = list(pool.map(open_records, caches))
    (record,) = opened[0].jobs("openai", ENDPOINT, "judge")
    assert (record.batch_id, record.state, record.custom_ids) == (
        "batch_1",
        "created",
        ["k1", "k2"],
    )
    ids = [f"h{i:04d}" for i in range(1_100)]
    assert opened[3].answers("openai", "execute", ids[:2]) == {
        "h0000": "body 0",
        "h0001": "body 1",
    }
    assert opened[2].answered("openai", "execute", ids) == set(ids)
    assert list(caches[0].yield_keys(prefix="tag-batch:")) == []
    assert caches[0].mget(["verdict"]) == ["{}"]


def _rows(schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(schema) as conn:
        jobs = conn.execute("SELECT batch_id, state FROM tag_batch_jobs").fetchall()
        answers = conn.execute("SELECT count(*) FROM tag_batch_job_answers")
        return [*jobs, *answers.fetchall()]


def test_a_run_on_another_machine_resumes_the_batches_of_a_killed_one(
    machine: Any, schema: str
) -> None:
    clock = FakeClock()
    settings = BatchSettings(poll_interval=30, sleep=clock.sleep, clock=clock.time)
    rules = [
        Rule(
            rule_id=f"R-{i}",
            name=f"Rule {i}",
            condition=f"The input contains `trigger-{i}`",
            action=f"SECRET-{i}",
        )
        for i in range(3)
    ]
    pairs = [(t, r) for t in ["trigger-0 here", "trigger-2 there"] for r in rules]
    model = RuleAwareFakeChatModel()
    with FakeBatchServer(model, [BatchScript(polls=3)]) as server:

        def judge() -> ApplicabilityJudge:
            llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model="m")
            return ApplicabilityJudge(llm=llm, cache=machine())

        first = judge_in_batch(
            judge(), pairs, settings=settings.model_copy(update={"max_wait": 0})
        )
        assert first.running_batch_ids == ["batch_1"]
        assert _rows(schema) == [("batch_1", "in_progress"), (0,)]
        second = judge()
        report = judge_in_batch(second, pairs, settings=settings)
    assert (report.sent, report.from_batch, report.online) == (0, 6, 0)
    assert report.resumed_batch_ids == ["batch_1"]
    assert server.hits["POST /v1/batches"] == 1
    assert second.cache is not None
    verdicts = second.cache.mget([second.cache_key(t, r) for t, r in pairs])
    assert all(v is not None for v in verdicts)
    assert _rows(schema) == [(0,)]  # the record gone, the answers made verdicts
