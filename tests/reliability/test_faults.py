"""Fault injection: chat models that fail on a schedule, at every stage.

A matrix of fault kind x stage: the judge (through `TAGRetriever`), each extraction
phase and the re-extraction, and the executor (in the query graph). Each case gives
one call of the stage a `FaultSchedule` and asserts what the user sees, how many
calls were retried and with which waits (`time.sleep` is patched onto a fake clock,
so nothing waits), that no failure became a silent NO, and that no completed work
was lost or repeated, after the documented recovery (resume, or re-run) where one
is needed. Every case adds its row to the reliability report.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from langchain_core.documents import Document
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_tag import Rulebook, TAGRetriever, build_query_graph, cli
from langchain_tag.errors import JudgmentError, UnreliableMatchWarning
from langchain_tag.extraction import ExtractionReport, extract_rules
from langchain_tag.extraction.phases import unreadable_problem
from langchain_tag.matching import ApplicabilityJudge, Verdict
from langchain_tag.models import CallRetry
from langchain_tag.query_graph import QueryContext
from langchain_tag.testing import (
    ExtractionFakeChatModel,
    FakeClock,
    FaultSchedule,
    RuleAwareFakeChatModel,
    ScriptedFakeChatModel,
    TransientFakeError,
)
from tests.reliability.report import FaultRow, ReliabilityReport

POLICY = CallRetry()
"""The default policy: 4 attempts, waits of 1, 2, 4 s (+ up to 25% jitter)."""
QUERY = "from os.path import *\n\ntry:\n    join('a', 'b')\nexcept:\n    pass\n"

DOCUMENT = """\
# Team guide

This guide says how the team writes code. It was agreed in a meeting and it is
reviewed every year by the people who maintain the code base.

## Imports

Each import should be on its own line, as in `import os`. Wildcard imports such as
`from os import *` must never be used.

## Naming

Function names should be lowercase, as in `snake_case`. Class names must use the
CapWords convention, as in `MyClass`.

## Errors

Bare `except:` clauses should never be used. Exceptions must derive from
`Exception`, as in `class Oops(Exception)`. Reviewers must reject a bare `except:`
clause in any change they read.
"""
CORRUPT_EVERY = 3
"""For the re-extraction stage: every 3rd rule gets an invented source, so phase 5
removes it and re-extracts its span."""


# --- a clock that patched sleeps advance ---------------------------------------------


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Every `time.sleep` (the judge's and LangGraph's retries) on a fake clock."""
    fake = FakeClock()
    monkeypatch.setattr(time, "sleep", fake.sleep)
    # The fan-out's shared pause after a rate limit is timed on the same clock.
    monkeypatch.setattr(
        "langchain_tag.matching.limiter.time",
        SimpleNamespace(monotonic=fake.time, sleep=fake.sleep),
    )
    return fake


# --- the fault kinds ---------------------------------------------------------------


@dataclass(frozen=True)
class FaultKind:
    """A way a model call can go wrong, aimed at call `target` of a run."""

    name: str
    make: Callable[[int, str, FakeClock], FaultSchedule]
    """(target call, the clean answer to it, clock) -> the schedule."""
    failed_attempts: int
    """Attempts of the target call that fail (0 for bad answers)."""
    recovers: bool
    """Whether retrying rides it out."""


def _error(error: BaseException, failing: int) -> Callable[..., FaultSchedule]:
    return lambda target, _answer, _clock: FaultSchedule(
        error, calls=frozenset(range(target, target + failing))
    )


def _text(text: str) -> Callable[..., FaultSchedule]:
    return lambda target, _answer, _clock: FaultSchedule(
        text, calls=frozenset({target})
    )


