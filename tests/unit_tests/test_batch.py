"""The batch lane: the OpenAI Batch API against a loopback fake of it.

Every test talks HTTP to a `FakeBatchServer` on 127.0.0.1 through the real OpenAI
SDK and `ChatOpenAI`; polling waits on a `FakeClock`, never for real.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from langchain_core.stores import BaseStore
from langchain_openai import ChatOpenAI

from langchain_tag import Rule
from langchain_tag.batch import (
    BatchFailedError,
    BatchLaneError,
    BatchProgress,
    BatchSettings,
    cancel_batches,
    execute_in_batch,
    judge_in_batch,
    lane,
)
from langchain_tag.batch._jobs import BatchJobs
from langchain_tag.batch._records import JobRecord, Lane, job_records
from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.matching import ApplicabilityJudge, CascadeJudge, Verdict
from langchain_tag.matching.prompts import read_judge_message
from langchain_tag.models import CallRetry
from langchain_tag.testing import (
    BatchScript,
    FakeBatchServer,
    FakeClock,
    RuleAwareFakeChatModel,
)
from langchain_tag.testing.server import Refusal
from langchain_tag.usage import UsageCounter

RULES = [
    Rule(
        rule_id=f"R-{i}",
        name=f"Rule {i}",
        condition=f"The input contains `trigger-{i}`",
        action=f"SECRET-ACTION-{i}",
    )
    for i in range(4)
]
TEXTS = ["trigger-0 and trigger-2", "trigger-1 only", "nothing at all"]
PAIRS = [(text, rule) for text in TEXTS for rule in RULES]
TRUTH = {(t, r.rule_id): f"trigger-{r.rule_id[-1]}" in t for t, r in PAIRS}
CHAT = "POST /v1/chat/completions"


pytestmark = pytest.mark.usefixtures("loopback")  # the fake API, on 127.0.0.1


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server() -> Iterator[FakeBatchServer]:
    with FakeBatchServer(RuleAwareFakeChatModel()) as fake:
        yield fake


def _llm(server: FakeBatchServer, **changes: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.base_url,
        api_key="unused",
        **{"model": "gpt-4o-mini", **changes},
    )


def _judge(server: FakeBatchServer, **changes: Any) -> ApplicabilityJudge:
    llm_changes = changes.pop("llm_changes", {})
    options: dict[str, Any] = {
        "llm": _llm(server, **llm_changes),
        "retry": CallRetry(max_attempts=2, initial_delay=0, jitter=0),
    }
    return ApplicabilityJudge(**{**options, **changes})


def _settings(clock: FakeClock, **changes: Any) -> BatchSettings:
    return BatchSettings(
        **{"poll_interval": 30.0, "sleep": clock.sleep, "clock": clock.time, **changes}
    )


def _cached(judge: ApplicabilityJudge, pairs: list[tuple[str, Rule]]) -> list[bool]:
    assert judge.cache is not None
    stored = judge.cache.mget([judge.cache_key(t, r) for t, r in pairs])
    assert all(value is not None for value in stored)
    return [Verdict.model_validate_json(v).applies for v in stored if v is not None]


def _kept(
    server: FakeBatchServer, store: BaseStore[str, str] | None, lane: Lane = "judge"
) -> BatchJobs:
    """The jobs and answers recorded beside `store` for `server`'s API."""
    assert store is not None
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    return BatchJobs(client, job_records(store), lane, BatchSettings())


def _store_answer(
    store: BaseStore[str, str] | None, lane: Lane, custom_id: str, body: str
) -> None:
    """Store an answer as a finished batch's would be (its record long gone)."""
    assert store is not None
    gone = JobRecord(
        provider="openai",
        endpoint="gone",
        lane=lane,
        input_file_id="file-gone",
        custom_ids=[custom_id],
        created=0,
    )
    job_records(store).finish(gone, {custom_id: body})


def _rule_of(body: dict[str, Any]) -> str:
    text = "\n".join(str(m["content"]) for m in body["messages"])
    parsed = read_judge_message(text)
    return parsed[1]["rule_id"] if parsed else ""


