"""Benchmark of the learned prefilter's recall promise, kept live over a stream.

The verdicts are the gold labels standing in for the judge's (an oracle judge): an
(input, rule) pair of RuleArena-NBA dev (131 problems x 55 catalogue rules) is YES
when the rule is among the problem's gold rules. No LLM is called.

Each stream replays the dev problems one at a time in a random order through the
package's own classes, as `MatchEngine` runs them: `ShadowJudging` partitions
each input with the `LearnedPrefilter` (5% of the skipped pairs explored) and
records the skipped pairs in an SQLite `VerdictLog`; the judged pairs' verdicts are
appended to the log (`VerdictRecord`, explored ones with their rate); then
`Retrainer.poll()` trains again from the log once `--retrain-every` verdicts were
logged since the last training (the stream waits for each training, so the
figures do not depend on thread timing). Two methods, on the same orders:

- `before`: `Retrainer(budget=None)`, training on the verdicts alone at
  `target_recall` (what the package did before).
- `promise`: the default `Retrainer`: skipped pairs nobody judged enter the
  threshold step as fractional YES, and the miss-budget controller (`MissBudget`)
  sets each training's internal target.

The warm-up is the inputs judged before the first model is installed (every rule
judged: `--retrain-every` verdicts, 20 inputs at the default). Per stream:

- recall = YES verdicts of judged, not explored, pairs / all YES verdicts, after
  the warm-up (strict: an explored YES counts as a miss, as it would be without
  the shadow);
- saved = 1 - judgments (judged + explored) / (inputs x rules), over the whole
  stream and after the warm-up; explored = explored pairs / (inputs x rules);
- the shadow estimate (`RecallEstimate`) at the end of the stream, against the
  true recall.

Per method and target: mean and 5th-percentile recall, the share of orders whose
recall reaches the target ("ok", the promise asks >= 95%), savings, the explored
share, the internal targets (first and last training), trainings per stream and
seconds per training (`FitReport.seconds`: mean, and the last one, over the most
skipped pairs), and the shadow estimate's mean and coverage.

Run from the repository root (needs the `learned` extra, scikit-learn):

    python benchmarks/bench_recall_promise.py [--orders 20] [--jobs 2] [--json out.json]

The exit status is 2 if the data is missing, else 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import _common
import numpy as np
from langchain_tag_experiments.evaluation import load_nba

from langchain_tag.learning.learned_prefilter import FeatureHashing, LearnedPrefilter
from langchain_tag.learning.promise import MissBudget
from langchain_tag.learning.retraining import Retrainer
from langchain_tag.learning.shadow import ShadowJudging
from langchain_tag.learning.verdict_log import SQLiteVerdictLog, VerdictRecord
from langchain_tag.matching import Verdict
from langchain_tag.rules import Rulebook

REQUIRED = (
    Path("rulearena_nba/problems_dev.jsonl"),
    Path("rulearena_nba/rule_catalog.json"),
)
TARGETS = (0.90, 0.95, 0.97)
METHODS = ("before", "promise")
EXPLORE = 0.05
WARM_INPUTS = 20
"""The default warm-up: `--retrain-every` is this many inputs judged on every rule."""
PROMISED_SHARE = 0.95
"""The share of orders whose recall must reach the target."""
ORDER_SEED = 2000
"""Stream order `k` is `numpy.random.default_rng(ORDER_SEED + k).permutation`."""


@dataclass(frozen=True)
class Stream:
    """The labelled set: inputs, their gold rule ids, the rulebook."""

    texts: list[str]
    gold: list[frozenset[str]]
    rulebook: Rulebook


def nba_stream(data_dir: Path) -> Stream:
    """NBA dev problems against the catalogue rules."""
    nba = load_nba(data_dir)
    return Stream(
        [p.text for p in nba.problems],
        [frozenset(p.gold_rule_ids) for p in nba.problems],
        nba.catalogue,
    )


@dataclass
class Run:
    """One stream order, one method, one target."""

    method: str
    target: float
    order: int
    inputs: int = 0
    rules: int = 0
    warm_inputs: int = 0
    calls: int = 0
    calls_after_warm: int = 0
    explored: int = 0
    yes: int = 0
    kept_yes: int = 0
    shadow_yes: int = 0
    trainings: int = 0
    internal_targets: list[float] = field(default_factory=list)
    train_seconds: list[float] = field(default_factory=list)
    estimate: float | None = None
    estimate_low: float | None = None
    estimate_high: float | None = None

    @property
    def recall(self) -> float:
        """Kept YES over all YES after the warm-up (explored YES are misses)."""
        return self.kept_yes / self.yes if self.yes else 1.0

    @property
    def saved(self) -> float:
        """Judgments not made, over the whole stream."""
        return 1.0 - self.calls / (self.inputs * self.rules)

    @property
    def saved_after_warm(self) -> float:
        """Judgments not made, after the warm-up."""
        pairs = (self.inputs - self.warm_inputs) * self.rules
        return 1.0 - self.calls_after_warm / pairs if pairs else 0.0

    @property
    def explored_share(self) -> float:
        """Explored pairs over all pairs of the stream."""
        return self.explored / (self.inputs * self.rules)

    @property
    def covered(self) -> bool:
        """Whether the shadow estimate's interval holds the true recall."""
        return (
            self.estimate_low is not None
            and self.estimate_high is not None
            and self.estimate_low <= self.recall <= self.estimate_high
        )


