"""Benchmark of the learned prefilter: judgments saved at 95% / 99% recall of YES.

The verdicts are the gold labels standing in for the judge's (an oracle judge): an
(input, rule) pair is YES when the rule is among the input's gold rules. No LLM is
called; the figures say how well a `LearnedPrefilter` trained on a judge's past
verdicts predicts its next ones, for a judge that agrees with the gold.

- RuleArena-NBA: the 131 dev problems (`NBAProblem.text`) against the 55 catalogue
  rules, gold = the normalised `relevant_rules`.
- ObliQA: the 491 dev questions against the 767 passages as rules
  (`passage_rulebook`), gold = the gold passages (1-3 per question: few YES
  verdicts per rule).

For each set:

1. K-fold over the inputs (5 folds, shuffled once, seed 0): train on the other
   folds' verdicts, select on the held-out inputs, for `target_recall` 0.95 and
   0.99. Judged = rules the prefilter lets through per input; saved = the share of
   the (input, rule) judgments not made; recall = share of the held-out YES
   verdicts whose rule was let through. The thresholds are chosen on the training
   folds only.
2. Learning curve at 0.95: train on the first 10 / 20 / 40 / 80 / all inputs of the
   training folds (5 random orders each), evaluate on the held-out fold.
3. Time: training on a whole training fold; selection per input (best of
   `--repeats` passes over the held-out inputs; median and 99th percentile); the
   size of that model's file. And
   what the retrieval that crosses a retraining mark waits: the whole training
   when it trains in its own thread, only `Retrainer.poll()` with the background
   retrainer (the training fold's verdicts in an SQLite verdict log).
4. Live run: the inputs arrive one at a time in a random order; the prefilter
   starts untrained (plain TAG), is trained again every 20 inputs on the verdicts
   so far, and 5% of the skipped pairs are judged anyway (shadow judging,
   `explore_pairs`, weighted 1 / 0.05 in training). Calls = judged + explored
   pairs. From the first training on, the true recall (YES verdicts of the judged
   rules over all YES verdicts) is compared with the shadow estimate and its 95%
   Wilson interval (`estimate_recall`); `--live-runs` orders (NBA) and
   `--obliqa-live-runs` give the interval's coverage. The runs are made at
   `target_recall` 0.95 and at 0.97, training on the verdicts alone: after the
   first training a skipped pair's verdict is known only when it is explored,
   which costs the live runs recall. `benchmarks/bench_recall_promise.py` runs the
   default `Retrainer` instead (skipped pairs counted, miss budget), which keeps
   the target.

Run from the repository root (needs the `learned` extra, scikit-learn):

    python benchmarks/bench_learned_prefilter.py [--data-dir DIR] [--json out.json]

The exit status is 2 if the data is missing, else 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common
import numpy as np
from langchain_tag_experiments.evaluation import load_nba, load_obliqa
from langchain_tag_experiments.evaluation.learned import (
    KFOLDS,
    kfold_splits,
    verdict_examples,
)

from langchain_tag._text import digest
from langchain_tag.learning.learned_prefilter import (
    LabelledExample,
    LearnedPrefilter,
)
from langchain_tag.learning.retraining import Retrainer, RetrainPolicy
from langchain_tag.learning.shadow import estimate_recall, explore_pairs
from langchain_tag.learning.verdict_log import SQLiteVerdictLog, VerdictRecord
from langchain_tag.matching import Verdict
from langchain_tag.rules import Rulebook

REQUIRED = (
    Path("rulearena_nba/problems_dev.jsonl"),
    Path("rulearena_nba/rule_catalog.json"),
    Path("obliqa_sample/questions_dev.json"),
)
FOLDS = KFOLDS
TARGETS = (0.95, 0.99)
CURVE_SIZES = (10, 20, 40, 80, None)
CURVE_ORDERS = 5
RETRAIN_EVERY = 20
EXPLORE = 0.05
LIVE_TARGETS = (0.95, 0.97)
"""The live runs' `target_recall`s: the default, and one stricter setting, trained
on the verdicts alone (the skipped pairs' labels only sampled)."""


@dataclass(frozen=True)
class LabelledSet:
    """Inputs, their gold rule ids, and the rulebook they are judged against."""

    name: str
    texts: list[str]
    gold: list[frozenset[str]]
    rulebook: Rulebook

    @property
    def rule_ids(self) -> list[str]:
        """The rule ids, in rulebook order."""
        return [rule.rule_id for rule in self.rulebook.rules]

    def examples(self, inputs: Sequence[int]) -> Iterator[tuple[str, str, bool]]:
        """The oracle judge's verdicts on every rule for each of `inputs`."""
        return verdict_examples(self.texts, self.gold, self.rule_ids, inputs)


def nba_set(data_dir: Path) -> LabelledSet:
    """NBA dev problems against the catalogue rules."""
    nba = load_nba(data_dir)
    return LabelledSet(
        "nba",
        [p.text for p in nba.problems],
        [frozenset(p.gold_rule_ids) for p in nba.problems],
        nba.catalogue,
    )


def obliqa_set(data_dir: Path) -> LabelledSet:
    """ObliQA dev questions against the passages, one pseudo-rule each."""
    obliqa = load_obliqa(data_dir)
    return LabelledSet(
        "obliqa",
        [q.text for q in obliqa.questions],
        [frozenset(q.gold_unit_ids) for q in obliqa.questions],
        obliqa.passage_rulebook(),
    )


def folds(n: int) -> list[tuple[list[int], list[int]]]:
    """(train, test) input indices of each fold: the evaluation harness's split."""
    return kfold_splits(n, FOLDS)


@dataclass
class Tally:
    """Judged pairs and kept YES verdicts over some inputs."""

    inputs: int = 0
    judged: int = 0
    pairs: int = 0
    yes: int = 0
    kept_yes: int = 0

    def add(self, other: Tally) -> None:
        """Add another tally's counts."""
        self.inputs += other.inputs
        self.judged += other.judged
        self.pairs += other.pairs
        self.yes += other.yes
        self.kept_yes += other.kept_yes

    @property
    def saved(self) -> float:
        """Share of the judgments not made."""
        return 1.0 - self.judged / self.pairs if self.pairs else 0.0

    @property
    def recall(self) -> float:
        """Share of the YES verdicts whose rule was judged."""
        return self.kept_yes / self.yes if self.yes else 1.0

    @property
    def judged_per_input(self) -> float:
        """Mean rules judged per input."""
        return self.judged / self.inputs if self.inputs else 0.0


def evaluate(
    prefilter: LearnedPrefilter, data: LabelledSet, test: Sequence[int]
) -> Tally:
    """What the prefilter judges and keeps of the held-out inputs."""
    tally = Tally()
    n_rules = len(data.rule_ids)
    for i in test:
        judged = set(prefilter.select(data.texts[i]))
        tally.add(
            Tally(
                1, len(judged), n_rules, len(data.gold[i]), len(data.gold[i] & judged)
            )
        )
    return tally


# --- 1. k-fold -----------------------------------------------------------------------


@dataclass
class KFoldRow:
    """One target's k-fold figures."""

    target: float
    judged_per_input: float
    saved: float
    recall: float
    fold_recall_min: float
    fold_recall_max: float
    fold_saved_min: float
    fold_saved_max: float
    expected_recall: float
    train_seconds: float


def kfold(data: LabelledSet, target: float) -> KFoldRow:
    """Train on four folds, select on the fifth, five times."""
    total = Tally()
    per_fold: list[Tally] = []
    expected, seconds = [], []
    for train, test in folds(len(data.texts)):
        prefilter = LearnedPrefilter(data.rulebook, target_recall=target)
        report = prefilter.fit(data.examples(train))
        expected.append(report.expected_recall)
        seconds.append(report.seconds)
        tally = evaluate(prefilter, data, test)
        per_fold.append(tally)
        total.add(tally)
    return KFoldRow(
        target=target,
        judged_per_input=total.judged_per_input,
        saved=total.saved,
        recall=total.recall,
        fold_recall_min=min(t.recall for t in per_fold),
        fold_recall_max=max(t.recall for t in per_fold),
        fold_saved_min=min(t.saved for t in per_fold),
        fold_saved_max=max(t.saved for t in per_fold),
        expected_recall=statistics.mean(expected),
        train_seconds=statistics.mean(seconds),
    )


# --- 2. learning curve ---------------------------------------------------------------


@dataclass
class CurvePoint:
    """Figures after training on `inputs` inputs (mean over folds and orders)."""

    inputs: int | str
    judged_per_input: float
    saved: float
    recall: float


def learning_curve(data: LabelledSet, target: float = 0.95) -> list[CurvePoint]:
    """Train on growing prefixes of random orders of each training fold."""
    points = []
    for size in CURVE_SIZES:
        total = Tally()
        for fold, (train, test) in enumerate(folds(len(data.texts))):
            for order in range(CURVE_ORDERS):
                shuffled = np.random.default_rng([fold, order]).permutation(train)
                subset = shuffled[:size].tolist()
                prefilter = LearnedPrefilter(data.rulebook, target_recall=target)
                prefilter.fit(data.examples(subset))
                total.add(evaluate(prefilter, data, test))
        points.append(
            CurvePoint(
                size if size is not None else f"all ({len(train)})",
                total.judged_per_input,
                total.saved,
                total.recall,
            )
        )
    return points


# --- 3. time -------------------------------------------------------------------------


@dataclass
class Timing:
    """Training and selection time."""

    train_inputs: int
    rules: int
    train_seconds: float
    select_median_ms: float
    select_p99_ms: float
    select_max_ms: float
    retrain_sync_ms: float
    """The retrieval crossing the mark, training in its own thread, waits this."""
    retrain_poll_ms: float
    """With `Retrainer`, it waits this (`poll()` starts a background training)."""
    retrain_background_s: float
    """The background training, from the log, until the new model is installed."""
    file_bytes: int
    """The trained model's file (`LearnedPrefilter.save`)."""


def timing(data: LabelledSet, repeats: int) -> Timing:
    """Train on the first training fold; time selection on its held-out inputs."""
    train, test = folds(len(data.texts))[0]
    prefilter = LearnedPrefilter(data.rulebook)
    examples = list(data.examples(train))
    started = time.perf_counter()
    prefilter.fit(examples)
    train_seconds = time.perf_counter() - started
    prefilter.select(data.texts[test[0]])  # the first call builds the vectorizer
    best: list[float] | None = None
    for _ in range(repeats):
        times = []
        for i in test:
            started = time.perf_counter()
            prefilter.select(data.texts[i])
            times.append(time.perf_counter() - started)
        if best is None or statistics.median(times) < statistics.median(best):
            best = times
    assert best is not None  # noqa: S101 - repeats >= 1
    sync_ms, poll_ms, background_s = retrain_wait(data, train)
    with tempfile.TemporaryDirectory() as directory:
        file_bytes = prefilter.save(Path(directory) / "model.npz").stat().st_size
    return Timing(
        train_inputs=len(train),
        rules=len(data.rule_ids),
        train_seconds=train_seconds,
        select_median_ms=1000 * statistics.median(best),
        select_p99_ms=1000 * float(np.percentile(best, 99)),
        select_max_ms=1000 * max(best),
        retrain_sync_ms=sync_ms,
        retrain_poll_ms=poll_ms,
        retrain_background_s=background_s,
        file_bytes=file_bytes,
    )


def retrain_wait(data: LabelledSet, train: Sequence[int]) -> tuple[float, float, float]:
    """The retrieval-side wait at a retraining mark: in-thread, and `Retrainer`.

    Returns:
        The in-thread training (ms), `Retrainer.poll()` (ms), and the background
        training until installed (s), each from an SQLite log of `train`'s verdicts.
    """
    rules = {rule.rule_id: rule for rule in data.rulebook.rules}
    with tempfile.TemporaryDirectory() as directory:
        log = SQLiteVerdictLog(Path(directory) / "verdicts.sqlite")
        log.append(
            VerdictRecord.of(
                text, rules[rule_id], Verdict(rule_id=rule_id, applies=yes)
            )
            for text, rule_id, yes in data.examples(train)
        )
        started = time.perf_counter()
        LearnedPrefilter(data.rulebook).fit(log.examples(data.rulebook))
        sync_ms = 1000 * (time.perf_counter() - started)
        retrainer = Retrainer(
            LearnedPrefilter(data.rulebook), log, data.rulebook, every=1
        )
        started = time.perf_counter()
        future = retrainer.poll()
        poll_ms = 1000 * (time.perf_counter() - started)
        assert future is not None  # noqa: S101 - the log holds verdicts
        future.result()
        background_s = time.perf_counter() - started
        log.close()
    return sync_ms, poll_ms, background_s


# --- 4. live run ---------------------------------------------------------------------


@dataclass
class Checkpoint:
    """The live run's cumulative figures after `inputs` inputs."""

    inputs: int
    saved: float
    true_recall: float
    estimate: float
    low: float
    high: float


@dataclass
class LiveRun:
    """One live run: inputs one at a time, retraining, shadow judging."""

    seed: int
    inputs: int
    pairs: int
    calls: int
    explored: int
    saved: float
    kept_yes: int
    shadow_yes: int
    missed_yes: int
    true_recall: float
    estimate: float
    low: float
    high: float
    trainings: int
    checkpoints: list[Checkpoint] = field(default_factory=list)

    @property
    def covered(self) -> bool:
        """Whether the interval contains the true recall."""
        return self.low <= self.true_recall <= self.high


def live_run(data: LabelledSet, seed: int, *, target: float = 0.95) -> LiveRun:
    """Inputs one at a time, retrained every RETRAIN_EVERY, EXPLORE of skips judged.

    The recall figures count the inputs from the first training on (before it,
    every rule is judged and nothing can be missed).
    """
    order = np.random.default_rng(1000 + seed).permutation(len(data.texts)).tolist()
    prefilter = LearnedPrefilter(data.rulebook, target_recall=target)
    policy = RetrainPolicy(every=RETRAIN_EVERY)
    log: list[LabelledExample] = []
    trained_at: int | None = None
    trainings = calls = explored_total = 0
    kept_yes = shadow_yes = missed_yes = 0
    checkpoints = []
    for seen, i in enumerate(order):
        if seen and policy.due(seen, trained_at):
            prefilter.fit(log)
            trained_at, trainings = seen, trainings + 1
        text, gold = data.texts[i], data.gold[i]
        judged, skipped = prefilter.partition(text)
        explored = explore_pairs(skipped, digest(text), rate=EXPLORE, seed=seed)
        calls += len(judged) + len(explored)
        explored_total += len(explored)
        log += [LabelledExample(text, r, r in gold) for r in judged]
        log += [LabelledExample(text, r, r in gold, 1.0 / EXPLORE) for r in explored]
        if trained_at is not None:
            kept_yes += len(gold & set(judged))
            shadow_yes += len(gold & set(explored))
            missed_yes += len(gold & set(skipped))
        if (seen + 1) % RETRAIN_EVERY == 0 or seen + 1 == len(order):
            estimate = estimate_recall(kept_yes, shadow_yes, EXPLORE)
            checkpoints.append(
                Checkpoint(
                    seen + 1,
                    1.0 - calls / ((seen + 1) * len(data.rule_ids)),
                    kept_yes / (kept_yes + missed_yes)
                    if kept_yes + missed_yes
                    else 1.0,
                    estimate.estimate,
                    estimate.low,
                    estimate.high,
                )
            )
    final = checkpoints[-1]
    return LiveRun(
        seed=seed,
        inputs=len(order),
        pairs=len(order) * len(data.rule_ids),
        calls=calls,
        explored=explored_total,
        saved=final.saved,
        kept_yes=kept_yes,
        shadow_yes=shadow_yes,
        missed_yes=missed_yes,
        true_recall=final.true_recall,
        estimate=final.estimate,
        low=final.low,
        high=final.high,
        trainings=trainings,
        checkpoints=checkpoints,
    )


# --- report --------------------------------------------------------------------------


def print_live(live: dict[float, list[LiveRun]]) -> None:
    """The first run at the default target in full, then each target's summary."""
    main_run = live[LIVE_TARGETS[0]][0]
    print(
        f"\nLive run (target {LIVE_TARGETS[0]}, seed 0): retrained every "
        f"{RETRAIN_EVERY} inputs, {EXPLORE:.0%} of skipped pairs explored; recall "
        "counted from the first training on"
    )
    print(
        f"{'inputs':>6} {'calls saved':>11} {'true recall':>11} {'estimate':>8} "
        f"{'95% interval':>15}"
    )
    # About eight rows, always with the last.
    step = -(-len(main_run.checkpoints) // 8)
    shown = main_run.checkpoints[step - 1 :: step]
    if shown[-1] is not main_run.checkpoints[-1]:
        shown.append(main_run.checkpoints[-1])
    for point in shown:
        print(
            f"{point.inputs:>6} {point.saved:>11.1%} {point.true_recall:>11.1%} "
            f"{point.estimate:>8.1%} {point.low:>7.1%}-{point.high:<7.1%}"
        )
    print(
        f"  {main_run.calls:,} calls for {main_run.pairs:,} pairs "
        f"({main_run.explored:,} shadow judgments, {main_run.trainings} trainings); "
        f"YES kept {main_run.kept_yes}, missed {main_run.missed_yes} "
        f"(shadow found {main_run.shadow_yes}); the interval contains the true "
        f"recall: {'yes' if main_run.covered else 'NO'}"
    )
    for target, runs in live.items():
        covered = sum(run.covered for run in runs)
        print(
            f"  target {target}, {len(runs)} orders: calls saved "
            f"{statistics.mean(r.saved for r in runs):.1%} (mean), true recall "
            f"{statistics.mean(r.true_recall for r in runs):.1%} (mean; min "
            f"{min(r.true_recall for r in runs):.1%}), estimate "
            f"{statistics.mean(r.estimate for r in runs):.1%} (mean); the interval "
            f"contains the true recall in {covered}/{len(runs)}"
        )


def report_set(data: LabelledSet, args: argparse.Namespace) -> dict[str, Any]:
    """Run and print every figure for one set."""
    n, m = len(data.texts), len(data.rule_ids)
    yes = sum(len(g) for g in data.gold)
    print(
        f"\n=== {data.name}: {n} inputs x {m} rules, {yes} YES pairs "
        f"({yes / (n * m):.1%}; {yes / n:.1f} per input) ==="
    )
    print(f"\n{FOLDS}-fold over the inputs (thresholds chosen on the training folds):")
    print(
        f"{'target':>6} {'judged/input':>12} {'saved':>7} {'recall':>7} "
        f"{'recall per fold':>16} {'saved per fold':>15} {'expected':>8} {'train s':>7}"
    )
    rows = []
    for target in TARGETS:
        row = kfold(data, target)
        rows.append(row)
        print(
            f"{target:>6.2f} {row.judged_per_input:>7.1f}/{m:<4} {row.saved:>7.1%} "
            f"{row.recall:>7.1%} "
            f"{row.fold_recall_min:>7.1%}-{row.fold_recall_max:<7.1%} "
            f"{row.fold_saved_min:>7.1%}-{row.fold_saved_max:<6.1%} "
            f"{row.expected_recall:>8.1%} {row.train_seconds:>7.2f}"
        )
    print("\nLearning curve (target 0.95; mean of 5 folds x 5 orders):")
    print(f"{'trained on':>12} {'judged/input':>12} {'saved':>7} {'recall':>7}")
    curve = learning_curve(data)
    for point in curve:
        print(
            f"{point.inputs!s:>12} {point.judged_per_input:>7.1f}/{m:<4} "
            f"{point.saved:>7.1%} {point.recall:>7.1%}"
        )
    times = timing(data, args.repeats)
    print(
        f"\nTime: training on {times.train_inputs} inputs x {times.rules} rules "
        f"{times.train_seconds:.2f} s; selection per input median "
        f"{times.select_median_ms:.2f} ms, p99 {times.select_p99_ms:.2f} ms, "
        f"max {times.select_max_ms:.2f} ms; model file {times.file_bytes:,} bytes"
    )
    print(
        f"Retraining from the verdict log: the retrieval crossing the mark waits "
        f"{times.retrain_sync_ms:.0f} ms training in its own thread, "
        f"{times.retrain_poll_ms:.2f} ms with the background Retrainer (which "
        f"installs the new model {times.retrain_background_s:.2f} s later)"
    )
    runs = args.live_runs if data.name == "nba" else args.obliqa_live_runs
    live = {
        target: [live_run(data, seed, target=target) for seed in range(runs)]
        for target in LIVE_TARGETS
    }
    print_live(live)
    return {
        "inputs": n,
        "rules": m,
        "yes_pairs": yes,
        "kfold": [asdict(row) for row in rows],
        "learning_curve": [asdict(point) for point in curve],
        "timing": asdict(times),
        "live_runs": {
            str(target): [asdict(run) | {"covered": run.covered} for run in runs]
            for target, runs in live.items()
        },
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line: `--data-dir`, `--json`, `--repeats`, live runs, `--sets`."""
    parser = _common.make_parser(
        __doc__, data=True, repeats_default=3, repeats_help="timed selection passes"
    )
    parser.add_argument(
        "--live-runs",
        type=int,
        default=20,
        help="NBA live runs per target, in different input orders, for the "
        "interval's coverage (default 20)",
    )
    parser.add_argument(
        "--obliqa-live-runs",
        type=int,
        default=2,
        help="ObliQA live runs per target (about a minute each; default 2)",
    )
    parser.add_argument(
        "--sets",
        default="nba,obliqa",
        help="comma-separated sets to run: nba, obliqa (default both)",
    )
    args = _common.parse_arguments(parser, argv)
    if min(args.live_runs, args.obliqa_live_runs) < 1:
        parser.error("--live-runs and --obliqa-live-runs must be at least 1")
    unknown = set(args.sets.split(",")) - {"nba", "obliqa"}
    if unknown:
        parser.error(f"unknown sets: {', '.join(sorted(unknown))}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark on the chosen sets; print (and write JSON with `--json`).

    Returns:
        The exit status, 0.

    Raises:
        SystemExit: With status 2 if the data is missing.
    """
    args = parse_args(argv)
    data_dir = _common.require_data_dir(args.data_dir, REQUIRED)
    print(
        "Learned prefilter. The verdicts are the GOLD LABELS standing in for the "
        "judge's (an oracle judge): no LLM is called."
    )
    started = time.perf_counter()
    figures: dict[str, Any] = {"oracle_judge": "gold labels"}
    loaders = {"nba": nba_set, "obliqa": obliqa_set}
    for name in args.sets.split(","):
        figures[name] = report_set(loaders[name](data_dir), args)
    print(f"\nTotal {time.perf_counter() - started:.0f} s.")
    if "nba" in figures:
        row = figures["nba"]["kfold"][0]
        live = figures["nba"]["live_runs"][str(LIVE_TARGETS[0])][0]
        print(
            f"Targets (NBA): >= 55% saved at 95% recall: {row['saved']:.1%} saved, "
            f"recall {row['recall']:.1%}; live interval contains the true recall "
            f"(seed 0): {'yes' if live['covered'] else 'no'}."
        )
    if args.json:
        _common.write_json(args.json, figures)
        print(f"Figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
