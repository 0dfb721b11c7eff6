"""Benchmark of the judge cascade on RuleArena-NBA: strong calls saved, recall lost.

The labelled set is real: the 55 RuleArena-NBA catalogue rules (`rule_catalog.json`,
the description as the condition) against the dev problems (`problems_dev.jsonl`;
the input is the team situations, player situations and operations), gold being
each problem's `relevant_rules`, normalised with `rule_label_aliases.json` (labels
that name no rule dropped) and deduplicated.

The judges are fakes with KNOWN error rates (`NoisyJudgeFakeChatModel`): each knows
the gold answer and flips it for a fixed, hash-chosen share of pairs. The strong
judge errs on 5% of the applicable pairs and 3% of the others. Each cheap judge has
a false-negative / false-positive rate and emits OpenAI-style logprobs: when right,
its answer's probability is uniform in [0.85, 0.99]; when wrong, in [0.55, 0.69]
if it is "calibrated", or as when right if "overconfident". For each cheap judge
and `no_threshold`, the table gives the strong calls saved (share of pairs decided
by a confident cheap NO) and micro-averaged recall and precision against gold,
next to the strong judge alone and the cheap judge alone.

Verdicts are cached per judge, so a threshold sweep reuses the cheap judge's
answers and the escalations reuse the strong judge's; the counts are of judgments
asked, as in a run without a cache.

Run from the repository root:

    python benchmarks/bench_cascade.py [--data-dir DIR] [--json results.json]

The exit status is 1 if any judgment failed or a count does not add up, 2 if the
data is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import _common

from langchain_tag.matching import (
    ApplicabilityJudge,
    BaseJudge,
    CascadeJudge,
    CascadeStats,
    Verdict,
)
from langchain_tag.rules import Rule
from langchain_tag.testing import NoisyJudgeFakeChatModel

DATA = Path("rulearena_nba")
FILES = (
    DATA / "rule_catalog.json",
    DATA / "problems_dev.jsonl",
    DATA / "rule_label_aliases.json",
)
THRESHOLDS = (0.05, 0.1, 0.2, 0.5)
RIGHT = (0.99, 0.14)
"""Confidence of right answers: at most 0.99, lowered by up to 0.14."""
WRONG_CALIBRATED = 0.69
"""Top confidence of a calibrated judge's wrong answers (lowered by up to 0.14)."""


@dataclass(frozen=True)
class Problem:
    """One dev problem: its id, the judged text and the gold rule ids."""

    problem_id: str
    text: str
    gold: frozenset[str]


@dataclass(frozen=True)
class CheapSetting:
    """A cheap judge's error rates and calibration."""

    name: str
    false_negative_rate: float
    false_positive_rate: float
    calibrated: bool


CHEAP_SETTINGS = (
    CheapSetting("fn10/fp10 calibrated", 0.10, 0.10, calibrated=True),
    CheapSetting("fn10/fp10 overconfident", 0.10, 0.10, calibrated=False),
    CheapSetting("fn25/fp25 calibrated", 0.25, 0.25, calibrated=True),
    CheapSetting("fn25/fp25 overconfident", 0.25, 0.25, calibrated=False),
)


@dataclass
class Row:
    """One judging setup's figures over all pairs."""

    judge: str
    no_threshold: float | None
    pairs: int
    strong_calls: int
    strong_saved: float
    recall: float
    precision: float


def load_rules(data_dir: Path) -> list[Rule]:
    """The catalogue rules, the description as condition.

    Args:
        data_dir: The shared data directory.

    Returns:
        One rule per catalogue entry, in catalogue order.
    """
    catalogue = json.loads((data_dir / FILES[0]).read_text(encoding="utf-8"))
    return [
        Rule(
            rule_id=entry["rule_id"],
            name=entry["rule_id"].replace("_", " "),
            condition=entry["description"],
            action=f"Check the transaction against {entry['rule_id']}.",
            tags=(entry["category"],),
        )
        for entry in catalogue
    ]