class _Log:
    """A verdict log in a list."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, Verdict, dict[str, Any]]] = []

    def record(self, text: str, rule: Rule, verdict: Verdict, **fields: Any) -> None:
        self.records.append((text, rule.rule_id, verdict, fields))

    async def arecord(
        self, text: str, rule: Rule, verdict: Verdict, **fields: Any
    ) -> None:
        self.record(text, rule, verdict, **fields)


# --- what is sent ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"structured_output": "never"},
        {"logprobs": True},
        {"rationale": True},
        {"llm_changes": {"max_tokens": 50, "seed": 7, "extra_body": {"x": 1}}},
        {"llm_changes": {"model": "o3-mini"}},
    ],
    ids=["structured", "text", "logprobs", "rationale", "options", "o-series"],
)
def test_a_batch_line_is_the_request_the_online_judgment_posts(
    changes: dict[str, Any], clock: FakeClock
) -> None:
    text, rule = TEXTS[0], RULES[2]
    with FakeBatchServer(RuleAwareFakeChatModel(logprobs=True)) as server:
        online = _judge(server, cache=None, **dict(changes))
        expected = online.invoke((text, rule))
        posted = server.requests[-1]
        judge = _judge(server, **dict(changes))
        judge_in_batch(judge, [(text, rule)], settings=_settings(clock))
        (line,) = server.input_lines("batch_1")
        assert judge.invoke((text, rule)).model_copy(update={"cached": False}) == (
            expected
        )
    assert line["body"] == posted
    assert line["custom_id"] == judge.cache_key(text, rule)
    assert (line["method"], line["url"]) == ("POST", "/v1/chat/completions")
    assert "SECRET-ACTION" not in json.dumps(line)


def test_verdicts_land_in_the_cache_and_the_log_as_online_ones(
    server: FakeBatchServer, clock: FakeClock
) -> None:
    online_log, batch_log = _Log(), _Log()
    online = _judge(server, verdict_log=online_log)
    online_verdicts = [online.invoke(pair) for pair in PAIRS]
    judge = _judge(server, verdict_log=batch_log)
    report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert (report.requests, report.sent, report.from_batch) == (12, 12, 12)
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]
    assert batch_log.records == [
        (t, rule_id, v, fields) for t, rule_id, v, fields in online_log.records
    ]
    assert [v for *_, v, _ in batch_log.records] == online_verdicts
    before = server.hits[CHAT]
    assert [judge.invoke(pair).cached for pair in PAIRS] == [True] * 12
    assert server.hits[CHAT] == before  # the verdicts are read from the cache


def test_explored_pairs_are_logged_with_their_rate(
    server: FakeBatchServer, clock: FakeClock
) -> None:
    # Shadow judging's marks (the weight training gives a pair) survive the lane,
    # for answers read from a batch and for lines judged online after it.
    server.scripts = [
        BatchScript(line_status=lambda body: 500 if _rule_of(body) == "R-1" else 200)
    ]
    log = _Log()
    judge = _judge(server, verdict_log=log)
    drawn = {(TEXTS[0], "R-1"): 0.05, (TEXTS[0], "R-2"): 0.05}
    report = judge_in_batch(judge, PAIRS[:4], settings=_settings(clock), explored=drawn)
    assert report.online == 1  # line 1 (R-1) failed in the batch: judged online
    marks = {rule_id: fields["explore"] for _, rule_id, _, fields in log.records}
    assert marks == {"R-0": None, "R-1": 0.05, "R-2": 0.05, "R-3": None}


def test_cached_and_repeated_pairs_are_never_sent(
    server: FakeBatchServer, clock: FakeClock
) -> None:
    judge = _judge(server)
    for pair in PAIRS[:5]:
        judge.invoke(pair)
    report = judge_in_batch(judge, PAIRS + PAIRS, settings=_settings(clock))
    sent = [line["custom_id"] for line in server.input_lines("batch_1")]
    assert (report.requests, report.cached, report.sent) == (12, 5, 7)
    assert sent == [judge.cache_key(t, r) for t, r in PAIRS[5:]]
    assert judge_in_batch(judge, PAIRS, settings=_settings(clock)).sent == 0
    assert server.hits["POST /v1/batches"] == 1


@pytest.mark.parametrize(
    ("settings", "sizes"),
    [({"max_requests_per_file": 5}, [5, 5, 2]), ({"max_bytes_per_file": 9_000}, None)],
    ids=["by-count", "by-bytes"],
)
def test_files_are_split_within_the_limits(
    settings: dict[str, Any], sizes: list[int] | None, clock: FakeClock
) -> None:
    limits = {"max_requests_per_file": 50_000, "max_bytes_per_file": 200_000_000}
    limits.update(settings)
    with FakeBatchServer(
        RuleAwareFakeChatModel(),
        max_requests_per_file=limits["max_requests_per_file"],
        max_bytes_per_file=limits["max_bytes_per_file"],
    ) as server:
        judge = _judge(server)
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock, **settings))
    assert len(report.files) == len(report.batch_ids) > 1
    assert sum(f.requests for f in report.files) == 12
    assert all(f.bytes <= limits["max_bytes_per_file"] for f in report.files)
    if sizes is not None:
        assert [f.requests for f in report.files] == sizes
    assert report.from_batch == 12
    assert report.failed_batch_ids == []  # the server's limits held
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


def test_a_request_larger_than_a_file_is_refused_before_anything_is_sent(
    server: FakeBatchServer, clock: FakeClock
) -> None:
    with pytest.raises(BatchLaneError, match="max_bytes_per_file=1,000"):
        judge_in_batch(
            _judge(server), PAIRS, settings=_settings(clock, max_bytes_per_file=1000)
        )
    assert server.hits["POST /v1/files"] == 0


# --- polling --------------------------------------------------------------------------


def test_polling_reports_progress_and_waits_on_the_injected_clock(
    clock: FakeClock,
) -> None:
    seen: list[BatchProgress] = []
    with FakeBatchServer(RuleAwareFakeChatModel(), [BatchScript(polls=3)]) as server:
        judge_in_batch(
            _judge(server), PAIRS, settings=_settings(clock), progress=seen.append
        )
    assert [(p.status, p.completed, p.total) for p in seen] == [
        ("in_progress", 3, 12),
        ("in_progress", 6, 12),
        ("in_progress", 9, 12),
        ("completed", 12, 12),
    ]
    assert [p.waited for p in seen] == [0.0, 30.0, 60.0, 90.0]
    assert clock.sleeps == [30.0, 30.0, 30.0]


def test_max_wait_returns_with_the_batch_running_and_the_next_call_collects_it(
    clock: FakeClock,
) -> None:
    with FakeBatchServer(RuleAwareFakeChatModel(), [BatchScript(polls=4)]) as server:
        judge = _judge(server)
        first = judge_in_batch(judge, PAIRS, settings=_settings(clock, max_wait=60))
        assert not first.complete
        assert (first.sent, first.pending, first.from_batch) == (12, 12, 0)
        assert first.running_batch_ids == ["batch_1"]
        assert server.hits[CHAT] == 0  # nothing is judged online meanwhile
        second = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert second.complete
    assert (second.sent, second.from_batch) == (0, 12)
    assert second.resumed_batch_ids == ["batch_1"]
    assert server.hits["POST /v1/batches"] == 1


# --- what comes back without an answer ------------------------------------------------


def test_an_expired_batch_gives_its_partial_output_and_the_rest_is_judged_online(
    clock: FakeClock,
) -> None:
    script = BatchScript(polls=1, end="expired", answered=5)
    with FakeBatchServer(RuleAwareFakeChatModel(), [script]) as server:
        judge = _judge(server)
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
        online = server.hits[CHAT]
    assert (report.from_batch, report.online, report.failed) == (5, 7, 0)
    assert report.line_failures == {"batch_expired": 7}
    assert online == 7
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


def test_a_cancelled_batch_is_collected_and_the_rest_judged_online(
    clock: FakeClock, tmp_path: Path
) -> None:
    script = BatchScript(polls=5, answered=4)
    with FakeBatchServer(RuleAwareFakeChatModel(), [script]) as server:
        judge = _judge(server, cache=SQLiteVerdictCache(tmp_path / "cache.sqlite"))
        submitted = judge_in_batch(judge, PAIRS, settings=_settings(clock, max_wait=0))
        assert submitted.pending == 12
        client = openai.OpenAI(base_url=server.base_url, api_key="unused")
        assert judge.cache is not None
        assert cancel_batches(judge.cache, client=client) == ["batch_1"]
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert (report.from_batch, report.online) == (4, 8)
    assert report.line_failures == {"batch_cancelled": 8}
    assert report.resumed_batch_ids == ["batch_1"]
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


def test_lines_with_an_http_error_are_judged_online(clock: FakeClock) -> None:
    script = BatchScript(line_status=lambda b: 500 if _rule_of(b) == "R-1" else 200)
    with FakeBatchServer(RuleAwareFakeChatModel(), [script]) as server:
        judge = _judge(server)
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
        online = [_rule_of(b) for b in server.requests[9:]]
    assert report.line_failures == {"HTTP 500": 3}
    assert (report.from_batch, report.online) == (9, 3)
    assert online == ["R-1"] * 3
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


def test_an_unreadable_answer_is_judged_online_never_taken_for_no(
    clock: FakeClock,
) -> None:
    # R-0's first answer on each input is prose no parser reads; then it answers.
    model = RuleAwareFakeChatModel(faults={"R-0": ["Hmm."] * 3})
    with FakeBatchServer(model) as server:
        judge = _judge(server)
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert report.line_failures == {"unreadable": 3}
    assert (report.from_batch, report.online, report.failed) == (9, 3, 0)
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


def test_an_answer_unreadable_online_too_is_flagged_not_cached(
    clock: FakeClock,
) -> None:
    model = RuleAwareFakeChatModel(faults={"R-0": ["Hmm."] * 20})
    with FakeBatchServer(model) as server:
        judge = _judge(server, on_error="not_applicable")
        with pytest.warns(UserWarning, match="judgments failed"):
            report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert (report.online, report.failed) == (3, 3)
    assert judge.cache is not None
    keys = [judge.cache_key(text, RULES[0]) for text in TEXTS]
    assert judge.cache.mget(keys) == [None, None, None]  # judged again next time


@pytest.mark.parametrize(
    ("script", "limit", "reason"),
    [
        (BatchScript(end="failed"), 50_000, "scripted"),
        (BatchScript(), 5, "too_many_requests"),
    ],
    ids=["scripted", "over-the-limit"],
)
def test_a_batch_refused_at_validation_is_a_clear_error(
    script: BatchScript, limit: int, reason: str, clock: FakeClock
) -> None:
    with FakeBatchServer(
        RuleAwareFakeChatModel(), [script], max_requests_per_file=limit
    ) as server:
        judge = _judge(server)
        with pytest.raises(BatchFailedError, match=rf"batch_1: {reason}") as raised:
            judge_in_batch(judge, PAIRS, settings=_settings(clock))
        assert server.hits[CHAT] == 0  # not 12 judgments at the online price
    assert raised.value.report.failed_batch_ids == ["batch_1"]
    assert "Nothing in them was run" in str(raised.value)
    kept = _kept(server, judge.cache)
    assert kept.records() == []
    assert kept.answered(judge.cache_key(*pair) for pair in PAIRS) == set()


# --- resuming -------------------------------------------------------------------------

_KILLED_RUN = """
import os, sys
from langchain_openai import ChatOpenAI
from langchain_tag import Rule
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.batch import BatchSettings, judge_in_batch
from langchain_tag.cache import SQLiteVerdictCache

