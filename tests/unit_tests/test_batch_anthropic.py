"""The batch lane on Anthropic's Message Batches, against a loopback fake of them.

Every test talks HTTP to a `FakeAnthropicBatchServer` on 127.0.0.1 through the
real `anthropic` SDK and `ChatAnthropic`; polling waits on a `FakeClock`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from langchain_anthropic import ChatAnthropic

from langchain_tag import Rule
from langchain_tag.batch import (
    BatchFailedError,
    BatchLaneError,
    BatchSettings,
    cancel_batches,
    execute_in_batch,
    judge_in_batch,
)
from langchain_tag.batch._anthropic import AnthropicBatches, AnthropicCall
from langchain_tag.batch._providers import BATCH_DISCOUNT, provider_for
from langchain_tag.batch._records import JobRecord, job_records
from langchain_tag.cache import SQLiteVerdictCache
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.matching import ApplicabilityJudge, Verdict
from langchain_tag.models import CallRetry
from langchain_tag.testing import (
    BatchScript,
    FakeAnthropicBatchServer,
    FakeClock,
    RuleAwareFakeChatModel,
)

RULES = [
    Rule(
        rule_id=f"R-{i}",
        name=f"Rule {i}",
        condition=f"The input contains `trigger-{i}`",
        action=f"SECRET-ACTION-{i}",
    )
    for i in range(3)
]
TEXTS = ["trigger-0 and trigger-2", "trigger-1 only", "nothing at all"]
PAIRS = [(text, rule) for text in TEXTS for rule in RULES]
TRUTH = [f"trigger-{r.rule_id[-1]}" in t for t, r in PAIRS]
ONLINE = "POST /v1/messages"
CREATE = "POST /v1/messages/batches"
POLL = "GET /v1/messages/batches/{id}"

pytestmark = pytest.mark.usefixtures("loopback")  # the fake API, on 127.0.0.1


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server() -> Iterator[FakeAnthropicBatchServer]:
    with FakeAnthropicBatchServer(RuleAwareFakeChatModel()) as fake:
        yield fake


def _llm(server: FakeAnthropicBatchServer, **changes: Any) -> ChatAnthropic:
    return ChatAnthropic(
        **{
            "model_name": "claude-haiku-4-5",
            "api_key": "unused",
            "base_url": server.base_url,
            "max_tokens": 64,
            **changes,
        }
    )


def _judge(server: FakeAnthropicBatchServer, **changes: Any) -> ApplicabilityJudge:
    options: dict[str, Any] = {
        "llm": _llm(server),
        "retry": CallRetry(max_attempts=2, initial_delay=0, jitter=0),
    }
    return ApplicabilityJudge(**{**options, **changes})


def _settings(clock: FakeClock, **changes: Any) -> BatchSettings:
    return BatchSettings(
        **{"poll_interval": 30.0, "sleep": clock.sleep, "clock": clock.time, **changes}
    )


def _cached(judge: ApplicabilityJudge) -> list[bool]:
    assert judge.cache is not None
    stored = judge.cache.mget([judge.cache_key(t, r) for t, r in PAIRS])
    assert all(value is not None for value in stored)
    return [Verdict.model_validate_json(v).applies for v in stored if v is not None]


# --- what is sent ---------------------------------------------------------------------


def test_a_judgment_s_body_is_the_text_call_chat_anthropic_sends(
    server: FakeAnthropicBatchServer,
) -> None:
    text, rule = TEXTS[0], RULES[2]
    judge = _judge(server)
    body = AnthropicCall.of_judge(judge).body(judge.messages(text, rule))
    system, user = judge.messages(text, rule)
    assert body == {
        "model": "claude-haiku-4-5",
        "max_tokens": 64,
        "temperature": 0.0,
        "system": system.content,
        "messages": [{"role": "user", "content": user.content}],
    }
    assert "SECRET-ACTION" not in json.dumps(body)
    # What ChatAnthropic itself sends for the judge's text call, byte for byte.
    _judge(server, cache=None, structured_output="never").invoke((text, rule))
    assert server.requests[-1] == body


def test_models_the_body_cannot_carry_are_refused(
    server: FakeAnthropicBatchServer,
) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    llm = _llm(server, thinking=thinking, max_tokens=2048)
    judge = _judge(server, llm=llm, structured_output="never")
    with pytest.raises(BatchLaneError, match="also sets thinking"):
        judge_in_batch(judge, PAIRS)
    local = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    with pytest.raises(BatchLaneError, match=r"ChatOpenAI or langchain_anthropic"):
        judge_in_batch(local, PAIRS)
    assert sum(server.hits.values()) == 0


def test_verdicts_are_the_online_run_s_and_no_action_is_ever_sent(
    server: FakeAnthropicBatchServer, clock: FakeClock, tmp_path: Path
) -> None:
    online = [_judge(server, cache=None).invoke(pair).applies for pair in PAIRS]
    assert online == TRUTH
    judge = _judge(server, cache=SQLiteVerdictCache(tmp_path / "v.sqlite"))
    report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert (report.sent, report.from_batch, report.online) == (9, 9, 0)
    assert report.batch_ids == ["msgbatch_1"]
    assert report.usage.calls == 9
    assert _cached(judge) == online
    sent = server.batch_requests("msgbatch_1")
    assert [r["custom_id"] for r in sent] == [judge.cache_key(t, r) for t, r in PAIRS]
    assert "SECRET-ACTION" not in json.dumps(sent)
    assert "SECRET-ACTION" not in json.dumps(server.requests)
    # The records say whose the jobs and answers were.
    with sqlite3.connect(tmp_path / "v.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM batch_jobs").fetchone() == (0,)
    online_calls = server.hits[ONLINE]
    assert [judge.invoke(pair).cached for pair in PAIRS] == [True] * 9
    assert server.hits[ONLINE] == online_calls


# --- resuming -------------------------------------------------------------------------


def test_an_interrupted_poll_is_resumed_and_nothing_is_paid_twice(
    clock: FakeClock, tmp_path: Path
) -> None:
    with FakeAnthropicBatchServer(
        RuleAwareFakeChatModel(), [BatchScript(polls=3)]
    ) as server:
        path = tmp_path / "v.sqlite"
        first = judge_in_batch(
            _judge(server, cache=SQLiteVerdictCache(path)),
            PAIRS,
            settings=_settings(clock, max_wait=30),
        )
        assert not first.complete
        assert (first.sent, first.pending) == (9, 9)
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT provider, batch_id FROM batch_jobs").fetchall()
        assert rows == [("anthropic", "msgbatch_1")]
        server.faults[POLL] = [503]  # the next poll fails once, transiently
        judge = _judge(server, cache=SQLiteVerdictCache(path))  # a new process
        second = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert second.complete
    assert (second.sent, second.from_batch) == (0, 9)
    assert second.resumed_batch_ids == ["msgbatch_1"]
    assert server.hits[CREATE] == 1
    assert server.hits[ONLINE] == 0
    assert _cached(judge) == TRUTH


def test_a_job_a_killed_run_left_without_a_batch_is_dropped_and_done_online(
    server: FakeAnthropicBatchServer, clock: FakeClock
) -> None:
    # Killed between recording the job and creating its batch: Anthropic's
    # batches name no input to find it by, and its requests died with the run.
    judge = _judge(server)
    assert judge.cache is not None
    keys = [judge.cache_key(t, r) for t, r in PAIRS[:2]]
    left = JobRecord(
        provider="anthropic",
        endpoint=str(anthropic.Anthropic(base_url=server.base_url).base_url),
        lane="judge",
        input_file_id="tag-judge-killed",
        custom_ids=keys,
        created=0,
    )
    job_records(judge.cache).save(left)
    settings = _settings(clock, adopt_grace=60)
    report = judge_in_batch(judge, PAIRS, settings=settings)
    assert (report.sent, report.from_batch, report.online) == (7, 7, 2)
    assert report.line_failures == {"no answer": 2}
    assert clock.sleeps == [30.0, 30.0]  # the grace, polled out
    assert job_records(judge.cache).get(left) is None
    assert _cached(judge) == TRUTH


def test_expired_and_errored_requests_are_judged_online(clock: FakeClock) -> None:
    script = BatchScript(
        polls=1,
        end="expired",
        answered=6,
        line_status=lambda params: (
            500 if "trigger-1 only" in json.dumps(params) else 200
        ),
    )
    with FakeAnthropicBatchServer(RuleAwareFakeChatModel(), [script]) as server:
        judge = _judge(server)
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
        online = server.hits[ONLINE]
    assert report.line_failures == {"api_error": 3, "batch_expired": 3}
    assert (report.from_batch, report.online, report.failed) == (3, 6, 0)
    assert online == 6
    assert _cached(judge) == TRUTH


def test_a_refused_batch_raises_and_runs_nothing(clock: FakeClock) -> None:
    with FakeAnthropicBatchServer(
        RuleAwareFakeChatModel(), [BatchScript(end="failed")]
    ) as server:
        with pytest.raises(BatchFailedError, match="Refused by script"):
            judge_in_batch(_judge(server), PAIRS, settings=_settings(clock))
        assert server.hits[ONLINE] == 0


def test_running_batches_are_cancelled_and_their_answers_kept(
    clock: FakeClock, tmp_path: Path
) -> None:
    script = BatchScript(polls=5, answered=4)
    with FakeAnthropicBatchServer(RuleAwareFakeChatModel(), [script]) as server:
        cache = SQLiteVerdictCache(tmp_path / "v.sqlite")
        judge = _judge(server, cache=cache)
        judge_in_batch(judge, PAIRS, settings=_settings(clock, max_wait=0))
        client = anthropic.Anthropic(base_url=server.base_url, api_key="unused")
        assert cancel_batches(cache, client=client) == ["msgbatch_1"]
        assert cancel_batches(cache, client=client) == []  # canceling already
        report = judge_in_batch(judge, PAIRS, settings=_settings(clock))
    assert (report.from_batch, report.online) == (4, 5)
    assert report.line_failures == {"batch_cancelled": 5}
    assert _cached(judge) == TRUTH


# --- the executor ---------------------------------------------------------------------


def test_executions_in_batch_are_the_online_ones(
    server: FakeAnthropicBatchServer, clock: FakeClock, tmp_path: Path
) -> None:
    executor = ActionOnlyExecutor(llm=_llm(server))
    items = [(TEXTS[0], [RULES[0], RULES[2]]), (TEXTS[1], [RULES[1]])]
    online = [executor.invoke({"input": t, "rules": r}) for t, r in items]
    store = SQLiteVerdictCache(tmp_path / "answers.sqlite")
    outputs, report = execute_in_batch(
        executor, items, store=store, settings=_settings(clock)
    )
    assert outputs == online
    assert (report.sent, report.from_batch, report.online) == (2, 2, 0)
    sent = json.dumps(server.batch_requests("msgbatch_1"))
    assert "SECRET-ACTION-2" in sent  # the executor gets the matched actions
    again = execute_in_batch(executor, items, store=store, settings=_settings(clock))
    assert (again.outputs, again.report.cached) == (online, 2)
    assert server.hits[CREATE] == 1


# --- the provider and the fake --------------------------------------------------------


def test_the_provider_is_picked_by_the_model_s_class(
    server: FakeAnthropicBatchServer,
) -> None:
    provider = provider_for(_llm(server, max_retries=0), "judge")
    assert isinstance(provider, AnthropicBatches)
    assert provider.client.max_retries == 2  # the batch calls' retries are back
    assert (provider.name, provider.discount) == ("anthropic", BATCH_DISCOUNT)
    assert BATCH_DISCOUNT == 0.5  # half price at both providers
    assert provider.endpoint.startswith(server.base_url)


def test_the_fake_speaks_the_sdk_s_message_batches(
    server: FakeAnthropicBatchServer,
) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused")
    params: MessageCreateParamsNonStreaming = {
        "model": "claude-haiku-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello"}],
    }
    created = client.messages.batches.create(
        requests=[{"custom_id": "a-1", "params": params}]
    )
    assert (created.processing_status, created.request_counts.processing) == (
        "in_progress",
        1,
    )
    assert [b.id for b in client.messages.batches.list()] == [created.id]
    ended = client.messages.batches.retrieve(created.id)
    ended = client.messages.batches.retrieve(created.id)
    assert (ended.processing_status, ended.request_counts.succeeded) == ("ended", 1)
    (result,) = client.messages.batches.results(created.id)
    assert result.custom_id == "a-1"
    assert result.result.type == "succeeded"
    assert result.result.message.usage.input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("msgbatch_none")
    with pytest.raises(anthropic.BadRequestError, match="repeated"):
        client.messages.batches.create(
            requests=[{"custom_id": "x", "params": params}] * 2
        )
    answer = client.messages.create(**params)
    assert answer.content[0].type == "text"