def load_problems(data_dir: Path, rule_ids: set[str]) -> list[Problem]:
    """The dev problems with normalised, deduplicated gold rule ids.

    Args:
        data_dir: The shared data directory.
        rule_ids: The catalogue ids; every normalised gold label must be one.

    Returns:
        The problems, in file order.

    Raises:
        ValueError: A gold label is neither a catalogue id nor an alias of one.
    """
    aliases: Mapping[str, str | None] = json.loads(
        (data_dir / FILES[2]).read_text(encoding="utf-8")
    )["aliases"]
    problems = []
    lines = (data_dir / FILES[1]).read_text(encoding="utf-8").splitlines()
    for line in filter(None, lines):
        record = json.loads(line)
        gold = {aliases.get(label, label) for label in record["relevant_rules"]}
        gold.discard(None)
        unknown = gold - rule_ids
        if unknown:
            msg = (
                f"{FILES[1]}: problem {record['id']} has gold labels {sorted(unknown)} "
                f"that are neither catalogue ids nor aliases in {FILES[2]}."
            )
            raise ValueError(msg)
        text = "\n".join(
            record["team_situations"]
            + record["player_situations"]
            + record["operations"]
        )
        problems.append(Problem(record["id"], text, frozenset(gold)))
    return problems


def noisy_judge(
    gold: Mapping[str, frozenset[str]],
    false_negative_rate: float,
    false_positive_rate: float,
    *,
    wrong_confidence: float | None,
    seed: int,
) -> ApplicabilityJudge:
    """A judge whose fake model knows `gold` and errs at the given rates.

    Args:
        gold: Problem text -> applicable rule ids.
        false_negative_rate: Share of applicable pairs answered NO.
        false_positive_rate: Share of other pairs answered YES.
        wrong_confidence: Top confidence of wrong answers; None as when right.
        seed: Chooses which pairs are wrong.

    Returns:
        A judge with logprobs on.
    """
    llm = NoisyJudgeFakeChatModel(
        truth=lambda text, fields: fields["rule_id"] in gold[text],
        false_negative_rate=false_negative_rate,
        false_positive_rate=false_positive_rate,
        confidence=RIGHT[0],
        wrong_confidence=wrong_confidence,
        confidence_spread=RIGHT[1],
        seed=seed,
        logprobs=True,
    )
    return ApplicabilityJudge(llm=llm, logprobs=True)


async def judge_all(
    judge: BaseJudge, problems: Sequence[Problem], rules: Sequence[Rule]
) -> list[list[Verdict]]:
    """Every problem judged against every rule, problems in turn.

    Args:
        judge: The judge (a cascade or a single one).
        problems: The inputs.
        rules: The rules.

    Returns:
        Per problem, the verdicts in rule order.
    """
    return [
        await judge.ajudge_rules(problem.text, rules, {"max_concurrency": 64})
        for problem in problems
    ]


def score(
    problems: Sequence[Problem], verdicts: Sequence[Sequence[Verdict]]
) -> tuple[float, float]:
    """Micro-averaged recall and precision of the YES verdicts against gold.

    Args:
        problems: The problems, with gold.
        verdicts: Their verdicts, in the same order.

    Returns:
        (recall, precision); precision is 1.0 when nothing was returned.
    """
    hits = returned = relevant = 0
    for problem, judged in zip(problems, verdicts, strict=True):
        chosen = {v.rule_id for v in judged if v.applies}
        hits += len(chosen & problem.gold)
        returned += len(chosen)
        relevant += len(problem.gold)
    return hits / relevant, hits / returned if returned else 1.0


def checked(stats: CascadeStats, pairs: int, verdicts: list[list[Verdict]]) -> None:
    """Fail loudly if a judgment failed or the cascade's counts do not add up.

    Raises:
        SystemExit: With status 1.
    """
    failed = [v.rule_id for judged in verdicts for v in judged if v.failed]
    by_stage = sum(v.decided_by == "cheap" for judged in verdicts for v in judged)
    if (
        failed
        or stats.escalated_by.get("failed")
        or stats.cheap_calls != pairs
        or stats.final_by_cheap + stats.strong_calls != pairs
        or by_stage != stats.final_by_cheap
    ):
        print(f"error: inconsistent cascade run: {stats!r}, failed={failed[:5]}")
        raise SystemExit(1)