base_url, path = sys.argv[1], sys.argv[2]
rules = [
    Rule(rule_id=f"R-{i}", name=f"Rule {i}",
         condition=f"The input contains `trigger-{i}`", action=f"SECRET-ACTION-{i}")
    for i in range(4)
]
texts = ["trigger-0 and trigger-2", "trigger-1 only", "nothing at all"]
llm = ChatOpenAI(base_url=base_url, api_key="unused", model="gpt-4o-mini")
judge = ApplicabilityJudge(llm=llm, cache=SQLiteVerdictCache(path))
judge_in_batch(
    judge,
    [(t, r) for t in texts for r in rules],
    settings=BatchSettings(poll_interval=0),
    progress=lambda _: os.kill(os.getpid(), 9),  # killed at its first poll
)
"""


def test_a_run_killed_after_creating_its_batch_is_resumed_not_paid_again(
    clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "cache.sqlite"
    with FakeBatchServer(RuleAwareFakeChatModel(), [BatchScript(polls=2)]) as server:
        killed = subprocess.run(  # noqa: S603 - our own interpreter and script
            [sys.executable, "-c", textwrap.dedent(_KILLED_RUN), server.base_url, path],
            capture_output=True,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            timeout=120,
        )
        assert killed.returncode == -9, killed.stderr.decode()[-2000:]
        assert server.hits["POST /v1/batches"] == 1
        judge = _judge(server, cache=SQLiteVerdictCache(path))
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert server.hits["POST /v1/batches"] == 1
    assert server.hits["POST /v1/files"] == 1
    assert report.resumed_batch_ids == ["batch_1"]
    assert (report.sent, report.from_batch, report.online) == (0, 12, 0)
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


class _Killed(BaseException):
    """The process dies here."""


def _killed(**_: Any) -> Any:
    raise _Killed


def test_a_batch_created_but_not_recorded_is_adopted_not_created_again(
    clock: FakeClock, server: FakeBatchServer
) -> None:
    # A run killed between creating its batch and recording the batch's id.
    judge = _judge(server)
    assert judge.cache is not None
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    created = client.batches.create
    client.batches.create = _killed  # type: ignore[method-assign]
    with pytest.raises(_Killed):
        judge_in_batch(judge, PAIRS, client=client, settings=_settings(clock))
    (record,) = _kept(server, judge.cache).records()
    assert (record.batch_id, record.state) == (None, "uploaded")
    created(
        input_file_id=record.input_file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    client.batches.create = created  # type: ignore[method-assign]
    report = judge_in_batch(judge, PAIRS, client=client, settings=_settings(clock))
    assert server.hits["POST /v1/batches"] == 1
    assert (report.sent, report.from_batch) == (0, 12)


def test_a_file_uploaded_but_never_batched_gets_its_batch_on_resume(
    clock: FakeClock, server: FakeBatchServer
) -> None:
    judge = _judge(server)
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    created = client.batches.create
    client.batches.create = _killed  # type: ignore[method-assign]
    with pytest.raises(_Killed):
        judge_in_batch(judge, PAIRS, client=client, settings=_settings(clock))
    client.batches.create = created  # type: ignore[method-assign]
    report = judge_in_batch(judge, PAIRS, client=client, settings=_settings(clock))
    assert (server.hits["POST /v1/files"], server.hits["POST /v1/batches"]) == (1, 1)
    assert (report.sent, report.from_batch) == (0, 12)


def test_answers_downloaded_before_a_kill_are_read_without_any_request(
    clock: FakeClock, server: FakeBatchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = _judge(server)

    def killed(*_: Any) -> Any:
        raise _Killed

    with monkeypatch.context() as patched:
        patched.setattr(ApplicabilityJudge, "remember_answers", killed)
        with pytest.raises(_Killed):
            judge_in_batch(judge, PAIRS, settings=_settings(clock))
    before = sum(server.hits.values())
    report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert sum(server.hits.values()) == before
    assert (report.sent, report.from_batch, report.online) == (0, 12, 0)
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]
    kept = _kept(server, judge.cache)
    assert kept.records() == []
    assert kept.answered(judge.cache_key(*pair) for pair in PAIRS) == set()


def _as_the_previous_version_left_it(path: Path) -> None:
    """Records and answers moved back into the cache's table, as keys; no tables."""
    with sqlite3.connect(path) as db:
        jobs = db.execute(
            "SELECT lane, endpoint, input_file_id, batch_id, custom_ids, created "
            "FROM batch_jobs"
        ).fetchall()
        answers = db.execute("SELECT lane, custom_id, body FROM batch_job_answers")
        keys = [
            (
                f"tag-batch:job:{lane}:{file_id}",
                json.dumps(
                    {
                        "lane": lane,
                        "endpoint": endpoint,
                        "file_id": file_id,
                        "batch_id": batch_id,
                        "custom_ids": json.loads(ids),
                        "created": created,
                    }
                ),
            )
            for lane, endpoint, file_id, batch_id, ids, created in jobs
        ]
        keys += [(f"tag-batch:answer:{lane}:{i}", body) for lane, i, body in answers]
        db.executemany(
            "INSERT INTO verdicts (key, verdict, created) VALUES (?, ?, 0)", keys
        )
        db.execute("DROP TABLE batch_jobs")
        db.execute("DROP TABLE batch_job_answers")


