"""The verdict log on a real PostgreSQL server, as several machines would share it.

Needs a PostgreSQL server: set `TAG_TEST_POSTGRES_URI` (`scripts/postgres start`
prints it for a throwaway local one); the tests skip when it is unset or
unreachable. Each test writes tables of its own name and drops them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from langchain_tag import _sql, cli
from langchain_tag.learning.learned_prefilter import FeatureHashing, LearnedPrefilter
from langchain_tag.learning.verdict_log import (
    MissingVerdictLogError,
    PostgresVerdictLog,
    Retention,
    SQLiteVerdictLog,
    VerdictLog,
    open_verdict_log,
)
from langchain_tag.matching import Verdict
from langchain_tag.testing import trigger_rulebook
from tests.unit_tests.test_verdict_log import run_writers

pytestmark = pytest.mark.postgres

RULES = trigger_rulebook(4)
TEXTS = [f"input {i} names trigger-{i % 4:03d} among other words" for i in range(30)]


def fill(log: VerdictLog, texts: list[str]) -> None:
    """The fake judge's verdicts: R-00i applies when the text names trigger-00i."""
    for text in texts:
        for rule in RULES.rules:
            applies = f"trigger-{rule.rule_id[2:]}" in text
            log.record(text, rule, Verdict(rule_id=rule.rule_id, applies=applies))


@pytest.fixture(autouse=True)
def no_pool_left_open() -> Iterator[None]:
    """A test closes every log it opens: no shared pool outlives it."""
    before = set(_sql._POOLS.by_key)
    yield
    assert set(_sql._POOLS.by_key) == before


@pytest.fixture
def table(uri: str) -> Iterator[str]:
    """A table name no other run uses; its tables are dropped afterwards."""
    name = f"test_verdicts_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}, {name}_inputs, {name}_skipped")


@pytest.mark.parametrize("store_text", [True, False])
def test_round_trip_stats_and_examples(
    uri: str, table: str, tmp_path: Path, *, store_text: bool
) -> None:
    log = PostgresVerdictLog(uri, table=table, store_text=store_text)
    fill(log, TEXTS)
    records = list(log.records())
    assert [r.id for r in records] == list(range(1, 121))
    assert records[0].rule_hash == RULES.rules[0].content_hash()
    if store_text:
        assert records[0].text == TEXTS[0]
    else:
        assert records[0].text is None
        assert records[0].features == FeatureHashing().hash(TEXTS[0])
    stats = log.stats()
    assert (stats.verdicts, stats.inputs, stats.rules, stats.applies) == (
        120,
        30,
        4,
        30,
    )
    assert stats.by_source == {"judge": 120}
    assert (stats.inputs_with_text, stats.inputs_hashed) == (
        (30, 0) if store_text else (0, 30)
    )
    assert log.position() == 120
    assert len(log) == 120

    # The same verdicts in SQLite train the same prefilter.
    local = SQLiteVerdictLog(tmp_path / "local.sqlite", store_text=store_text)
    fill(local, TEXTS)
    remote_model, local_model = LearnedPrefilter(RULES), LearnedPrefilter(RULES)
    remote_model.fit(log.examples(RULES))
    local_model.fit(local.examples(RULES))
    probe = "a new input that names trigger-002"
    assert remote_model.margins(probe) == pytest.approx(local_model.margins(probe))
    log.close()


def test_retention_and_clear(uri: str, table: str) -> None:
    log = PostgresVerdictLog(
        uri, table=table, retention=Retention(max_rows=20, prune_every=1000)
    )
    log.orphan_grace = 0.0  # no other writer here
    fill(log, TEXTS[:10])
    assert log.prune() == 20
    assert [r.id for r in log.records()] == list(range(21, 41))
    assert log.stats().inputs_with_text == 5
    reopened = open_verdict_log(uri, table=table)
    assert isinstance(reopened, PostgresVerdictLog)
    reopened.close()
    log.clear()
    assert len(log) == 0
    assert log.stats().inputs_with_text == 0
    log.close()


def test_threads_share_one_log(uri: str, table: str) -> None:
    log = PostgresVerdictLog(uri, table=table)

    def write(worker: int) -> None:
        fill(log, [f"thread {worker} {text}" for text in TEXTS[:5]])
        log.close()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(log) == 6 * 5 * 4
    log.close()


def test_four_machines_create_and_fill_one_log(uri: str, table: str) -> None:
    """Four processes open a log nobody created yet, at once, and lose nothing."""
    run_writers(uri, table, writers=4, inputs=40)
    log = PostgresVerdictLog(uri, table=table)
    records = list(log.records())
    assert len(records) == 4 * 40 * 4
    assert len({(r.input_digest, r.rule_id) for r in records}) == 640
    stats = log.stats()
    assert (stats.inputs, stats.applies) == (160, 160)
    assert (stats.inputs_with_text, stats.inputs_hashed) == (120, 40)
    log.close()


def test_a_log_made_before_the_reason_column_gains_it(uri: str, table: str) -> None:
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, input_digest TEXT NOT "
            "NULL, rule_id TEXT NOT NULL, rule_hash TEXT NOT NULL, applies BOOLEAN "
            "NOT NULL, score DOUBLE PRECISION, error TEXT, model TEXT, prompt_version "
            "TEXT, profile TEXT, source TEXT NOT NULL, explore DOUBLE PRECISION, "
            "created DOUBLE PRECISION NOT NULL)"
        )
        conn.execute(
            f"INSERT INTO {table} (input_digest, rule_id, rule_hash, applies, source, "  # noqa: S608
            "created) VALUES ('d', 'R-000', 'h', true, 'judge', 1.0)"
        )
    log = PostgresVerdictLog(uri, table=table)
    rule = RULES.rules[1]
    for i in range(8):  # past psycopg's threshold for preparing a statement
        log.record(
            f"text {i}",
            rule,
            Verdict(rule_id=rule.rule_id, applies=True, reason=f"why {i}"),
        )
    records = list(log.records())
    assert [r.reason for r in records] == [None] + [f"why {i}" for i in range(8)]
    log.close()


def _exists(uri: str, name: str) -> bool:
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def test_read_only_refuses_a_missing_table_and_creates_none(
    uri: str, table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(MissingVerdictLogError, match=f"no table {table} or {table}_"):
        PostgresVerdictLog(uri, table=table, read_only=True)
    assert cli.main(["verdicts", "stats", uri, "--table", table]) == 2
    assert f"holds no table {table}" in capsys.readouterr().err
    assert not _exists(uri, table)
    assert not _exists(uri, f"{table}_inputs")


def test_read_only_reads_an_old_log_in_a_read_only_session(
    uri: str, table: str
) -> None:
    writer = PostgresVerdictLog(uri, table=table)
    fill(writer, TEXTS[:2])
    writer.close()
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} DROP COLUMN reason")
    log = open_verdict_log(uri, table=table, read_only=True)
    records = list(log.records())
    assert [(r.id, r.reason) for r in records] == [(i, None) for i in range(1, 9)]
    assert log.stats().verdicts == len(log) == 8
    with pytest.raises(PermissionError, match="read-only"):
        log.clear()
    assert isinstance(log, PostgresVerdictLog)
    # Whatever runs in its session, the server refuses to write.
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        log._connections.run(
            lambda conn: conn.execute(f"DELETE FROM {table}")  # noqa: S608
        )
    log.close()
    with psycopg.connect(uri, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = %s AND column_name = 'reason'",
            (table,),
        ).fetchone()
    assert columns == (0,)  # not altered by reading
