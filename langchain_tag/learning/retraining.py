"""Retraining: a learned prefilter trained again from the verdict log as it grows.

`RetrainPolicy` says when enough new verdicts call for training again;
`Retrainer` trains in a background thread when it is due, so no retrieval waits
for a training: the prefilter keeps serving its old model until the new one is
installed, in one assignment. Each training keeps the prefilter's recall promise
over the stream: it learns from the verdicts and the skipped pairs nobody judged
(`VerdictLog.examples(skipped=True)`), and aims its thresholds at the internal
target the miss-budget controller sets from the log (`MissBudget`,
`langchain_tag.learning.promise`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from langchain_tag.learning.promise import BudgetPlan, MissBudget, StreamCounts
from langchain_tag.rules import Rule, Rulebook

if TYPE_CHECKING:
    from langchain_tag.learning.learned_prefilter import FitReport, LearnedPrefilter
    from langchain_tag.learning.verdict_log import VerdictLog

__all__ = ["RetrainPolicy", "Retrainer"]

logger = logging.getLogger(__name__)


class RetrainPolicy(BaseModel):
    """Train again once `every` new verdicts have been logged since the last time.

    Positions are the verdict log's (`VerdictLog.position()`), which only grow,
    so the policy holds across processes sharing one log and across pruning.
    """

    model_config = ConfigDict(frozen=True)

    every: int = Field(default=200, ge=1)

    def due(self, position: int, trained_at: int | None = None) -> bool:
        """Whether to train now, at log `position`, last trained at `trained_at`.

        Never trained (`trained_at` None): due once `every` verdicts are logged.
        """
        return position - (trained_at or 0) >= self.every


_MARKS_LOCK = threading.Lock()
"""Guards the marks kept with prefilters: two engines over one prefilter start
one training per mark."""


class Retrainer:
    """Trains a LearnedPrefilter again from a verdict log, in a background thread.

    Call `poll()` after each retrieval: when `RetrainPolicy(every)` says a training
    is due and none is running, it starts one in a daemon thread and returns at
    once. The training reads the log and fits the prefilter over `rulebook`; the
    prefilter keeps serving its old model until the new one is installed. A failing
    training logs a warning with its error and is tried again at the next mark
    (`every` verdicts later); it is never raised into a retrieval.

    With a `budget` (the default), each training keeps `target_recall` over the
    stream: it learns from the verdicts and the skip records
    (`log.examples(rulebook, skipped=True)`), and aims at the internal target the
    controller plans from `log.stream_counts()` (`last_plan`,
    `FitReport.internal_target`). Everything it needs is in the log, so the
    promise carries over a restart and across processes sharing the log; the
    window is `every` verdicts at the last window's verdicts per input.

    Args:
        prefilter: The prefilter to train.
        log: The verdict log to learn from.
        rulebook: The rules to train over (the engine's).
        every: Train again once this many new verdicts are logged.
        budget: The miss-budget controller; None trains on the verdicts alone at
            `target_recall`, as releases before did (it saves more and keeps less
            recall than promised: `benchmarks/bench_recall_promise.py`).
    """

    def __init__(
        self,
        prefilter: LearnedPrefilter,
        log: VerdictLog,
        rulebook: Rulebook,
        *,
        every: int,
        budget: MissBudget | None = MissBudget(),  # noqa: B008 - frozen
    ) -> None:
        """Remember what to train; nothing runs until `poll`."""
        self.prefilter = prefilter
        self.log = log
        self.rulebook = rulebook
        self.policy = RetrainPolicy(every=every)
        self.budget = budget
        self._lock = threading.Lock()
        self._running: concurrent.futures.Future[FitReport] | None = None
        self._plan: BudgetPlan | None = None

    @property
    def last_plan(self) -> BudgetPlan | None:
        """The controller's plan for the last training started here (None: none)."""
        return self._plan

    @property
    def trained_at(self) -> int | None:
        """The log position of the last training started (None: never).

        Shared by every retrainer of this prefilter and log: it is kept with the
        prefilter, by the log's location.
        """
        return self.prefilter._retrained_at.get(self.log.location)  # noqa: SLF001

    @property
    def running(self) -> concurrent.futures.Future[FitReport] | None:
        """The training under way, if any."""
        with self._lock:
            return self._running

    def poll(
        self, rules: Sequence[Rule] | None = None
    ) -> concurrent.futures.Future[FitReport] | None:
        """Start a training in the background if one is due and none is running.

        `rules`, when given, are the rules the caller retrieves over now: the
        training is over them (new rules learnt, removed ones dropped), and they
        become `rulebook`.

        Never blocks on a training and never raises: a log that cannot be read
        logs a warning and the next poll asks again.

        Returns:
            The future of the training started now (its result is the
            `FitReport`; a failed training's future holds its error), else None.
        """
        if self.running is not None:
            return None
        try:  # not under the lock: concurrent retrievals do not wait on the query
            position = self.log.position()
        except Exception as error:  # noqa: BLE001 - never into a retrieval
            logger.warning(
                "Retraining the learned prefilter: cannot read the verdict "
                "log's position (%s: %s); asking again at the next retrieval.",
                type(error).__name__,
                error,
            )
            return None
        with self._lock, _MARKS_LOCK:
            previous = self.trained_at
            if self._running is not None or not self.policy.due(position, previous):
                return None
            # A failed training is tried again at the next mark, not at once.
            self.prefilter._retrained_at[self.log.location] = position  # noqa: SLF001
            future: concurrent.futures.Future[FitReport] = concurrent.futures.Future()
            future.set_running_or_notify_cancel()
            self._running = future
        thread = threading.Thread(
            target=self._train,
            args=(
                future,
                position,
                previous or 0,
                None if rules is None else list(rules),
            ),
            name="langchain-tag-retrainer",
            daemon=True,
        )
        thread.start()
        return future

    def _train(
        self,
        future: concurrent.futures.Future[FitReport],
        position: int,
        previous: int,
        rules: list[Rule] | None,
    ) -> None:
        try:  # the rulebook too: rules edited into a graph's state may not form one
            if rules is not None and rules != list(self.rulebook.rules):
                self.rulebook = Rulebook(rules=rules)
            report = self._fit(previous)
        except BaseException as error:  # noqa: BLE001 - reported, never raised
            logger.warning(
                "Retraining the learned prefilter at verdict log position %d failed "
                "(%s: %s); it keeps its previous model and tries again after %d "
                "more verdicts.",
                position,
                type(error).__name__,
                error,
                self.policy.every,
            )
            with self._lock:
                self._running = None
            future.set_exception(error)
            return
        with self._lock:
            self._running = None
        future.set_result(report)

    def _fit(self, previous: int) -> FitReport:
        """One training: at the controller's internal target, or the plain one."""
        if self.budget is None:
            return self.prefilter.fit(
                self.log.examples(self.rulebook), rulebook=self.rulebook
            )
        counts = self.log.stream_counts(since=previous)
        plan = self.budget.plan(
            counts, self.prefilter.target_recall, _window(counts, self.policy.every)
        )
        self._plan = plan
        return self.prefilter.fit(
            self.log.examples(self.rulebook, skipped=True),
            rulebook=self.rulebook,
            internal_target=plan.internal_target,
        )


def _window(counts: StreamCounts, every: int) -> float:
    """Inputs expected before the next training.

    `every` verdicts at the last window's verdicts per input; with no last window,
    as many as so far.
    """
    if counts.recent_inputs and counts.recent_verdicts:
        return every * counts.recent_inputs / counts.recent_verdicts
    return float(counts.inputs)