def test_a_run_resumes_what_the_previous_version_recorded_in_the_cache(
    clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # That version kept records and answers as `tag-batch:` keys of the cache: the
    # first run of this one moves them into its tables, and pays for nothing again.
    path = tmp_path / "cache.sqlite"
    scripts = [BatchScript(), BatchScript(polls=3)]
    with FakeBatchServer(RuleAwareFakeChatModel(), scripts) as server:
        earlier = _judge(server, cache=SQLiteVerdictCache(path))

        def killed(*_: Any) -> Any:
            raise _Killed

        with monkeypatch.context() as patched:  # answers downloaded, not yet read
            patched.setattr(ApplicabilityJudge, "remember_answers", killed)
            with pytest.raises(_Killed):
                judge_in_batch(earlier, PAIRS[:4], settings=_settings(clock))
        running = judge_in_batch(
            earlier, PAIRS[4:], settings=_settings(clock, max_wait=0)
        )
        assert running.running_batch_ids == ["batch_2"]
        _as_the_previous_version_left_it(path)
        cache = SQLiteVerdictCache(path)
        assert len(list(cache.yield_keys(prefix="tag-batch:answer:"))) == 4
        judge = _judge(server, cache=cache)
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert (report.sent, report.from_batch, report.online) == (0, 12, 0)
    assert report.resumed_batch_ids == ["batch_2"]
    assert (server.hits["POST /v1/files"], server.hits["POST /v1/batches"]) == (2, 2)
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]
    assert not list(cache.yield_keys(prefix="tag-batch:"))


