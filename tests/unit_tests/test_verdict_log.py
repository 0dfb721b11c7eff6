"""The verdict log (SQLite) and `tag verdicts`."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import Rule, Rulebook
from langchain_tag._sql import PostgresConnections
from langchain_tag._text import digest
from langchain_tag.cli import verdicts as verdicts_cli
from langchain_tag.errors import (
    CommandError,
    MissingVerdictLogError,
    StoreLocationError,
    VerdictLogWarning,
)
from langchain_tag.learning import _write_queue
from langchain_tag.learning._records import LogRecord
from langchain_tag.learning.learned_prefilter import (
    FeatureHashing,
    HashedFeatures,
    LabelledExample,
    LearnedPrefilter,
    SkippedPair,
)
from langchain_tag.learning.verdict_log import (
    PostgresVerdictLog,
    Retention,
    SkipRecord,
    SQLiteVerdictLog,
    VerdictRecord,
    open_verdict_log,
)
from langchain_tag.matching import ApplicabilityJudge, Verdict
from langchain_tag.matching.prompts import PROMPT_VERSION, RATIONALE_VERSION
from langchain_tag.testing import FakeClock, RuleAwareFakeChatModel, trigger_rulebook
from tests.unit_tests.test_sql import RecordingConnection, RecordingPool, no_rows

RULES = trigger_rulebook(4)
PRIVATE_INPUT = "the confidential input mentions trigger-001 and nothing else"


def verdict(rule: Rule, text: str) -> Verdict:
    """The fake judge's verdict: rule R-00i applies when the text names trigger-00i."""
    return Verdict(rule_id=rule.rule_id, applies=f"trigger-{rule.rule_id[2:]}" in text)


def log_inputs(log: SQLiteVerdictLog, texts: list[str], **fields: object) -> None:
    for text in texts:
        for rule in RULES.rules:
            log.record(text, rule, verdict(rule, text), model="fake", **fields)