async def run(problems: list[Problem], rules: list[Rule]) -> list[Row]:
    """Strong alone, then each cheap judge alone and in a cascade per threshold.

    Args:
        problems: The labelled inputs.
        rules: The catalogue rules.

    Returns:
        The table's rows.
    """
    gold = {problem.text: problem.gold for problem in problems}
    pairs = len(problems) * len(rules)
    strong = noisy_judge(gold, 0.05, 0.03, wrong_confidence=None, seed=1)
    recall, precision = score(problems, await judge_all(strong, problems, rules))
    rows = [Row("strong only", None, pairs, pairs, 0.0, recall, precision)]
    for setting in CHEAP_SETTINGS:
        cheap = noisy_judge(
            gold,
            setting.false_negative_rate,
            setting.false_positive_rate,
            wrong_confidence=WRONG_CALIBRATED if setting.calibrated else None,
            seed=2,
        )
        recall, precision = score(problems, await judge_all(cheap, problems, rules))
        rows.append(
            Row(f"{setting.name}: alone", None, pairs, 0, 1.0, recall, precision)
        )
        for threshold in THRESHOLDS:
            cascade = CascadeJudge(cheap=cheap, strong=strong, no_threshold=threshold)
            verdicts = await judge_all(cascade, problems, rules)
            stats = cascade.stats
            checked(stats, pairs, verdicts)
            recall, precision = score(problems, verdicts)
            rows.append(
                Row(
                    f"{setting.name}: cascade",
                    threshold,
                    pairs,
                    stats.strong_calls,
                    stats.strong_calls_saved,
                    recall,
                    precision,
                )
            )
    return rows


def print_report(
    rows: Sequence[Row], problems: int, rules: int, seconds: tuple[float, float]
) -> None:
    """Print the table, recall and precision also as differences to strong only.

    Args:
        rows: The table's rows, strong only first.
        problems: How many problems were judged.
        rules: Against how many rules.
        seconds: Wall and CPU time of the whole run.
    """
    base = rows[0]
    print(
        f"Judge cascade on RuleArena-NBA dev: {problems} problems x {rules} rules = "
        f"{base.pairs} pairs; strong judge: fn 5%, fp 3%.\n"
    )
    header = (
        f"{'judge':<34} {'no_thr':>6} {'strong calls':>12} {'saved':>7} "
        f"{'recall':>7} {'d_rec':>7} {'precision':>9} {'d_prec':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        threshold = "-" if row.no_threshold is None else f"{row.no_threshold:.2f}"
        print(
            f"{row.judge:<34} {threshold:>6} {row.strong_calls:>12} "
            f"{row.strong_saved:>7.1%} {row.recall:>7.3f} "
            f"{row.recall - base.recall:>+7.3f} {row.precision:>9.3f} "
            f"{row.precision - base.precision:>+7.3f}"
        )
    print(
        "\nsaved = pairs decided by a confident cheap NO (P(YES) <= no_thr); "
        "d_ = difference to strong only.\nThe fakes' errors are independent, so a "
        "confident cheap NO also removes strong false positives (precision can rise);"
        "\nreal models' errors correlate."
    )
    print(f"Elapsed: {seconds[0]:.1f} s wall, {seconds[1]:.1f} s CPU")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Read the command line (`--data-dir`, `--json`)."""
    parser = _common.make_parser(__doc__, data=True, repeats_default=None)
    return _common.parse_arguments(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table (and write JSON with `--json`).

    Returns:
        The exit status: 0, or 1 if a count did not add up (via SystemExit).
    """
    args = parse_args(argv)
    data_dir = _common.require_data_dir(args.data_dir, FILES)
    started = time.perf_counter(), time.process_time()
    rules = load_rules(data_dir)
    problems = load_problems(data_dir, {rule.rule_id for rule in rules})
    rows = asyncio.run(run(problems, rules))
    seconds = (
        time.perf_counter() - started[0],
        time.process_time() - started[1],
    )
    print_report(rows, len(problems), len(rules), seconds)
    if args.json:
        _common.write_json(
            args.json,
            {
                "problems": len(problems),
                "rules": len(rules),
                "wall_seconds": seconds[0],
                "cpu_seconds": seconds[1],
                "rows": [asdict(row) for row in rows],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