def run_stream(
    data: Stream, order: int, target: float, method: str, every: int, directory: Path
) -> Run:
    """Replay one order of the inputs through shadow judging, the log, retraining."""
    rng = np.random.default_rng(ORDER_SEED + order)
    sequence = rng.permutation(len(data.texts)).tolist()
    rules = data.rulebook.rules
    run = Run(method, target, order, inputs=len(sequence), rules=len(rules))
    log = SQLiteVerdictLog(directory / f"{method}-{target}-{order}.sqlite")
    prefilter = LearnedPrefilter(data.rulebook, target_recall=target)
    shadow = ShadowJudging(prefilter, explore=EXPLORE, log=log)
    retrainer = Retrainer(
        prefilter,
        log,
        data.rulebook,
        every=every,
        budget=MissBudget() if method == "promise" else None,
    )
    for i in sequence:
        text, gold = data.texts[i], data.gold[i]
        screened = prefilter.fitted
        judged, explored = shadow.partition(text, rules)
        verdicts = [
            Verdict(rule_id=rule.rule_id, applies=rule.rule_id in gold)
            for rule in judged
        ]
        log.append(
            VerdictRecord.of(text, rule, verdict, explore=explored.get(rule.rule_id))
            for rule, verdict in zip(judged, verdicts, strict=True)
        )
        estimate = shadow.observe(verdicts, explored)
        run.calls += len(judged)
        run.explored += len(explored)
        if screened:
            kept = {r.rule_id for r in judged if r.rule_id not in explored}
            run.calls_after_warm += len(judged)
            run.yes += len(gold)
            run.kept_yes += len(gold & kept)
            run.shadow_yes += len(gold & set(explored))
        else:
            run.warm_inputs += 1
        if estimate is not None:
            run.estimate = estimate.estimate
            run.estimate_low, run.estimate_high = estimate.low, estimate.high
        future = retrainer.poll(rules)
        if future is not None:
            report = future.result()
            run.trainings += 1
            run.internal_targets.append(report.internal_target)
            run.train_seconds.append(report.seconds)
    log.close()
    return run


# --- workers -------------------------------------------------------------------------

_DATA: Stream | None = None


def _load(data_dir: Path) -> None:
    global _DATA  # noqa: PLW0603 - one load per worker process
    _DATA = nba_stream(data_dir)
    FeatureHashing().hash_matrix(["warm"])  # scikit-learn imported: not timed


def _job(job: tuple[int, float, str, int]) -> Run:
    order, target, method, every = job
    assert _DATA is not None  # noqa: S101 - set by the initializer
    with tempfile.TemporaryDirectory() as directory:
        return run_stream(_DATA, order, target, method, every, Path(directory))


# --- report --------------------------------------------------------------------------


@dataclass
class Row:
    """One method and target over every order."""

    method: str
    target: float
    orders: int
    mean_recall: float
    p5_recall: float
    ok: float
    saved: float
    saved_after_warm: float
    explored: float
    first_internal: float
    last_internal: float
    mean_estimate: float
    covered: float
    shadow_yes: float
    trainings: float
    train_seconds: float
    last_train_seconds: float


def summarise(runs: Sequence[Run]) -> Row:
    """The figures of one method and target."""
    recalls = [r.recall for r in runs]
    estimates = [r.estimate for r in runs if r.estimate is not None]
    return Row(
        method=runs[0].method,
        target=runs[0].target,
        orders=len(runs),
        mean_recall=statistics.mean(recalls),
        p5_recall=float(np.percentile(recalls, 5)),
        ok=sum(r.recall >= r.target for r in runs) / len(runs),
        saved=statistics.mean(r.saved for r in runs),
        saved_after_warm=statistics.mean(r.saved_after_warm for r in runs),
        explored=statistics.mean(r.explored_share for r in runs),
        first_internal=statistics.mean(r.internal_targets[0] for r in runs),
        last_internal=statistics.mean(r.internal_targets[-1] for r in runs),
        mean_estimate=statistics.mean(estimates) if estimates else float("nan"),
        covered=sum(r.covered for r in runs) / len(runs),
        shadow_yes=statistics.mean(r.shadow_yes for r in runs),
        trainings=statistics.mean(r.trainings for r in runs),
        train_seconds=statistics.mean(s for r in runs for s in r.train_seconds),
        last_train_seconds=statistics.mean(r.train_seconds[-1] for r in runs),
    )


