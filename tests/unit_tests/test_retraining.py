"""Retraining: `RetrainPolicy`, and `Retrainer` training in the background."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import Rule, Rulebook
from langchain_tag.learning.learned_prefilter import FitReport, LearnedPrefilter
from langchain_tag.learning.promise import MissBudget, StreamCounts
from langchain_tag.learning.retraining import Retrainer, RetrainPolicy
from langchain_tag.learning.verdict_log import SQLiteVerdictLog
from langchain_tag.matching import Verdict
from langchain_tag.testing import trigger_rulebook

RULES = trigger_rulebook(4)
FILLER = ("alpha", "beta", "gamma", "delta", "epsilon")


def fill(log: SQLiteVerdictLog, inputs: int, *, start: int = 0) -> None:
    """The fake judge's verdicts on every rule for `inputs` inputs."""
    for i in range(start, start + inputs):
        text = f"{FILLER[i % 5]} {FILLER[(i * 3) % 5]} trigger-{i % 3:03d} n{i}"
        for rule in RULES.rules:
            applies = f"trigger-{rule.rule_id[2:]}" in text
            log.record(text, rule, Verdict(rule_id=rule.rule_id, applies=applies))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SQLiteVerdictLog]:
    log = SQLiteVerdictLog(tmp_path / "verdicts.sqlite")
    yield log
    log.close()