def test_records_round_trip(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    rule = RULES.rules[1]
    started = time.time()
    log.record(
        PRIVATE_INPUT,
        rule,
        Verdict(rule_id=rule.rule_id, applies=True, score=0.8),
        model="gpt-x",
        prompt_version="judge-v2",
        profile="condition",
        explore=0.05,
    )
    (record,) = log.records()
    assert record.id == 1
    assert record.text == PRIVATE_INPUT
    assert record.features is None
    assert record.rule_hash == rule.content_hash()
    assert (record.applies, record.score, record.error) == (True, 0.8, None)
    assert (record.model, record.prompt_version, record.profile) == (
        "gpt-x",
        "judge-v2",
        "condition",
    )
    assert record.source == "judge"
    assert record.weight == pytest.approx(20.0)
    assert started <= record.created <= time.time()
    assert log.position() == 1
    assert len(log) == 1


def test_without_text_only_hashed_features_are_stored(tmp_path: Path) -> None:
    path = tmp_path / "hashed.sqlite"
    log = SQLiteVerdictLog(path, store_text=False)
    log_inputs(log, [PRIVATE_INPUT])
    records = list(log.records())
    assert all(r.text is None for r in records)
    assert {r.features for r in records} == {FeatureHashing().hash(PRIVATE_INPUT)}
    assert all(isinstance(e.input, HashedFeatures) for e in log.examples(RULES))
    stats = log.stats()
    assert (stats.inputs_with_text, stats.inputs_hashed) == (0, 1)
    log.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"confidential" not in raw


def test_a_prefilter_learns_the_same_from_text_and_from_hashed_logs(
    tmp_path: Path,
) -> None:
    texts = [f"input {i} with trigger-{i % 4:03d} and more words" for i in range(40)]
    prefilters = []
    for store_text in (True, False):
        log = SQLiteVerdictLog(tmp_path / f"{store_text}.sqlite", store_text=store_text)
        log_inputs(log, texts)
        prefilter = LearnedPrefilter(RULES)
        prefilter.fit(log.examples(RULES))
        prefilters.append(prefilter)
    probe = "a new input with trigger-002"
    assert prefilters[0].margins(probe) == pytest.approx(prefilters[1].margins(probe))


def test_examples_keep_current_applicability_verdicts_only(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    r0, r1, r2, r3 = RULES.rules
    log.append(
        [
            VerdictRecord.of("a", r0, Verdict(rule_id="R-000", applies=False)),
            # The last verdict on a pair counts.
            VerdictRecord.of("a", r0, Verdict(rule_id="R-000", applies=True)),
            VerdictRecord.of(
                "a", r1, Verdict(rule_id="R-001", applies=False, error="timeout")
            ),
            VerdictRecord.of(
                "a", r2, Verdict(rule_id="R-002", applies=True), source="relevance"
            ),
            VerdictRecord.of(
                "b", r3, Verdict(rule_id="R-003", applies=True), explore=0.1
            ),
            VerdictRecord.of(
                "b", r1, Verdict(rule_id="R-001", applies=True), source="cascade-strong"
            ),
        ]
    )
    edited = r1.model_copy(update={"condition": "edited"})
    assert list(log.examples(RULES)) == [
        LabelledExample("a", "R-000", applies=True),
        LabelledExample("b", "R-003", True, 10.0),  # noqa: FBT003
        LabelledExample("b", "R-001", applies=True),
    ]
    current = Rulebook(rules=[r0, edited, r2, r3])
    assert [e.rule_id for e in log.examples(current)] == ["R-000", "R-003"]
    assert {e.rule_id for e in log.examples(sources=None, include_failed=True)} == {
        "R-000",
        "R-001",
        "R-002",
        "R-003",
    }


def test_retention_keeps_the_newest_rows(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(
        tmp_path / "log.sqlite", retention=Retention(max_rows=10, prune_every=1000)
    )
    log_inputs(log, [f"input {i}" for i in range(5)])  # 20 verdicts
    assert len(log) == 20
    assert log.prune() == 10
    assert len(log) == 10
    assert [r.id for r in log.records()] == list(range(11, 21))
    stats = log.stats()
    assert stats.inputs == 3  # the verdicts of inputs 0 and 1 are gone...
    assert stats.inputs_with_text == 3  # ...and so are those inputs
    assert log.position() == 20


def test_retention_is_applied_while_appending(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(
        tmp_path / "log.sqlite", retention=Retention(max_rows=6, prune_every=4)
    )
    log_inputs(log, [f"input {i}" for i in range(5)])
    assert len(log) <= 6 + 4


def test_retention_by_age(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(
        tmp_path / "log.sqlite", retention=Retention(max_age=timedelta(days=1))
    )
    rule = RULES.rules[0]
    old = VerdictRecord.of("old", rule, Verdict(rule_id="R-000", applies=False))
    log.append([old.model_copy(update={"created": 0.0})])  # 1970: older than a day
    log_inputs(log, ["new"])
    assert log.prune() == 1
    assert {r.text for r in log.records()} == {"new"}


def test_stats_export_and_clear(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    log_inputs(log, ["has trigger-001", "has trigger-002"])
    log_inputs(log, ["shadowed 3"], explore=0.05, source="cascade-cheap")
    stats = log.stats()
    assert (stats.verdicts, stats.inputs, stats.rules) == (12, 3, 4)
    assert stats.applies == 2
    assert stats.shadow == 4
    assert stats.by_source == {"cascade-cheap": 4, "judge": 8}
    assert stats.by_model == {"fake": 12}
    assert stats.per_rule["R-001"].model_dump() == {"judged": 3, "applies": 1}
    out = io.StringIO()
    assert log.export(out, rule_ids=["R-002"]) == 3
    lines = [VerdictRecord.model_validate_json(x) for x in out.getvalue().splitlines()]
    assert [r.rule_id for r in lines] == ["R-002"] * 3
    log.clear()
    assert len(log) == 0
    assert log.stats().inputs == 0


async def test_async_appends(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    rule = RULES.rules[2]
    await log.arecord("x", rule, Verdict(rule_id="R-002", applies=False))
    record = VerdictRecord.of("y", rule, Verdict(rule_id="R-002", applies=True))
    assert await log.aappend([record]) == 1
    assert [r.text for r in log.records()] == ["x", "y"]


def test_many_threads_lose_nothing(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")

    def write(worker: int) -> None:
        log_inputs(log, [f"thread {worker} input {i}" for i in range(10)])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(log) == 8 * 10 * 4
    assert len({r.id for r in log.records()}) == 320


WRITER = textwrap.dedent(
    """
    import sys
    from langchain_tag.matching import Verdict
    from langchain_tag.learning.verdict_log import open_verdict_log
    from langchain_tag.testing import trigger_rulebook
    location, table, name, inputs = sys.argv[1:]
    # Writer 0 keeps no text: mixed policies share one log.
    log = open_verdict_log(location, table=table, store_text=name != "0")
    for i in range(int(inputs)):
        for rule in trigger_rulebook(4).rules:
            log.record(
                f"writer {name} input {i}",
                rule,
                Verdict(rule_id=rule.rule_id, applies=i % 4 == 0),
            )
    """
)


def run_writers(location: str, table: str, *, writers: int, inputs: int) -> None:
    """`writers` processes at once, each logging `inputs` inputs x 4 rules."""
    processes = [
        subprocess.Popen(  # noqa: S603 - our own interpreter
            [sys.executable, "-c", WRITER, location, table, str(n), str(inputs)]
        )
        for n in range(writers)
    ]
    assert [p.wait(timeout=180) for p in processes] == [0] * writers


def test_four_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    run_writers(str(path), "verdict_log", writers=4, inputs=50)
    log = SQLiteVerdictLog(path)
    records = list(log.records())
    assert len(records) == 4 * 50 * 4
    assert len({(r.input_digest, r.rule_id) for r in records}) == 800
    stats = log.stats()
    assert (stats.inputs, stats.applies) == (200, 4 * 13 * 4)
    assert (stats.inputs_with_text, stats.inputs_hashed) == (150, 50)


def test_table_names_are_checked_and_locations_opened(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="identifier"):
        SQLiteVerdictLog(tmp_path / "x.sqlite", table="log; DROP TABLE x")
    assert isinstance(open_verdict_log(tmp_path / "y.sqlite"), SQLiteVerdictLog)


# --- tag verdicts --------------------------------------------------------------------


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tag")
    verdicts_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["verdicts", *argv])
    return int(args.handler(args))


@pytest.fixture
def filled_log(tmp_path: Path) -> Path:
    path = tmp_path / "verdicts.sqlite"
    log = SQLiteVerdictLog(path)
    log_inputs(log, ["has trigger-001", "has trigger-003 too"])
    log.close()
    return path


def test_cli_stats(filled_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["stats", str(filled_log), "--rules"]) == 0
    out = capsys.readouterr().out
    assert "verdicts   8 (position 8)" in out
    assert "YES        2 (25.0%)" in out
    assert "by model   fake 8" in out
    assert "R-003" in out
    assert run_cli(["stats", str(filled_log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["applies"] == 2


def test_cli_export(
    filled_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "out" / "verdicts.jsonl"
    target.parent.mkdir()
    assert run_cli(["export", str(filled_log), "-o", str(target)]) == 0
    assert "wrote 8 records" in capsys.readouterr().err
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["id"] for r in records] == list(range(1, 9))
    assert run_cli(["export", str(filled_log), "--rule", "R-001"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["rule_id"] for line in lines] == ["R-001", "R-001"]


def test_cli_refuses_a_missing_log(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.sqlite"
    with pytest.raises(CommandError, match="no verdict log"):
        run_cli(["stats", str(missing)])
    assert not missing.exists()  # reading never creates an empty log


def test_the_postgres_log_sets_up_its_tables_unprepared_in_one_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its session goes back to the pool: nothing prepared is lost to its ALTER.

    Run by `executemany`, prepared in a pipeline, the ALTER had psycopg forget a
    statement prepared after it (InvalidSqlStatementName).
    """
    conn = RecordingConnection(no_rows)
    monkeypatch.setattr(
        PostgresConnections, "_opened", lambda self: RecordingPool(conn)
    )
    log = PostgresVerdictLog("postgresql://tag:s3cr@t@db:5432/tag", table="log")
    assert log.location == "postgresql://tag:***@db:5432/tag"  # never the password
    sqls = [sql for sql, _ in conn.statements]
    assert conn.statements[:2] == [
        ("BEGIN", ()),
        ("SELECT pg_advisory_xact_lock(hashtext(%s))", ("log",)),
    ]
    assert sqls[-2:] == [
        "ALTER TABLE log ADD COLUMN IF NOT EXISTS reason TEXT",
        "COMMIT",
    ]
    assert sum(sql.startswith("CREATE TABLE IF NOT EXISTS") for sql in sqls) == 3
    assert conn.prepared == [False] * (len(sqls) - 2)


def test_a_path_that_cannot_hold_a_log_is_named_with_the_reason(
    tmp_path: Path,
) -> None:
    with pytest.raises(StoreLocationError, match="is a directory; name a file in it"):
        SQLiteVerdictLog(tmp_path)
    (tmp_path / "plain").write_text("x")
    with pytest.raises(StoreLocationError, match="plain is not a directory"):
        open_verdict_log(tmp_path / "plain" / "sub" / "log.sqlite")
    (tmp_path / "notes.txt").write_text("not a database, but long enough " * 40)
    with pytest.raises(StoreLocationError, match="not an SQLite database"):
        SQLiteVerdictLog(tmp_path / "notes.txt")


def test_cli_never_shows_a_password() -> None:
    assert (
        verdicts_cli._redacted("postgresql://tag:s3cr@t@db:5432/tag")
        == "postgresql://tag:***@db:5432/tag"
    )
    assert (
        verdicts_cli._redacted("postgresql://tag@db/tag") == "postgresql://tag@db/tag"
    )


# --- a side channel ------------------------------------------------------------------


def test_a_locked_log_warns_once_keeps_the_records_and_writes_them_later(
    tmp_path: Path,
) -> None:
    """Before, "database is locked" was raised into the judge's retrieval."""
    path = tmp_path / "log.sqlite"
    log = SQLiteVerdictLog(path, timeout=0.05)
    rules = RULES.rules
    log.record("first", rules[0], verdict(rules[0], "first"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i, rule in enumerate(rules):  # never raises
                log.record(f"locked {i}", rule, verdict(rule, f"locked {i}"))
        assert log.pending == len(rules)
    finally:
        holder.rollback()
        holder.close()
    logged = [w for w in caught if issubclass(w.category, VerdictLogWarning)]
    assert len(logged) == 1
    message = str(logged[0].message)
    assert str(path) in message
    assert "database is locked" in message
    log.record("after", rules[1], verdict(rules[1], "after"))
    assert log.pending == 0
    assert [r.text for r in log.records()] == [
        "first",
        *(f"locked {i}" for i in range(len(rules))),
        "after",
    ]


def test_flush_writes_what_is_pending_and_a_failing_flush_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    rule = RULES.rules[0]
    real_insert = log._insert

    def failing(records: object) -> None:
        msg = "disk I/O error"
        raise sqlite3.OperationalError(msg)

    monkeypatch.setattr(log, "_insert", failing)
    with pytest.warns(VerdictLogWarning, match="disk I/O error"):
        log.record("a", rule, verdict(rule, "a"))
    assert asyncio.run(log.aappend([VerdictRecord.of("b", rule, verdict(rule, "b"))]))
    assert log.pending == 2
    with pytest.raises(sqlite3.OperationalError):
        log.flush()
    assert log.pending == 2
    monkeypatch.setattr(log, "_insert", real_insert)
    assert log.flush() == 2
    assert log.flush() == 0
    assert [r.text for r in log.records()] == ["a", "b"]
    # Written again: a new failure warns again.
    monkeypatch.setattr(log, "_insert", failing)
    with pytest.warns(VerdictLogWarning):
        log.record("c", rule, verdict(rule, "c"))


def test_close_writes_what_is_pending(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    log = SQLiteVerdictLog(path, timeout=0.05)
    rule = RULES.rules[0]
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.warns(VerdictLogWarning):
            log.record("paid", rule, verdict(rule, "paid"))
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            log.close()  # still locked: the record stays pending, nothing lost
        assert log.pending == 1
    finally:
        holder.rollback()
        holder.close()
    log.close()
    assert [r.text for r in SQLiteVerdictLog(path).records()] == ["paid"]


POISON = "POISON"


class FlakyLog(SQLiteVerdictLog):
    """An SQLite log whose store fails with `down`, and rejects a POISON text.

    POISON is rejected as PostgreSQL rejects a NUL character. It notes the busy
    timeout of each write (0: a write that does not wait).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.down: Exception | None = None
        self.busy_timeouts: list[int] = []
        self.sizes: list[int] = []
        # Set: the next write signals `entered`, waits for `proceed`, then `left`.
        self.gate: tuple[threading.Event, threading.Event, threading.Event] | None
        self.gate = None

    def _insert(self, records: Sequence[LogRecord]) -> None:
        conn = self._connections.get()
        self.busy_timeouts.append(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        self.sizes.append(len(records))
        gate, self.gate = self.gate, None
        try:
            if gate is not None:
                gate[0].set()
                assert gate[1].wait(timeout=30)  # a guard against a deadlock only
            if self.down is not None:
                raise self.down
            if any(POISON in (r.text or "") for r in records):
                msg = "PostgreSQL text fields cannot contain NUL (0x00) bytes"
                raise sqlite3.DataError(msg)
            super()._insert(records)
        finally:
            if gate is not None:
                gate[2].set()


class WaitingLog(FlakyLog):
    """A store that cannot be tried without waiting (as PostgreSQL)."""

    _writes_at_once = False


def texts(log: SQLiteVerdictLog) -> list[str | None]:
    return [r.text for r in log.records()]


def log_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, VerdictLogWarning)]


def test_a_locked_log_waits_at_most_once_per_retry_interval(tmp_path: Path) -> None:
    """Before, each write waited the busy timeout while the log was locked.

    16 judgments took seconds instead of a tenth.
    """
    path = tmp_path / "log.sqlite"
    clock = FakeClock()
    log = FlakyLog(path, timeout=0.05, clock=clock.monotonic)
    rule = RULES.rules[0]
    log.record("first", rule, verdict(rule, "first"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        log.busy_timeouts.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(16):
                log.record(f"locked {i}", rule, verdict(rule, "x"))
            # The first write waited; the next only tried without waiting.
            assert log.busy_timeouts == [50] + [0] * 15
            assert len(log_warnings(caught)) == 1
            for now, waits in [
                (0.99, False),
                (1.0, True),  # the retry is due: it waits, fails, and doubles
                (2.99, False),
                (3.0, True),
                (6.99, False),
                (7.0, True),
            ]:
                clock.now = now
                log.busy_timeouts.clear()
                log.record(f"at {now}", rule, verdict(rule, "x"))
                assert log.busy_timeouts == [50 if waits else 0], now
            assert len(log_warnings(caught)) == 1
        assert log.pending == 16 + 6
    finally:
        holder.rollback()
        holder.close()
    # Released: the next write notices it at once, though no retry is due.
    clock.now = 7.5
    log.record("after", rule, verdict(rule, "after"))
    assert log.pending == 0
    assert texts(log) == [
        "first",
        *(f"locked {i}" for i in range(16)),
        *(f"at {t}" for t in (0.99, 1.0, 2.99, 3.0, 6.99, 7.0)),
        "after",
    ]


def test_retries_back_off_and_flush_tries_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    log = WaitingLog(
        tmp_path / "log.sqlite",
        clock=clock.monotonic,
        retry_after=1.0,
        max_retry_after=4.0,
    )
    rule = RULES.rules[0]
    log.down = sqlite3.OperationalError("server closed the connection unexpectedly")
    with pytest.warns(VerdictLogWarning, match="server closed"):
        log.record("0", rule, verdict(rule, "0"))
    tried = []
    for now in [0.5, 0.99, 1.0, 1.5, 2.99, 3.0, 6.99, 7.0, 10.99, 11.0, 14.99, 15.0]:
        clock.now = now
        attempts = len(log.sizes)
        log.record(str(now), rule, verdict(rule, "x"))
        if len(log.sizes) > attempts:
            tried.append(now)
    # Intervals 1, 2, 4, then 4 at most; writes between them only queue.
    assert tried == [1.0, 3.0, 7.0, 11.0, 15.0]
    assert log.pending == 13
    clock.now = 15.5  # not due: flush tries all the same
    with pytest.raises(sqlite3.OperationalError):
        log.flush()
    assert len(log.sizes) == 7
    log.down = None
    assert log.flush() == 13
    assert texts(log)[:2] == ["0", "0.5"]
    # A success resets the interval to retry_after.
    log.down = sqlite3.OperationalError("server closed the connection unexpectedly")
    clock.now = 100.0
    with pytest.warns(VerdictLogWarning):
        log.record("again", rule, verdict(rule, "again"))
    log.down = None
    clock.now = 100.99
    log.record("queued", rule, verdict(rule, "queued"))
    assert log.pending == 2
    clock.now = 101.0
    log.record("due", rule, verdict(rule, "due"))
    assert log.pending == 0
    assert texts(log)[-3:] == ["again", "queued", "due"]


def test_only_one_writer_retries_and_the_others_do_not_wait(tmp_path: Path) -> None:
    clock = FakeClock()
    log = FlakyLog(tmp_path / "log.sqlite", clock=clock.monotonic)
    rule = RULES.rules[0]
    log.down = sqlite3.OperationalError("disk I/O error")
    with pytest.warns(VerdictLogWarning, match="disk I/O error"):
        log.record("a", rule, verdict(rule, "a"))
    clock.now = 1.0  # due
    entered, proceed, left = threading.Event(), threading.Event(), threading.Event()
    log.gate = (entered, proceed, left)
    retrier = threading.Thread(target=log.record, args=("b", rule, verdict(rule, "b")))
    retrier.start()
    try:
        assert entered.wait(timeout=30)  # the retrier is inside the store
        attempts = len(log.sizes)
        for i in range(5):  # they neither wait for the retrier nor try the store
            log.record(f"c{i}", rule, verdict(rule, "c"))
        assert not left.is_set()
        assert len(log.sizes) == attempts
        assert log.pending == 5  # a and b are with the retrier
    finally:
        proceed.set()
        retrier.join()
    assert log.pending == 7
    log.down = None
    assert log.flush() == 7
    assert texts(log) == ["a", "b", *(f"c{i}" for i in range(5))]


def test_a_record_the_store_rejects_is_dropped_not_retried_forever(
    tmp_path: Path,
) -> None:
    """Before, one poison record kept every later record pending for good."""
    log = FlakyLog(tmp_path / "log.sqlite", clock=FakeClock().monotonic)
    rule = RULES.rules[0]
    log.down = sqlite3.OperationalError("database is locked")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for text in ["a", f"b {POISON}", "c"]:
            log.record(text, rule, verdict(rule, text))
        assert log.pending == 3
        log.down = None
        log.record("d", rule, verdict(rule, "d"))
    assert log.pending == 0
    assert log.dropped == 1
    assert texts(log) == ["a", "c", "d"]
    dropped = log_warnings(caught)[-1]
    assert "dropped 1 record(s) that the store rejects" in dropped
    assert "DataError: PostgreSQL text fields cannot contain NUL" in dropped
    # Written again: the next failure warns again.
    log.down = sqlite3.OperationalError("database is locked")
    with pytest.warns(VerdictLogWarning, match="cannot be written"):
        log.record("e", rule, verdict(rule, "e"))


def test_a_lone_poison_record_neither_fails_flush_nor_close(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    log = FlakyLog(path, clock=FakeClock().monotonic)
    rule = RULES.rules[0]
    with pytest.warns(VerdictLogWarning, match="rejects"):
        log.record(POISON, rule, verdict(rule, "x"))  # the store works: dropped
    assert (log.pending, log.dropped) == (0, 1)
    log.down = sqlite3.OperationalError("database is locked")
    with pytest.warns(VerdictLogWarning, match="cannot be written"):
        log.record(f"{POISON} 2", rule, verdict(rule, "x"))
    log.down = None
    with pytest.warns(VerdictLogWarning, match="rejects"):
        assert log.flush() == 0  # an empty write passes: the record is the problem
    assert (log.pending, log.dropped) == (0, 2)
    log.record("fine", rule, verdict(rule, "fine"))
    log.close()
    assert texts(SQLiteVerdictLog(path)) == ["fine"]


def test_a_store_failing_every_record_keeps_them_all(tmp_path: Path) -> None:
    log = FlakyLog(tmp_path / "log.sqlite", clock=FakeClock().monotonic)
    rule = RULES.rules[0]
    # Not an OperationalError, but the store's: nothing is written, not even empty.
    log.down = sqlite3.DatabaseError("database disk image is malformed")
    with pytest.warns(VerdictLogWarning, match="malformed"):
        log.record("a", rule, verdict(rule, "a"))
    assert log.sizes == [1, 0]  # the record, then an empty write: no more
    log.sizes.clear()
    log.record("b", rule, verdict(rule, "b"))
    assert log.sizes == [2, 1, 0]  # the batch, its first record, an empty write
    assert (log.pending, log.dropped) == (2, 0)
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):
        log.close()
    log.down = None
    log.close()
    assert texts(log) == ["a", "b"]


def test_pending_records_are_capped_and_the_oldest_dropped(tmp_path: Path) -> None:
    log = FlakyLog(tmp_path / "log.sqlite", clock=FakeClock().monotonic, max_pending=3)
    rule = RULES.rules[0]
    log.down = sqlite3.OperationalError("database is locked")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            log.record(str(i), rule, verdict(rule, str(i)))
    assert (log.pending, log.dropped) == (3, 3)
    messages = log_warnings(caught)
    assert len(messages) == 2  # cannot be written; then the first loss
    assert "at most 3 records in memory: the oldest 1 are lost" in messages[1]
    log.down = None
    assert log.flush() == 3
    assert texts(log) == ["3", "4", "5"]


def test_a_record_that_cannot_be_prepared_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, hashing a text (store_text=False) raised into the paid judgment."""
    log = FlakyLog(
        tmp_path / "log.sqlite", clock=FakeClock().monotonic, store_text=False
    )
    rule = RULES.rules[0]
    real_hash = FeatureHashing.hash
    hungry = True

    def hashing(self: FeatureHashing, text: str) -> HashedFeatures:
        if "unhashable" in text:
            msg = "cannot hash this"
            raise ValueError(msg)
        if "big" in text and hungry:
            raise MemoryError
        return real_hash(self, text)

    monkeypatch.setattr(FeatureHashing, "hash", hashing)
    with pytest.warns(VerdictLogWarning, match=r"cannot be prepared.*ValueError"):
        log.record("unhashable", rule, verdict(rule, "x"))
    assert (log.pending, log.dropped, len(log)) == (0, 1, 0)
    # For want of memory: kept raw, prepared at a later write.
    with pytest.warns(VerdictLogWarning, match="MemoryError"):
        log.record("a big text", rule, verdict(rule, "x"))
    assert log.pending == 1
    hungry = False
    log.record("small", rule, verdict(rule, "x"))
    assert log.pending == 0
    records = list(log.records())
    assert [r.text for r in records] == [None, None]
    assert [r.features for r in records] == [
        real_hash(log.hashing, "a big text"),
        real_hash(log.hashing, "small"),
    ]


def test_retry_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_pending"):
        SQLiteVerdictLog(tmp_path / "a.sqlite", max_pending=0)
    with pytest.raises(ValueError, match="retry_after"):
        SQLiteVerdictLog(tmp_path / "b.sqlite", retry_after=2, max_retry_after=1)


# --- the judge's reason, and logs made before it was kept --------------------------

# The schema of a log made before the `reason` column, copied from that code.
OLD_SCHEMA = (
    (
        "CREATE TABLE IF NOT EXISTS verdict_log_inputs (digest TEXT PRIMARY KEY, "
        "text TEXT, features TEXT, last_used REAL NOT NULL)"
    ),
    (
        "CREATE TABLE IF NOT EXISTS verdict_log (id INTEGER PRIMARY KEY "
        "AUTOINCREMENT, input_digest TEXT NOT NULL, rule_id TEXT NOT NULL, "
        "rule_hash TEXT NOT NULL, applies INTEGER NOT NULL, score REAL, error TEXT, "
        "model TEXT, prompt_version TEXT, profile TEXT, source TEXT NOT NULL, "
        "explore REAL, created REAL NOT NULL)"
    ),
    "CREATE INDEX IF NOT EXISTS verdict_log_created ON verdict_log (created)",
    "CREATE INDEX IF NOT EXISTS verdict_log_input ON verdict_log (input_digest)",
)


def _columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [row[1] for row in conn.execute("PRAGMA table_info(verdict_log)")]


def old_log(path: Path) -> Path:
    """A log file as the code before the `reason` column made it, with one verdict."""
    rule = RULES.rules[1]
    conn = sqlite3.connect(path)
    with conn:
        for statement in OLD_SCHEMA:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO verdict_log_inputs VALUES (?, ?, NULL, ?)",
            (digest("old trigger-001"), "old trigger-001", 1.0),
        )
        conn.execute(
            "INSERT INTO verdict_log (input_digest, rule_id, rule_hash, applies, "
            "score, error, model, prompt_version, profile, source, explore, created) "
            "VALUES (?, ?, ?, 1, NULL, NULL, 'fake', 'judge-v2', 'condition', "
            "'judge', NULL, 1.0)",
            (digest("old trigger-001"), rule.rule_id, rule.content_hash()),
        )
    conn.close()
    return path


def test_reasons_round_trip_and_are_exported(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    rule = RULES.rules[1]
    reason = "The input names trigger-001."
    log.record(
        "has trigger-001", rule, Verdict(rule_id="R-001", applies=True, reason=reason)
    )
    log.record("x", rule, Verdict(rule_id="R-001", applies=False))
    assert [r.reason for r in log.records()] == [reason, None]
    out = io.StringIO()
    assert log.export(out) == 2
    assert [json.loads(line)["reason"] for line in out.getvalue().splitlines()] == [
        reason,
        None,
    ]


def test_a_log_made_before_reasons_gets_the_column_when_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = old_log(tmp_path / "old.sqlite")
    assert "reason" not in _columns(path)
    log = SQLiteVerdictLog(path)
    # Added last: old and new logs have one layout.
    assert _columns(path) == _columns(SQLiteVerdictLog(tmp_path / "new.sqlite").path)
    assert _columns(path)[-1] == "reason"
    rule = RULES.rules[1]
    log.record(
        "new trigger-001", rule, Verdict(rule_id="R-001", applies=True, reason="Named.")
    )
    assert [(r.id, r.text, r.reason) for r in log.records()] == [
        (1, "old trigger-001", None),
        (2, "new trigger-001", "Named."),
    ]
    assert log.stats().verdicts == 2
    assert [e.applies for e in log.examples(RULES)] == [True, True]
    log.close()
    # Opening it again adds nothing twice; `tag verdicts export` reads it whole.
    SQLiteVerdictLog(path).close()
    assert _columns(path).count("reason") == 1
    assert run_cli(["export", str(path)]) == 0
    exported = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["id"], r["reason"]) for r in exported] == [(1, None), (2, "Named.")]


def test_cli_export_opens_a_log_made_before_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = old_log(tmp_path / "old.sqlite")
    assert run_cli(["export", str(path)]) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (record["text"], record["reason"]) == ("old trigger-001", None)


def test_a_judge_with_rationale_logs_its_reasons(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    judge = ApplicabilityJudge(
        llm=RuleAwareFakeChatModel(), verdict_log=log, rationale=True
    )
    judge.judge_rules("has trigger-001", RULES.rules[:2])
    ApplicabilityJudge(llm=RuleAwareFakeChatModel(), verdict_log=log).judge_rules(
        "has trigger-001", RULES.rules[:1]
    )
    # The fan-out's two judgments are logged in whichever order they end.
    *reasoned, plain = log.records()
    records = [*sorted(reasoned, key=lambda r: r.rule_id), plain]
    assert [(r.rule_id, r.applies, r.reason) for r in records] == [
        ("R-000", False, "no decisive fact"),
        ("R-001", True, "the input shows the condition"),
        ("R-000", False, None),
    ]
    # Reasoned verdicts came from other prompts, and say so.
    assert [r.prompt_version for r in records] == [
        f"{PROMPT_VERSION}+{RATIONALE_VERSION}",
        f"{PROMPT_VERSION}+{RATIONALE_VERSION}",
        PROMPT_VERSION,
    ]


# --- reading only --------------------------------------------------------------------


def _tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return sorted(name for (name,) in rows if not name.startswith("sqlite_"))


def test_read_only_reads_a_log_made_before_reasons_without_changing_it(
    tmp_path: Path,
) -> None:
    path = old_log(tmp_path / "old.sqlite")
    before = (path.read_bytes(), path.stat().st_mtime_ns, _columns(path))
    log = SQLiteVerdictLog(path, read_only=True)
    assert log.read_only
    assert [(r.id, r.text, r.reason) for r in log.records()] == [
        (1, "old trigger-001", None)
    ]
    assert log.stats().verdicts == len(log) == log.position() == 1
    assert [e.applies for e in log.examples(RULES)] == [True]
    log.close()
    # Opened for writing it would have gained the `reason` column.
    assert (path.read_bytes(), path.stat().st_mtime_ns, _columns(path)) == before


def test_read_only_refuses_what_is_not_a_log_and_creates_nothing(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nowhere" / "log.sqlite"
    with pytest.raises(
        MissingVerdictLogError, match=r"no verdict log at .*: no such file"
    ):
        SQLiteVerdictLog(missing, read_only=True)
    assert not missing.parent.exists()
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    with pytest.raises(
        MissingVerdictLogError,
        match=r"holds no table verdict_log or verdict_log_inputs \(its tables: notes\)",
    ):
        SQLiteVerdictLog(other, read_only=True)
    assert _tables(other) == ["notes"]
    log_path = SQLiteVerdictLog(tmp_path / "log.sqlite").path
    with pytest.raises(MissingVerdictLogError, match="no table verdicts or verdicts_"):
        SQLiteVerdictLog(log_path, table="verdicts", read_only=True)
    assert _tables(log_path) == [
        "verdict_log",
        "verdict_log_inputs",
        "verdict_log_skipped",
    ]
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE verdict_log (id INTEGER, rule_id TEXT)")
        conn.execute("CREATE TABLE verdict_log_inputs (digest TEXT)")
    conn.close()
    with pytest.raises(MissingVerdictLogError, match="no column input_digest, rule_h"):
        SQLiteVerdictLog(other, read_only=True)


def test_a_read_only_log_refuses_writes(tmp_path: Path) -> None:
    path = SQLiteVerdictLog(tmp_path / "log.sqlite").path
    log = open_verdict_log(path, read_only=True)
    rule = RULES.rules[0]
    with pytest.raises(PermissionError, match="read-only"):
        log.record("x", rule, Verdict(rule_id="R-000", applies=True))
    with pytest.raises(PermissionError, match="read-only"):
        log.prune()
    with pytest.raises(PermissionError, match="read-only"):
        log.clear()
    assert (len(log), log.pending) == (0, 0)
    log.close()


# --- skip records: what a learned prefilter skipped, not verdicts --------------------


def skip(log: SQLiteVerdictLog, text: str, *rates: tuple[int, float]) -> None:
    """Record that rules R-00i were skipped for `text`, with their P(YES | skipped)."""
    rules = [(f"R-{i:03d}", RULES.rules[i].content_hash(), rate) for i, rate in rates]
    log.record_skipped(text, rules, explore=0.05)


@pytest.mark.parametrize("store_text", [True, False])
def test_skip_records_round_trip_and_are_no_verdicts(
    tmp_path: Path, *, store_text: bool
) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite", store_text=store_text)
    skip(log, PRIVATE_INPUT, (2, 0.125), (3, 0.5))
    assert log.pending == 2  # waiting for the next write, not written at once
    assert list(log.skips()) == []
    log_inputs(log, [PRIVATE_INPUT])  # the judge's verdicts take them along
    assert log.pending == 0
    skips = list(log.skips())
    stored = PRIVATE_INPUT if store_text else FeatureHashing().hash(PRIVATE_INPUT)
    assert [
        (s.id, s.rule_id, s.rule_hash, s.skipped_yes, s.explore) for s in skips
    ] == [
        (1, "R-002", RULES.rules[2].content_hash(), 0.125, 0.05),
        (2, "R-003", RULES.rules[3].content_hash(), 0.5, 0.05),
    ]
    assert {s.text if store_text else s.features for s in skips} == {stored}
    # The readers of verdicts do not see them.
    assert all(isinstance(r, VerdictRecord) for r in log.records())
    assert len(log) == log.position() == log.stats().verdicts == 4
    assert log.stats().skipped == 2
    out = io.StringIO()
    assert log.export(out) == 4
    assert "skipped_yes" not in out.getvalue()
    assert all(type(e) is LabelledExample for e in log.examples(RULES))
    # Asked for, they come as SkippedPairs, merged with the verdicts by time.
    found = list(log.examples(RULES, skipped=True))
    assert found[:2] == [
        SkippedPair(stored, "R-002", 0.125),
        SkippedPair(stored, "R-003", 0.5),
    ]
    assert found[2:] == list(log.examples(RULES))
    # A rule edited since: its skip record is stale, as its verdicts are.
    edited = RULES.rules[3].model_copy(update={"condition": "edited"})
    current = Rulebook(rules=[*RULES.rules[:3], edited])
    assert [e.rule_id for e in log.examples(current, skipped=True)][:1] == ["R-002"]
    assert len(list(log.examples(current, skipped=True))) == 4
    log.clear()
    assert list(log.skips()) == []


def test_skip_records_wait_for_a_write_at_most_so_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_write_queue, "_DEFERRED_AT_MOST", 3)
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    skip(log, "a", (0, 0.1), (1, 0.1))
    assert (log.pending, log.stats().skipped) == (2, 0)
    skip(log, "b", (0, 0.1))  # the third: written at once
    assert (log.pending, log.stats().skipped) == (0, 3)
    skip(log, "c", (2, 0.2))
    assert log.flush() == 1
    assert [s.text for s in log.skips()] == ["a", "a", "b", "c"]
    log.record_skipped("d", [], explore=0.05)
    assert log.pending == 0
    with pytest.raises(ValueError, match="less than or equal to 1"):
        log.record_skipped("e", [("R-000", "hash", 1.5)], explore=0.05)


def test_skip_records_wait_out_a_failing_store(tmp_path: Path) -> None:
    log = FlakyLog(tmp_path / "log.sqlite", clock=FakeClock().monotonic)
    log.down = sqlite3.OperationalError("database is locked")
    skip(log, "while down", (1, 0.2))
    with pytest.warns(VerdictLogWarning, match="cannot be written"):
        log_inputs(log, ["while down"])
    assert log.pending == 5
    log.down = None
    assert log.flush() == 5
    assert [s.text for s in log.skips()] == ["while down"]
    assert len(log) == 4


def test_retention_prunes_skip_records_with_the_verdicts(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(
        tmp_path / "log.sqlite", retention=Retention(max_age=timedelta(days=1))
    )
    rule = RULES.rules[0]
    old = SkipRecord.of("old", rule, 0.1, explore=0.05)
    log.append([old.model_copy(update={"created": 0.0})])  # 1970
    skip(log, "skipped only", (1, 0.2))  # an input no verdict points at
    log_inputs(log, ["new"])
    assert log.prune() == 0  # verdicts deleted: none
    assert [s.text for s in log.skips()] == ["skipped only"]
    # The input of "old" is gone, that of "skipped only" is kept.
    assert log.stats().inputs_with_text == 2
    rows = SQLiteVerdictLog(tmp_path / "rows.sqlite", retention=Retention(max_rows=4))
    log_inputs(rows, ["first"])
    skip(rows, "first", (1, 0.2))
    log_inputs(rows, ["second"])
    older = SkipRecord.of("zero", rule, 0.1, explore=0.05)
    rows.append([older.model_copy(update={"created": 0.0})])
    assert rows.prune() == 4
    assert [s.text for s in rows.skips()] == []  # older than every verdict kept


def test_a_log_made_before_skip_records(tmp_path: Path) -> None:
    path = old_log(tmp_path / "old.sqlite")
    reader = SQLiteVerdictLog(path, read_only=True)
    assert list(reader.skips()) == []
    assert reader.stats().skipped == 0
    assert [type(e) for e in reader.examples(RULES, skipped=True)] == [LabelledExample]
    assert reader.stream_counts().model_dump() == {
        "inputs": 1,
        "warm_inputs": 1,
        "warm_yes": 1,
        "kept_yes": 0,
        "shadow_yes": 0,
        "predicted_misses": 0.0,
        "explored_misses": 0.0,
        "recent_inputs": 1,
        "recent_verdicts": 1,
    }
    reader.close()
    assert "verdict_log_skipped" not in _tables(path)  # reading changed nothing
    SQLiteVerdictLog(path).close()  # opened to write: it gets the table
    assert "verdict_log_skipped" in _tables(path)


def test_stream_counts_by_hand(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    judge = {rule.rule_id: rule for rule in RULES.rules}

    def judged(text: str, rule_id: str, *, applies: bool, **fields: Any) -> None:
        verdict = Verdict(rule_id=rule_id, applies=applies)
        log.record(text, judge[rule_id], verdict, **fields)

    # The warm-up: every rule judged, two YES.
    for rule_id, applies in [("R-000", True), ("R-001", False), ("R-002", False)]:
        judged("warm", rule_id, applies=applies)
    judged("warm", "R-003", applies=True)
    mark = log.position()
    # Screened: skipped (0.2 and 0.1 expected), R-003 explored.
    hashes = {rule_id: rule.content_hash() for rule_id, rule in judge.items()}
    log.record_skipped(
        "screened",
        [("R-002", hashes["R-002"], 0.2), ("R-003", hashes["R-003"], 0.1)],
        explore=0.5,
    )
    judged("screened", "R-000", applies=False)
    judged("screened", "R-000", applies=True)  # again: the last verdict counts
    judged("screened", "R-001", applies=False)
    judged("screened", "R-003", applies=True, explore=0.5)
    # Not applicability verdicts, or failed: not counted.
    judged("screened", "R-001", applies=True, source="relevance")
    log.record(
        "screened",
        judge["R-002"],
        Verdict(rule_id="R-002", applies=False, error="timeout"),
    )
    counts = log.stream_counts(since=mark)
    assert counts.model_dump() == {
        "inputs": 2,
        "warm_inputs": 1,
        "warm_yes": 2,
        "kept_yes": 1,
        "shadow_yes": 1,
        "predicted_misses": pytest.approx(0.3),
        "explored_misses": pytest.approx(0.15),
        "recent_inputs": 1,
        "recent_verdicts": 6,
    }
    assert log.stream_counts(sources=None).kept_yes == 2  # with the relevance YES