KINDS = [
    FaultKind("429 rate limit x2", _error(TransientFakeError(), 2), 2, recovers=True),
    FaultKind(
        "timeout x1", _error(TimeoutError("request timed out"), 1), 1, recovers=True
    ),
    FaultKind(
        "outage of 5 s",
        lambda target, _answer, clock: FaultSchedule(
            TransientFakeError("service unavailable", 503),
            start=target,
            duration=5.0,
            clock=clock.time,
        ),
        3,  # fails at 0, 1 and 3 s after it began; back at 7 s
        recovers=True,
    ),
    FaultKind(
        "outage until restart",
        lambda target, _answer, _clock: FaultSchedule(
            TransientFakeError("service unavailable", 503), start=target
        ),
        POLICY.max_attempts,
        recovers=False,
    ),
    FaultKind(
        "truncated output",
        lambda target, answer, _clock: FaultSchedule(
            answer[: len(answer) // 2], calls=frozenset({target})
        ),
        0,
        recovers=False,
    ),
    FaultKind(
        "not JSON",
        _text("Sure! Let me look at this carefully first."),
        0,
        recovers=False,
    ),
    FaultKind(
        "refusal",
        _text("I'm sorry, but I can't help with that request."),
        0,
        recovers=False,
    ),
    FaultKind("empty output", _text(""), 0, recovers=False),
]
KIND_IDS = [kind.name for kind in KINDS]


def _assert_backoff(sleeps: Sequence[float], retries: int, *, jitter: bool) -> None:
    """The waits were the policy's, in order, one per retry."""
    assert len(sleeps) == retries, sleeps
    for attempt, waited in enumerate(sleeps, 1):
        base = min(
            POLICY.max_delay, POLICY.initial_delay * POLICY.backoff ** (attempt - 1)
        )
        top = base * (1 + POLICY.jitter) if jitter else base
        assert base <= waited <= top, (attempt, waited)


def _digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def _logged(log: Path) -> list[str]:
    return [line.split("\t", 1)[0] for line in log.read_text().splitlines()]


# --- stage: the judge, through TAGRetriever ------------------------------------------


def _retrieve(
    rulebook: Rulebook,
    llm: RuleAwareFakeChatModel,
    on_error: Literal["raise", "not_applicable"],
) -> list[Verdict]:
    judge = ApplicabilityJudge(llm=llm, on_error=on_error, cache=None)
    retriever = TAGRetriever(rulebook=rulebook, judge=judge, max_concurrency=1)
    return retriever.match(QUERY).verdicts


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_judge_faults(
    kind: FaultKind,
    pep8_rulebook: Rulebook,
    clock: FakeClock,
    reliability_report: ReliabilityReport,
) -> None:
    clean_model = RuleAwareFakeChatModel()
    clean = _retrieve(pep8_rulebook, clean_model, "raise")
    # The fault hits a rule that applies: a silent NO would show.
    position = next(i for i, v in enumerate(clean) if v.applies)
    target = position + 1  # one judgment at a time, in rulebook order
    answer = clean_model._answer(clean_model.prompts[position]).text
    schedule = kind.make(target, answer, clock)

    strict = RuleAwareFakeChatModel(schedule=[schedule])
    if kind.recovers:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnreliableMatchWarning)
            verdicts = _retrieve(pep8_rulebook, strict, "raise")
        assert verdicts == clean
        assert strict.calls == len(clean) + kind.failed_attempts
        _assert_backoff(clock.sleeps, kind.failed_attempts, jitter=True)
        seen, flagged = "nothing: verdicts identical", "-"
    else:
        with pytest.raises(JudgmentError) as caught:
            _retrieve(pep8_rulebook, strict, "raise")
        error = caught.value
        assert error.rule_id == clean[position].rule_id
        assert error.transient is (kind.failed_attempts > 0)
        # Waiting helps a transient failure only.
        assert ("retry later" in str(error)) is error.transient
        # The judgment's own attempts come first; judgments already handed to the
        # worker pool may still run before the failure cancels the rest.
        attempts = max(kind.failed_attempts, 1)
        assert strict.calls >= position + attempts
        retries = attempts - 1
        _assert_backoff(clock.sleeps[:retries], retries, jitter=True)
        seen = "JudgmentError naming the rule: " + (
            "transient, retry later" if error.transient else "unparseable output"
        )
        # Under on_error="not_applicable" the run goes on; what failed is flagged.
        lenient = RuleAwareFakeChatModel(schedule=[schedule])
        with pytest.warns(UnreliableMatchWarning, match="judgments failed"):
            verdicts = _retrieve(pep8_rulebook, lenient, "not_applicable")
        changed = [v for v, c in zip(verdicts, clean, strict=True) if v != c]
        assert changed
        assert all(v.failed and not v.applies for v in changed)  # never a silent NO
        flagged = f"{len(changed)} verdict(s) with error + UnreliableMatchWarning"
    # Nothing is remembered from a failure: judging again gives every verdict.
    assert _retrieve(pep8_rulebook, RuleAwareFakeChatModel(), "raise") == clean
    reliability_report.add_fault(
        FaultRow(
            "judge",
            kind.name,
            max(kind.failed_attempts, 1),
            max(kind.failed_attempts - (0 if kind.recovers else 1), 0),
            seen,
            flagged,
            lost=0,
        )
    )