class Gate:
    """Holds `LearnedPrefilter.fit` until released; counts its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, error: bool = False) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        real_fit = LearnedPrefilter.fit

        def fit(prefilter: LearnedPrefilter, *args: Any, **kwargs: Any) -> FitReport:
            self.calls += 1
            self.entered.set()
            assert self.release.wait(timeout=30)
            if error:
                msg = "disk on fire"
                raise OSError(msg)
            return real_fit(prefilter, *args, **kwargs)

        monkeypatch.setattr(LearnedPrefilter, "fit", fit)


def running(retrainer: Retrainer) -> Future[FitReport] | None:
    """The training under way (a call: mypy does not narrow it between asserts)."""
    return retrainer.running


def test_retrain_policy_counts_new_verdicts() -> None:
    policy = RetrainPolicy(every=20)
    assert not policy.due(19)
    assert policy.due(20)
    assert not policy.due(39, trained_at=20)
    assert policy.due(40, trained_at=20)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RetrainPolicy(every=0)


def test_nothing_starts_before_the_mark(log: SQLiteVerdictLog) -> None:
    prefilter = LearnedPrefilter(RULES)
    retrainer = Retrainer(prefilter, log, RULES, every=40)
    fill(log, 9)  # 36 verdicts
    assert retrainer.poll() is None
    assert retrainer.running is None
    assert not prefilter.fitted


def test_training_runs_in_the_background_and_never_blocks_the_caller(
    log: SQLiteVerdictLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    prefilter = LearnedPrefilter(RULES, min_examples=5)
    retrainer = Retrainer(prefilter, log, RULES, every=40)
    fill(log, 10)  # 40 verdicts: due
    future = retrainer.poll()  # returns while the training is held
    assert future is not None
    assert gate.entered.wait(timeout=30)
    assert running(retrainer) is future
    assert not future.done()
    assert not prefilter.fitted  # still serving the old (no) model
    assert prefilter.select("trigger-001") == [r.rule_id for r in RULES.rules]
    fill(log, 20, start=10)  # due again, but one training at a time
    assert retrainer.poll() is None
    gate.release.set()
    report = future.result(timeout=60)
    assert prefilter.report is report
    assert retrainer.running is None
    assert retrainer.trained_at == 40
    assert gate.calls == 1
    # 120 verdicts now, 80 since the last mark: the next training starts.
    second = retrainer.poll()
    assert second is not None
    second.result(timeout=60)
    assert retrainer.trained_at == 120


def test_a_retrainer_built_anew_keeps_the_mark_of_the_prefilter(
    log: SQLiteVerdictLog,
) -> None:
    """An engine built again (a graph run with a new context) does not retrain."""
    prefilter = LearnedPrefilter(RULES, min_examples=5)
    first = Retrainer(prefilter, log, RULES, every=40)
    fill(log, 10)  # 40 verdicts: due
    future = first.poll()
    assert future is not None
    future.result(timeout=60)
    again = Retrainer(prefilter, log, RULES, every=40)
    assert again.trained_at == 40
    fill(log, 5, start=10)  # 60 verdicts, 20 since the mark
    assert again.poll() is None
    fill(log, 5, start=15)  # 80: 40 since the mark
    second = again.poll()
    assert second is not None
    second.result(timeout=60)
    assert first.trained_at == again.trained_at == 80
    other = Retrainer(LearnedPrefilter(RULES), log, RULES, every=40)
    assert other.trained_at is None  # the mark is the prefilter's


def test_a_failing_training_warns_and_is_retried_at_the_next_mark(
    log: SQLiteVerdictLog,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = Gate(monkeypatch, error=True)
    gate.release.set()
    prefilter = LearnedPrefilter(RULES)
    retrainer = Retrainer(prefilter, log, RULES, every=40)
    fill(log, 10)
    with caplog.at_level(logging.WARNING):
        future = retrainer.poll()
        assert future is not None
        error = future.exception(timeout=60)
    assert isinstance(error, OSError)
    assert not prefilter.fitted
    assert retrainer.running is None
    messages = [r.message for r in caplog.records if "Retraining" in r.message]
    assert len(messages) == 1
    assert "disk on fire" in messages[0]
    assert retrainer.poll() is None  # not at once: at the next mark
    fill(log, 10, start=10)
    retried = retrainer.poll()
    assert retried is not None
    assert isinstance(retried.exception(timeout=60), OSError)
    assert gate.calls == 2


def test_an_unreadable_log_is_asked_again_later(
    log: SQLiteVerdictLog,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    retrainer = Retrainer(LearnedPrefilter(RULES), log, RULES, every=4)
    fill(log, 2)

    def broken() -> int:
        msg = "database is locked"
        raise OSError(msg)

    monkeypatch.setattr(log, "position", broken)
    with caplog.at_level(logging.WARNING):
        assert retrainer.poll() is None
    assert "database is locked" in caplog.text
    monkeypatch.undo()
    future = retrainer.poll()
    assert future is not None
    future.result(timeout=60)


def test_it_trains_over_the_callers_rulebook(log: SQLiteVerdictLog) -> None:
    """A prefilter built over an older rulebook learns the rules added since."""
    new = Rule(rule_id="R-NEW", name="New", condition="`brand-new`", action="Act")
    current = Rulebook(rules=[*RULES.rules, new])
    prefilter = LearnedPrefilter(RULES)
    retrainer = Retrainer(prefilter, log, current, every=20)
    fill(log, 5)
    future = retrainer.poll()
    assert future is not None
    report = future.result(timeout=60)
    assert "R-NEW" in report.rules
    assert prefilter.rulebook is current
    assert "R-NEW" in prefilter.known_rules


def test_rules_that_form_no_rulebook_fail_the_training_not_the_caller(
    log: SQLiteVerdictLog, caplog: pytest.LogCaptureFixture
) -> None:
    retrainer = Retrainer(LearnedPrefilter(RULES), log, RULES, every=8)
    fill(log, 3)
    twice = [*RULES.rules, RULES.rules[0]]  # a duplicate id, as edited into a state
    with caplog.at_level(logging.WARNING):
        future = retrainer.poll(twice)  # never raises into the retrieval
        assert future is not None
        assert isinstance(future.exception(timeout=30), ValueError)
    assert "failed" in caplog.text
    assert retrainer.running is None
    assert retrainer.rulebook is RULES


# --- keeping the promise: the miss budget, and the Retrainer that applies it --------


def counts(**fields: Any) -> StreamCounts:
    """Stream counts: nothing seen, but for `fields`."""
    zero: dict[str, Any] = {
        "inputs": 0,
        "warm_inputs": 0,
        "warm_yes": 0,
        "kept_yes": 0,
        "shadow_yes": 0,
        "predicted_misses": 0.0,
        "explored_misses": 0.0,
    }
    return StreamCounts(**(zero | fields))


def test_the_shadow_bounds_the_ratio_of_actual_to_predicted_misses() -> None:
    budget = MissBudget()
    assert budget.ratio(counts()) == 1.4  # nothing predicted: the allowance
    # No shadow YES where 10 were expected: chi2_0.95(2) / 2 / eP = 5.9915 / 20.
    few = counts(predicted_misses=200.0, explored_misses=10.0)
    assert budget.ratio(few) == pytest.approx(0.29957, abs=1e-5)
    # 10 shadow YES where 2 were expected: chi2_0.05(20) / 2 / eP = 10.8508 / 4.
    many = counts(shadow_yes=10, predicted_misses=40.0, explored_misses=2.0)
    assert budget.ratio(many) == pytest.approx(2.71270, abs=1e-5)
    # 1 where 1 was expected: both bounds (4.74 and 0.05) leave the allowance.
    as_expected = counts(shadow_yes=1, predicted_misses=20.0, explored_misses=1.0)
    assert budget.ratio(as_expected) == 1.4


def test_the_internal_target_by_hand() -> None:
    stream = counts(
        inputs=80,
        warm_inputs=20,
        warm_yes=60,
        kept_yes=200,
        predicted_misses=3.0,
        explored_misses=0.15,
    )
    plan = MissBudget().plan(stream, 0.95, window=20)
    # beta = 1.4: the shadow's upper bound, 5.9915 / 2 / 0.15 = 19.97, is looser.
    assert plan.ratio == 1.4
    assert plan.yes_so_far == pytest.approx(204.2)  # 200 + 1.4 x 3
    assert plan.window_yes == pytest.approx(66.05)  # (60 + 204.2) / 80 x 20
    assert plan.allowed_misses == pytest.approx(13.5125)  # 0.05 x (204.2 + 66.05)
    # X + 1.645 sqrt(1.5 X) = 13.5125
    assert plan.expected_misses == pytest.approx(7.86304, abs=1e-5)
    assert plan.window_misses == pytest.approx(2.61646, abs=1e-5)  # X / 1.4 - 3
    assert plan.internal_target == pytest.approx(0.960387, abs=1e-6)  # 1 - m / y


def test_the_internal_target_is_strict_early_and_clipped() -> None:
    budget = MissBudget()
    # The first training: the warm-up's 66 YES in 20 inputs, a window of 33.
    first = budget.plan(counts(inputs=20, warm_inputs=20, warm_yes=66), 0.95, 33)
    assert first.internal_target == pytest.approx(0.98456, abs=1e-5)
    # The misses predicted so far already spend the budget: the ceiling.
    spent = counts(inputs=80, warm_yes=60, kept_yes=200, predicted_misses=10.0)
    assert budget.plan(spent, 0.95, 20).internal_target == 0.999
    # Plenty of YES and no miss: no lower than 1 - 4 (1 - t).
    plenty = counts(inputs=1000, kept_yes=100_000)
    assert budget.plan(plenty, 0.95, 10).internal_target == pytest.approx(0.8)
    assert budget.plan(plenty, 1.0, 10).internal_target == 1.0
    with pytest.raises(ValueError, match="target"):
        budget.plan(plenty, 0.0, 10)


def test_the_retrainer_aims_at_the_controllers_target(log: SQLiteVerdictLog) -> None:
    prefilter = LearnedPrefilter(RULES, target_recall=0.9, min_examples=5)
    retrainer = Retrainer(prefilter, log, RULES, every=40)
    fill(log, 10)  # 40 verdicts, all of the warm-up
    future = retrainer.poll()
    assert future is not None
    report = future.result(timeout=60)
    plan = retrainer.last_plan
    assert plan is not None
    assert report.internal_target == plan.internal_target > 0.9
    assert report.target_recall == prefilter.target_recall == 0.9
    # The next window: 40 verdicts at 4 per input, 10 inputs of one YES each.
    assert plan.window_yes == pytest.approx(10.0)


def test_without_a_budget_it_trains_on_the_verdicts_alone(
    log: SQLiteVerdictLog,
) -> None:
    prefilter = LearnedPrefilter(RULES, target_recall=0.9, min_examples=5)
    fill(log, 10)
    rule = RULES.rules[3]
    log.record_skipped("alpha n0", [("R-003", rule.content_hash(), 0.2)], explore=0.05)
    fill(log, 1, start=10)  # writes the skip record
    retrainer = Retrainer(prefilter, log, RULES, every=40, budget=None)
    future = retrainer.poll()
    assert future is not None
    report = future.result(timeout=60)
    assert retrainer.last_plan is None
    assert report.internal_target == 0.9
    assert report.skipped == 0
    fresh = LearnedPrefilter(RULES, min_examples=5)
    future = Retrainer(fresh, log, RULES, every=4).poll()
    assert future is not None
    assert future.result(timeout=60).skipped == 1
