"""SmolLM2-135M behind llama-cpp-python's OpenAI-compatible server, over real HTTP.

`ChatOpenAI(base_url=...)` drives `ApplicabilityJudge` and `TAGRetriever` against a
`LocalOpenAIServer` on loopback. SmolLM2-135M judges poorly, so these tests assert
the protocol, not the verdicts: each judgment is a decision read from the model's
answer or a flagged failure, never a crash and never a NO nobody answered.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import LLMResult

from langchain_tag import Rule, Rulebook, TAGRetriever
from langchain_tag.errors import JudgmentError, LocalServerError, UnreliableMatchWarning
from langchain_tag.local_model import JSON_RESPONSE_FORMAT, LocalOpenAIServer
from langchain_tag.matching import ApplicabilityJudge, Verdict
from langchain_tag.models import CallRetry
from tests.integration_tests.servers import LLAMA_SERVER_PACKAGES, skip_unless_installed

skip_unless_installed(LLAMA_SERVER_PACKAGES)

pytestmark = pytest.mark.server

SNIPPET = "from os import *\n\nif x == None:\n    pass\n"
FAST_RETRY = CallRetry(max_attempts=2, initial_delay=0.01, jitter=0.0)


class Recorder(BaseCallbackHandler):
    """Counts model calls in flight and keeps each judgment's raw answer."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.rule_of: dict[UUID, str] = {}
        self.answers: dict[str, str] = {}

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.rule_of[run_id] = (metadata or {}).get("tag_rule_id", "")

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self.lock:
            self.in_flight -= 1
            self.answers[self.rule_of[run_id]] = response.generations[0][0].text

    def on_llm_error(
        self, error: BaseException, *, run_id: UUID, **kwargs: Any
    ) -> None:
        with self.lock:
            self.in_flight -= 1


@pytest.fixture(scope="module")
def server() -> Iterator[LocalOpenAIServer]:
    with LocalOpenAIServer() as running:
        yield running


def judged(verdicts: list[Verdict], recorder: Recorder) -> None:
    """Every verdict is the model's own answer, read, or a flagged failure."""
    for verdict in verdicts:
        if verdict.failed:
            assert verdict.applies is False
            assert verdict.error
            continue
        answer = json.loads(recorder.answers[verdict.rule_id])
        assert str(answer["verdict"]).lower() == ("yes" if verdict.applies else "no")


# --- structured and JSON output -----------------------------------------------------


def _flagged_then_raised(
    judge: ApplicabilityJudge, rule: Rule
) -> tuple[Verdict, JudgmentError]:
    """One failing judgment under each error policy, after the policy's retries."""
    with pytest.warns(UnreliableMatchWarning):
        verdict = judge.invoke((SNIPPET, rule))
    assert verdict.failed
    assert "after 2 attempt(s)" in (verdict.error or "")
    raising = judge.model_copy(update={"on_error": "raise"})
    with pytest.raises(JudgmentError) as error:
        raising.invoke((SNIPPET, rule))
    return verdict, error.value


def test_structured_output_is_refused_and_flagged(
    server: LocalOpenAIServer, pep8_rulebook: Rulebook
) -> None:
    """ChatOpenAI's structured output sends `json_schema`; llama.cpp answers 500."""
    rule = pep8_rulebook.rules[1]
    judge = ApplicabilityJudge(
        llm=server.chat_model(max_retries=0),
        retry=FAST_RETRY,
        on_error="not_applicable",
        cache=None,
    )
    verdict, error = _flagged_then_raised(judge, rule)
    assert "response_format" in (verdict.error or "")
    assert "response_format" in str(error)
    assert error.rule_id == rule.rule_id


def test_json_constrained_verdicts_carry_logprob_scores(
    server: LocalOpenAIServer, pep8_rulebook: Rulebook
) -> None:
    recorder = Recorder()
    judge = server.judge(cache=None)
    rules = pep8_rulebook.rules[:3]
    verdicts = judge.judge_rules(SNIPPET, rules, {"callbacks": [recorder]})
    # The grammar makes every answer a verdict, and "yes"/"no" are single tokens.
    assert [v.failed for v in verdicts] == [False] * len(rules)
    judged(verdicts, recorder)
    for verdict in verdicts:
        assert verdict.score is not None
        assert 0.0 <= verdict.score <= 1.0