# --- stage: extraction, each phase and the re-extraction -----------------------------

PHASE_MARKERS = {
    "spans": "You find the normative statements",
    "atomics": "You split normative statements",
    "rules": "You turn atomic normative units",
    "relations": "You compare operational rules",
}
STAGES = ["spans", "atomics", "rules", "relations", "recovery"]


def _phase(prompt: str) -> str:
    return next(name for name, marker in PHASE_MARKERS.items() if marker in prompt)


def _target_call(model: ExtractionFakeChatModel, stage: str) -> int:
    """The 1-based number of the stage's first call that found something.

    Numbers are those of a one-at-a-time run; re-extraction calls are phase-3 calls
    made after phase 4.
    """
    phases = [_phase(p) for p in model.prompts]
    after = max(i for i, phase in enumerate(phases) if phase == "relations")
    for number, (prompt, phase) in enumerate(zip(model.prompts, phases, strict=True)):
        wanted = (
            phase == "rules" and number > after
            if stage == "recovery"
            else (phase == stage)
        )
        if wanted and '": []' not in model._answer(prompt).text:
            return number + 1
    raise AssertionError(stage)


def _extract(model: ExtractionFakeChatModel, checkpoint: Path | None) -> Rulebook:
    return extract_rules(
        [Document(page_content=DOCUMENT, metadata={"source": "guide.md"})],
        llm=model,
        checkpoint=checkpoint,
        max_concurrency=1,
    )


def _same_rules(a: Rulebook, b: Rulebook) -> None:
    assert [r.model_dump() for r in a.rules] == [r.model_dump() for r in b.rules]
    assert a.documents == b.documents


def _missing(clean: Rulebook, got: Rulebook) -> int:
    return sum(rule not in got.rules for rule in clean.rules)


@dataclass
class ExtractionCase:
    """One extraction stage with one fault, and the clean run to compare with."""

    stage: str
    kind: FaultKind
    clean_model: ExtractionFakeChatModel
    clean: Rulebook
    target: int
    log: Path
    db: Path
    clock: FakeClock

    def model(self, *, faulty: bool) -> ExtractionFakeChatModel:
        """A fake like the clean one, logging calls; with the fault if `faulty`."""
        answer = self.clean_model._answer(self.clean_model.prompts[self.target - 1])
        schedule = [self.kind.make(self.target, answer.text, self.clock)]
        return ExtractionFakeChatModel(
            corrupt_every=self.clean_model.corrupt_every,
            call_log=self.log,
            schedule=schedule if faulty else [],
        )

    def row(
        self, seen: str, flagged: str, injected: int, retried: int, lost: int
    ) -> FaultRow:
        """The report row of this case."""
        return FaultRow(
            f"extraction: {self.stage}",
            self.kind.name,
            injected,
            retried,
            seen,
            flagged,
            lost,
        )


def _ridden_out(case: ExtractionCase) -> FaultRow:
    model = case.model(faulty=True)
    _same_rules(case.clean, _extract(model, case.db))
    assert model.calls == case.clean_model.calls + case.kind.failed_attempts
    _assert_backoff(case.clock.sleeps, case.kind.failed_attempts, jitter=False)
    attempts = case.kind.failed_attempts
    return case.row("nothing: rulebook identical", "-", attempts, attempts, 0)