# --- usage and callbacks --------------------------------------------------------------


def test_usage_counts_the_cached_input_tokens_the_answers_report(
    server: FakeBatchServer, clock: FakeClock
) -> None:
    # A long input: each judgment's prompt is over 1,024 tokens, and the rules after
    # the first of an input find its prefix cached.
    text = "trigger-1 " + "lorem ipsum dolor sit amet " * 200
    counter = UsageCounter()
    pairs = [(text, rule) for rule in RULES]
    report = judge_in_batch(
        _judge(server), pairs, settings=_settings(clock), config=counter.watch()
    )
    assert report.usage.calls == 4
    assert report.usage.input_tokens is not None
    assert report.usage.input_tokens > 4 * 1024
    assert report.usage.cached_input_tokens is not None
    assert report.usage.cached_input_tokens >= 3 * 1024
    assert counter.usage == report.usage  # each answer is a run the callbacks see


# --- refusals -------------------------------------------------------------------------


def test_judges_the_batch_api_cannot_serve_are_refused_clearly(
    server: FakeBatchServer,
) -> None:
    local = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    with pytest.raises(BatchLaneError, match=r"must be langchain_openai\.ChatOpenAI"):
        judge_in_batch(local, PAIRS)
    cascade = CascadeJudge(cheap=local, strong=local, unscored="final")
    with pytest.raises(BatchLaneError, match="CascadeJudge decides otherwise"):
        judge_in_batch(cascade, PAIRS)
    with pytest.raises(BatchLaneError, match="rules_per_call=1"):
        judge_in_batch(_judge(server, rules_per_call=2), PAIRS)
    with pytest.raises(BatchLaneError, match="cache=None"):
        judge_in_batch(_judge(server, cache=None), PAIRS)
    small = _judge(server, cache=InMemoryVerdictCache(maxsize=5))
    with pytest.raises(BatchLaneError, match="holds 5 entries, fewer than the 12"):
        judge_in_batch(small, PAIRS)
    responses = _judge(server, llm_changes={"use_responses_api": True})
    with pytest.raises(BatchLaneError, match="Responses API"):
        judge_in_batch(responses, PAIRS)
    with pytest.raises(BatchLaneError, match="the executor's model must be"):
        execute_in_batch(
            ActionOnlyExecutor(llm=RuleAwareFakeChatModel()),
            [(TEXTS[0], RULES)],
            store=InMemoryVerdictCache(),
        )
    assert sum(server.hits.values()) == 0