def test_free_json_is_read_or_flagged(
    server: LocalOpenAIServer, pep8_rulebook: Rulebook
) -> None:
    """JSON mode without a schema: any object, which may hold no verdict."""
    recorder = Recorder()
    judge = ApplicabilityJudge(
        llm=server.chat_model(response_format=JSON_RESPONSE_FORMAT, max_tokens=64),
        structured_output="never",
        on_error="not_applicable",
        cache=None,
    )
    rules = pep8_rulebook.rules[:3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreliableMatchWarning)
        verdicts = judge.judge_rules(SNIPPET, rules, {"callbacks": [recorder]})
    for verdict in verdicts:
        answer = recorder.answers[verdict.rule_id]
        json.loads(answer)  # JSON mode held, whatever the object says
        if verdict.failed:
            assert (verdict.error or "").startswith("unparseable judge output")
        else:
            expected = "yes" if verdict.applies else "no"
            assert expected in answer.lower()


# --- concurrency, timeouts, a dying server ------------------------------------------


async def test_retriever_keeps_several_judgments_in_flight_within_its_limit(
    server: LocalOpenAIServer, pep8_rulebook: Rulebook
) -> None:
    recorder = Recorder()
    judge = server.judge(cache=None)
    retriever = TAGRetriever(rulebook=pep8_rulebook, judge=judge, max_concurrency=3)
    result = await retriever.amatch(SNIPPET, {"callbacks": [recorder]})
    assert result.candidates == len(result.verdicts) == len(pep8_rulebook)
    assert result.failed_rule_ids == []
    judged(result.verdicts, recorder)
    # The server answers one request at a time; the client keeps three waiting.
    assert recorder.peak == 3
    assert {d.metadata["rule_id"] for d in result.documents} == {
        v.rule_id for v in result.verdicts if v.applies
    }


def test_timeouts_are_retried_then_flagged_or_raised(
    server: LocalOpenAIServer, pep8_rulebook: Rulebook
) -> None:
    rule = pep8_rulebook.rules[0]
    judge = server.judge(
        model_options={"timeout": 0.001, "max_retries": 0},
        logprobs=False,
        retry=FAST_RETRY,
        on_error="not_applicable",
        cache=None,
    )
    verdict, error = _flagged_then_raised(judge, rule)
    assert "Timeout" in (verdict.error or "")
    assert error.transient  # an outer retry may try again later


async def test_a_server_killed_mid_batch_leaves_flagged_failures(
    pep8_rulebook: Rulebook,
) -> None:
    recorder = Recorder()
    with LocalOpenAIServer() as dying:
        assert dying.pid is not None
        group: int = dying.pid

        class KillAfterFirstAnswer(BaseCallbackHandler):
            def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
                # Process group: the server and anything it forked. A second
                # answer may have been on its way already.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)

        judge = dying.judge(
            model_options={"max_retries": 0},
            logprobs=False,
            retry=FAST_RETRY,
            on_error="not_applicable",
            cache=None,
        )
        with pytest.warns(UnreliableMatchWarning):
            verdicts = await judge.ajudge_rules(
                SNIPPET,
                pep8_rulebook.rules,
                {"callbacks": [recorder, KillAfterFirstAnswer()], "max_concurrency": 2},
            )
        failed = [v for v in verdicts if v.failed]
        # What was answered before the kill is read; everything after is flagged.
        assert len(verdicts) - len(failed) == len(recorder.answers) >= 1
        assert failed
        for verdict in failed:
            assert "Connection" in (verdict.error or "")
        judged(verdicts, recorder)

        raising = judge.model_copy(update={"on_error": "raise"})
        with pytest.raises(JudgmentError) as error:
            await raising.ajudge_rules(SNIPPET, pep8_rulebook.rules[:2])
        assert error.value.transient


def test_a_server_that_cannot_load_its_model_reports_its_log(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a GGUF file")
    with pytest.raises(LocalServerError, match="exited with") as error:
        LocalOpenAIServer(bogus, startup_timeout=60).start()
    assert "its log ends" in str(error.value)