def print_table(rows: Sequence[Row], warm: int) -> None:
    """The main table, then the shadow estimate beside the truth."""
    print(
        f"\nLive recall after the warm-up ({warm} inputs), strict; saved = judgments "
        "not made (judged + explored):"
    )
    print(
        f"{'method':<8} {'target':>6} {'mean':>6} {'p5':>6} {'ok':>5} "
        f"{'saved':>6} {'saved>warm':>10} {'explored':>8} {'t_int first->last':>17} "
        f"{'trainings':>9} {'train s':>7} {'last':>5}"
    )
    for row in rows:
        internal = f"{row.first_internal:.3f}->{row.last_internal:.3f}"
        print(
            f"{row.method:<8} {row.target:>6.2f} {row.mean_recall:>6.3f} "
            f"{row.p5_recall:>6.3f} {row.ok:>5.2f} {row.saved:>6.1%} "
            f"{row.saved_after_warm:>10.1%} {row.explored:>8.2%} {internal:>17} "
            f"{row.trainings:>9.1f} {row.train_seconds:>7.2f} "
            f"{row.last_train_seconds:>5.2f}"
        )
    print(
        "\nPromised vs estimated (end of stream): the shadow estimate "
        "(RecallEstimate) and how often its 95% interval holds the true recall"
    )
    print(
        f"{'method':<8} {'target':>6} {'true':>6} {'estimate':>8} {'covered':>7} "
        f"{'shadow YES':>10}"
    )
    for row in rows:
        print(
            f"{row.method:<8} {row.target:>6.2f} {row.mean_recall:>6.3f} "
            f"{row.mean_estimate:>8.3f} {row.covered:>7.2f} {row.shadow_yes:>10.1f}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = _common.make_parser(__doc__, data=True, repeats_default=None)
    parser.add_argument(
        "--orders",
        type=int,
        default=20,
        help="random stream orders per method and target (default 20)",
    )
    parser.add_argument(
        "--first-order",
        type=int,
        default=0,
        help="the first order's number (default 0): another value runs orders "
        "disjoint from the default ones",
    )
    parser.add_argument(
        "--targets",
        default=",".join(str(t) for t in TARGETS),
        help="comma-separated target_recall values (default 0.9,0.95,0.97)",
    )
    parser.add_argument(
        "--method",
        choices=("both", *METHODS),
        default="both",
        help="before (verdicts alone), promise (the default Retrainer), or both "
        "(default)",
    )
    parser.add_argument(
        "--retrain-every",
        type=int,
        default=None,
        help=f"verdicts between trainings (default {WARM_INPUTS} inputs x rules: "
        "the warm-up)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes (default 2, or the cores if fewer)",
    )
    args = _common.parse_arguments(parser, argv)
    if args.orders < 1 or args.jobs < 1 or args.first_order < 0:
        parser.error("--orders and --jobs must be at least 1, --first-order >= 0")
    try:
        args.target_list = [float(t) for t in args.targets.split(",")]
    except ValueError:
        parser.error(f"--targets must be numbers, got {args.targets!r}")
    if not all(0.0 < t <= 1.0 for t in args.target_list):
        parser.error("--targets must be in (0, 1]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every stream, print the tables (and write JSON with `--json`).

    Returns:
        The exit status, 0.

    Raises:
        SystemExit: With status 2 if the data is missing.
    """
    args = parse_args(argv)
    data_dir = _common.require_data_dir(args.data_dir, REQUIRED)
    data = nba_stream(data_dir)
    rules = len(data.rulebook.rules)
    every = args.retrain_every or WARM_INPUTS * rules
    methods = METHODS if args.method == "both" else (args.method,)
    print(
        "Recall promise, live. The verdicts are the GOLD LABELS standing in for the "
        "judge's (an oracle judge): no LLM is called."
    )
    yes = sum(len(g) for g in data.gold)
    print(
        f"RuleArena-NBA dev: {len(data.texts)} inputs x {rules} rules, {yes} YES "
        f"pairs; explore {EXPLORE:.0%}; retrain every {every} verdicts; "
        f"{args.orders} orders (from {args.first_order}) x "
        f"{len(args.target_list)} targets x "
        f"{len(methods)} methods, {args.jobs} worker(s)."
    )
    started = time.perf_counter()
    jobs = [
        (order, target, method, every)
        for method in methods
        for target in args.target_list
        for order in range(args.first_order, args.first_order + args.orders)
    ]
    with ProcessPoolExecutor(
        args.jobs, initializer=_load, initargs=(data_dir,)
    ) as pool:
        runs = list(pool.map(_job, jobs))
    rows = [
        summarise([r for r in runs if (r.method, r.target) == (method, target)])
        for method in methods
        for target in args.target_list
    ]
    print_table(rows, runs[0].warm_inputs)
    seconds = time.perf_counter() - started
    print(f"\nTotal {seconds:.0f} s.")
    promise = [row for row in rows if row.method == "promise"]
    if promise:
        kept = all(row.ok >= PROMISED_SHARE for row in promise)
        print(
            "Target: the promise kept (recall >= target in >= 95% of orders) at "
            f"every target: {'PASS' if kept else 'FAIL'}."
        )
    if args.json:
        _common.write_json(
            args.json,
            {
                "oracle_judge": "gold labels",
                "explore": EXPLORE,
                "retrain_every": every,
                "seconds": seconds,
                "rows": [asdict(row) for row in rows],
                "runs": [
                    asdict(run) | {"recall": run.recall, "saved": run.saved}
                    for run in runs
                ],
            },
        )
        print(f"Figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