# --- the executor ---------------------------------------------------------------------


def test_executions_in_batch_are_the_online_calls_and_are_paid_once(
    server: FakeBatchServer, clock: FakeClock, tmp_path: Path
) -> None:
    executor = ActionOnlyExecutor(llm=_llm(server))
    items = [(text, RULES[:2]) for text in TEXTS] + [(TEXTS[0], RULES[:2])]
    expected = [executor.invoke({"input": t, "rules": r}) for t, r in items]
    posted = server.requests[:3]
    store = SQLiteVerdictCache(tmp_path / "answers.sqlite")
    outputs, report = execute_in_batch(
        executor, items, store=store, settings=_settings(clock)
    )
    assert outputs == expected
    assert [line["body"] for line in server.input_lines("batch_1")] == posted
    assert (report.requests, report.sent, report.from_batch) == (3, 3, 3)
    again, repeat = execute_in_batch(
        executor, items, store=store, settings=_settings(clock)
    )
    assert again == expected
    assert (repeat.cached, repeat.sent) == (3, 0)
    assert server.hits["POST /v1/batches"] == 1


def test_executions_whose_line_failed_run_online(
    clock: FakeClock, tmp_path: Path
) -> None:
    script = BatchScript(
        line_status=lambda b: 503 if "nothing at all" in json.dumps(b) else 200
    )
    with FakeBatchServer(RuleAwareFakeChatModel(), [script]) as server:
        executor = ActionOnlyExecutor(llm=_llm(server))
        items = [(text, RULES[:2]) for text in TEXTS]
        outputs, report = execute_in_batch(
            executor,
            items,
            store=SQLiteVerdictCache(tmp_path / "answers.sqlite"),
            settings=_settings(clock),
        )
        online = server.hits[CHAT]
    assert (report.from_batch, report.online) == (2, 1)
    assert report.line_failures == {"HTTP 503": 1}
    assert online == 1
    assert all(isinstance(o, str) and o.startswith("ANSWER:") for o in outputs)