def _stopped_and_resumed(case: ExtractionCase) -> FaultRow:
    model = case.model(faulty=True)
    with pytest.raises(TransientFakeError, match="service unavailable"):
        _extract(model, case.db)  # the run stops cleanly after its retries
    # Each task that met the outage made all its attempts (LangGraph may start
    # more tasks of the same step before the failure stops the run).
    retries = case.kind.failed_attempts - 1
    failed_tasks, rest = divmod(len(case.clock.sleeps), retries)
    assert rest == 0
    assert failed_tasks >= 1
    for task in range(failed_tasks):
        chunk = case.clock.sleeps[task * retries : (task + 1) * retries]
        _assert_backoff(chunk, retries, jitter=False)
    injected = failed_tasks * case.kind.failed_attempts
    assert model.calls == case.target - 1 + injected
    # Resume: the same call, a healthy model, the same checkpoint.
    healthy = case.model(faulty=False)
    _same_rules(case.clean, _extract(healthy, case.db))
    logged = Counter(_logged(case.log))
    assert set(logged) == {_digest(p) for p in case.clean_model.prompts}  # no loss
    assert max(logged.values()) == 1  # nothing repeated
    assert healthy.calls == case.clean_model.calls - (case.target - 1)
    seen = (
        "the provider's error after retries; `tag extract` says to re-run, which "
        "resumes"
    )
    return case.row(seen, "-", injected, len(case.clock.sleeps), 0)


def _flagged_and_asked_again(case: ExtractionCase) -> FaultRow:
    model = case.model(faulty=True)
    first = _extract(model, case.db)
    report = ExtractionReport.model_validate(first.diagnostics)
    problems = [p for p in report.phases[case.stage].problems if unreadable_problem(p)]
    assert problems, report.phases[case.stage].problems  # flagged in the report
    faulted = case.clean_model.prompts[case.target - 1]
    assert Counter(model.prompts)[faulted] == 1  # not retried: temperature 0
    assert case.clock.sleeps == []
    # Re-running the same call asks again only what could not be read.
    answered = set(_logged(case.log)) - {_digest(faulted)}
    healthy = case.model(faulty=False)
    rerun = _extract(healthy, case.db)
    _same_rules(case.clean, rerun)
    asked = {_digest(p) for p in healthy.prompts}
    assert _digest(faulted) in asked
    assert not asked & answered
    seen = (
        f"report flags {case.stage}: {'+'.join(sorted(problems))}; "
        f"{_missing(case.clean, first)} rule(s) missing until re-run"
    )
    flagged = "in the report; answer not stored, re-run asks it again"
    return case.row(seen, flagged, 1, 0, _missing(case.clean, rerun))


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("stage", STAGES)
def test_extraction_faults(
    stage: str,
    kind: FaultKind,
    tmp_path: Path,
    clock: FakeClock,
    reliability_report: ReliabilityReport,
) -> None:
    clean_model = ExtractionFakeChatModel(
        corrupt_every=CORRUPT_EVERY if stage == "recovery" else 0
    )
    clean = _extract(clean_model, None)
    case = ExtractionCase(
        stage,
        kind,
        clean_model,
        clean,
        _target_call(clean_model, stage),
        tmp_path / "calls.log",
        tmp_path / "run.sqlite",
        clock,
    )
    if kind.recovers:
        row = _ridden_out(case)
    elif kind.failed_attempts:
        row = _stopped_and_resumed(case)
    else:
        row = _flagged_and_asked_again(case)
    reliability_report.add_fault(row)


def test_cli_extract_outage_says_how_to_resume(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clock: FakeClock,
) -> None:
    source = tmp_path / "guide.md"
    source.write_text(DOCUMENT, encoding="utf-8")
    db, out = tmp_path / "run.sqlite", tmp_path / "rulebook.json"
    down = FaultSchedule(TransientFakeError("service unavailable", 503), start=3)
    models = iter([ExtractionFakeChatModel(schedule=[down]), ExtractionFakeChatModel()])
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model", lambda **_: next(models)
    )
    argv = ["extract", str(source), "-o", str(out), "--checkpoint", str(db), "-q"]

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "extraction stopped: the model failed after its retries" in err
    assert "TransientFakeError: service unavailable" in err
    assert f"kept in {db}: run the same command again to resume" in err
    assert not out.exists()

    assert cli.main(argv) == 0
    assert Rulebook.load(out).rules == _extract(ExtractionFakeChatModel(), None).rules