# --- the fake itself ------------------------------------------------------------------


def test_the_fake_lists_batches_newest_first_in_pages(
    server: FakeBatchServer,
) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}
    content = json.dumps({**line, "body": {"model": "m", "messages": []}}) + "\n"
    ids = []
    for _ in range(3):
        file = client.files.create(file=("in.jsonl", content.encode()), purpose="batch")
        ids.append(
            client.batches.create(
                input_file_id=file.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            ).id
        )
    assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]
    assert client.files.content(file.id).text == content
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_404")


# --- shards sharing a store -----------------------------------------------------------


def test_shards_sharing_a_store_never_collect_each_others_batches(
    clock: FakeClock, tmp_path: Path
) -> None:
    scripts = [BatchScript(polls=5), BatchScript()]
    with FakeBatchServer(RuleAwareFakeChatModel(), scripts) as server:
        path = tmp_path / "cache.sqlite"
        first = _judge(server, cache=SQLiteVerdictCache(path))
        running = judge_in_batch(
            first, PAIRS[:4], settings=_settings(clock, max_wait=0)
        )
        assert running.running_batch_ids == ["batch_1"]
        polled = server.batches["batch_1"].polls
        second = _judge(server, cache=SQLiteVerdictCache(path))
        report = judge_in_batch(second, PAIRS[4:], settings=_settings(clock))
        assert server.batches["batch_1"].polls == polled  # never polled, not waited for
        assert (report.batch_ids, report.resumed_batch_ids) == (["batch_2"], [])
        assert (report.from_batch, report.pending) == (8, 0)
        # The first shard's record is still there for it to collect.
        resumed = judge_in_batch(first, PAIRS[:4], settings=_settings(clock))
    assert resumed.resumed_batch_ids == ["batch_1"]
    assert _cached(first, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


def test_a_record_without_a_batch_gets_one_only_after_the_grace_period(
    clock: FakeClock, server: FakeBatchServer
) -> None:
    # Another process uploaded the file and is about to create its batch: this
    # call waits `adopt_grace` before paying for one itself.
    judge = _judge(server)
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    created = client.batches.create
    client.batches.create = _killed  # type: ignore[method-assign]
    with pytest.raises(_Killed):
        judge_in_batch(judge, PAIRS, client=client, settings=_settings(clock))
    client.batches.create = created  # type: ignore[method-assign]
    waiting = judge_in_batch(
        judge, PAIRS, client=client, settings=_settings(clock, max_wait=240)
    )
    assert server.hits["POST /v1/batches"] == 0
    assert (waiting.sent, waiting.pending, waiting.online) == (0, 12, 0)
    start = clock.now
    report = judge_in_batch(judge, PAIRS, client=client, settings=_settings(clock))
    assert server.hits["POST /v1/batches"] == 1
    assert clock.now - start >= 300  # the default grace, on the injected clock
    assert (report.sent, report.from_batch) == (0, 12)


# --- transient errors -----------------------------------------------------------------


def test_transient_errors_while_polling_and_downloading_are_polled_through(
    clock: FakeClock, server: FakeBatchServer
) -> None:
    server.faults = {
        "GET /v1/batches/{id}": [503, 503],
        "GET /v1/files/{id}/content": [502],
    }
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    judge = _judge(server)
    report = judge_in_batch(judge, PAIRS, client=client, settings=_settings(clock))
    assert server.faults == {
        "GET /v1/batches/{id}": [],
        "GET /v1/files/{id}/content": [],
    }
    assert (report.from_batch, report.online) == (12, 0)
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


def test_the_model_s_client_gets_retries_back_for_files_and_batches(
    server: FakeBatchServer,
) -> None:
    from langchain_tag.batch._requests import sdk_client  # noqa: PLC0415

    assert sdk_client(_llm(server, max_retries=0), "judge").max_retries == 2
    assert sdk_client(_llm(server, max_retries=5), "judge").max_retries == 5


def test_online_executions_are_retried(clock: FakeClock, tmp_path: Path) -> None:
    script = BatchScript(
        line_status=lambda b: 503 if "nothing at all" in json.dumps(b) else 200
    )
    refusals = [Refusal(status=503, headers={})]

    def refuse(_: dict[str, Any]) -> Refusal | None:
        return refusals.pop() if refusals else None

    with FakeBatchServer(RuleAwareFakeChatModel(), [script], refuse=refuse) as server:
        executor = ActionOnlyExecutor(llm=_llm(server, max_retries=0))
        outputs, report = execute_in_batch(
            executor,
            [(text, RULES[:2]) for text in TEXTS],
            store=SQLiteVerdictCache(tmp_path / "answers.sqlite"),
            settings=_settings(clock),
            retry=CallRetry(max_attempts=2, initial_delay=0, jitter=0),
        )
        assert server.hits[CHAT] == 2  # refused once, then answered
    assert (report.online, report.failed) == (1, 0)
    assert all(isinstance(o, str) and o.startswith("ANSWER:") for o in outputs)


# --- malformed answers ----------------------------------------------------------------


def test_a_malformed_stored_judge_answer_is_judged_online_and_forgotten(
    server: FakeBatchServer, clock: FakeClock
) -> None:
    judge = _judge(server)
    key = judge.cache_key(*PAIRS[0])
    _store_answer(judge.cache, "judge", key, '{"not": "a chat completion"}')
    report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert (report.sent, report.from_batch, report.online) == (11, 11, 1)
    assert report.line_failures == {"unreadable": 1}
    assert _kept(server, judge.cache).answered([key]) == set()
    assert _cached(judge, PAIRS) == [TRUTH[t, r.rule_id] for t, r in PAIRS]


def test_a_malformed_stored_execution_answer_is_executed_online_and_forgotten(
    server: FakeBatchServer, clock: FakeClock, tmp_path: Path
) -> None:
    executor = ActionOnlyExecutor(llm=_llm(server))
    items = [(text, RULES[:2]) for text in TEXTS]
    store = SQLiteVerdictCache(tmp_path / "answers.sqlite")
    expected, _ = execute_in_batch(
        executor, items, store=store, settings=_settings(clock)
    )
    with sqlite3.connect(store.path) as db:
        ((key,),) = db.execute("SELECT min(custom_id) FROM batch_job_answers")
    _store_answer(store, "execute", key, '{"choices": "none"}')
    outputs, report = execute_in_batch(
        executor, items, store=store, settings=_settings(clock)
    )
    assert outputs == expected
    assert (report.cached, report.online) == (3, 1)
    assert report.line_failures == {"unreadable": 1}
    assert _kept(server, store, "execute").answered([key]) == set()


def test_execution_answers_are_read_in_slices(
    server: FakeBatchServer,
    clock: FakeClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lane, "_READ_SLICE", 2)
    read: list[int] = []
    answers = BatchJobs.answers

    def counted(jobs: BatchJobs, custom_ids: Any) -> Any:
        found = answers(jobs, custom_ids)
        read.append(len(found))
        return found

    monkeypatch.setattr(BatchJobs, "answers", counted)
    executor = ActionOnlyExecutor(llm=_llm(server))
    items = [(f"{text} #{i}", RULES[:2]) for i in range(3) for text in TEXTS]
    outputs, report = execute_in_batch(
        executor,
        items,
        store=SQLiteVerdictCache(tmp_path / "answers.sqlite"),
        settings=_settings(clock),
    )
    assert report.from_batch == 9
    assert all(isinstance(o, str) and o.startswith("ANSWER:") for o in outputs)
    assert sum(read) == 9
    assert max(read) <= 2


def test_the_fake_allocates_batch_ids_atomically(
    server: FakeBatchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both creates validate at once; each must still get its own id.
    both = threading.Barrier(2, timeout=10)
    validate = server._validate

    def validated(*args: Any) -> Any:
        both.wait()
        return validate(*args)

    monkeypatch.setattr(server, "_validate", validated)
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}
    content = json.dumps({**line, "body": {"model": "m", "messages": []}}).encode()
    files = [
        client.files.create(file=("in.jsonl", content), purpose="batch").id
        for _ in range(2)
    ]
    with ThreadPoolExecutor(2) as pool:
        ids = list(
            pool.map(
                lambda file_id: (
                    client.batches.create(
                        input_file_id=file_id,
                        endpoint="/v1/chat/completions",
                        completion_window="24h",
                    ).id
                ),
                files,
            )
        )
    assert sorted(ids) == ["batch_1", "batch_2"]
    assert sorted(b.input_file_id for b in client.batches.list()) == sorted(files)