def test_cli_run_judge_outage_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clock: FakeClock,
) -> None:
    down = FaultSchedule(TransientFakeError("service unavailable", 503), start=1)
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: RuleAwareFakeChatModel(schedule=[down]),
    )
    rulebook = str(Path(__file__).parents[1] / "fixtures" / "pep8_rulebook.json")
    assert cli.main(["run", rulebook, QUERY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tag run: error: no answer: the model failed")
    assert (
        "Nothing was assumed about any rule; the failure is transient (a server "
        "error (503)): try again later, or --on-error not_applicable to go on"
    ) in err


# --- stage: the executor, in the query graph -----------------------------------------

NBA_ANSWER = (
    '{"answer": false, "illegal_operation": null, "problematic_team": null, '
    '"rationale": "every operation is within the rules"}'
)


class ExecutorFake(ScriptedFakeChatModel):
    """An executor that always answers the NBA template's JSON."""

    @property
    def _llm_type(self) -> str:
        return "executor-fake"

    def _fault_key(self, prompt: str) -> str:
        return ""

    def _answer(self, prompt: str) -> AIMessage:
        return AIMessage(NBA_ANSWER)


def _query(
    graph: Any, pep8_rulebook: Rulebook, judge: Any, executor: Any, thread: str
) -> Any:
    return graph.invoke(
        {"query": QUERY, "rulebook": pep8_rulebook.model_dump(mode="json")},
        {"configurable": {"thread_id": thread}},
        context=QueryContext(
            judge_model=judge, executor_model=executor, template="nba"
        ),
    )


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_executor_faults(
    kind: FaultKind,
    pep8_rulebook: Rulebook,
    clock: FakeClock,
    reliability_report: ReliabilityReport,
) -> None:
    graph = build_query_graph(checkpointer=InMemorySaver())
    clean = _query(
        graph, pep8_rulebook, RuleAwareFakeChatModel(), ExecutorFake(), "clean"
    )
    judge = RuleAwareFakeChatModel()
    executor = ExecutorFake(schedule=[kind.make(1, NBA_ANSWER, clock)])
    if kind.recovers:
        output = _query(graph, pep8_rulebook, judge, executor, "t")
        assert (output["answer"], output["matches"]) == (
            clean["answer"],
            clean["matches"],
        )
        assert executor.calls == 1 + kind.failed_attempts
        _assert_backoff(clock.sleeps, kind.failed_attempts, jitter=False)
        seen, retried = "nothing: answer identical", kind.failed_attempts
    else:
        expected = TransientFakeError if kind.failed_attempts else OutputParserException
        with pytest.raises(expected) as caught:
            _query(graph, pep8_rulebook, judge, executor, "t")
        assert executor.calls == max(kind.failed_attempts, 1)
        _assert_backoff(clock.sleeps, max(kind.failed_attempts - 1, 0), jitter=False)
        if expected is OutputParserException:
            assert "expected" in str(caught.value)
        # Resume the thread: only the executor runs again, no judgment is repeated.
        resumed = graph.invoke(
            None,
            {"configurable": {"thread_id": "t"}},
            context=QueryContext(
                judge_model=judge, executor_model=ExecutorFake(), template="nba"
            ),
        )
        assert (resumed["answer"], resumed["matches"]) == (
            clean["answer"],
            clean["matches"],
        )
        assert judge.calls == len(pep8_rulebook)
        seen = (
            "the provider's error after retries; resuming the thread re-runs only "
            "the executor"
            if kind.failed_attempts
            else "OutputParserException naming the expected format; resumable"
        )
        retried = max(kind.failed_attempts - 1, 0)
    reliability_report.add_fault(
        FaultRow(
            "executor",
            kind.name,
            max(kind.failed_attempts, 1),
            retried,
            seen,
            "-",
            lost=0,
        )
    )
