"""The mismatch diagnostic on real data: how well does similarity predict the gold?

For each labelled set and each similarity scorer of `langchain_tag.prefilter`, it
runs `mismatch_diagnostic` and prints ROC-AUC (pooled over all (query, unit) pairs
and the mean of per-query AUCs), mean recall@k for k in 5, 10, 20, 40, and N95/N99:
the smallest top-N keeping 95% / 99% of all gold (query, unit) pairs.

- RuleArena-NBA: the 131 dev problems (`NBAProblem.text`, without the shared
  assumptions) against the 55 catalogue rules (`rule_items`: name, condition =
  catalogue description, tag = category), gold = the normalised `relevant_rules`.
- ObliQA: the 491 dev questions against the 767 passages (passage text), gold =
  the gold passages.

Scorers: MiniLM dense (`LocalMiniLMEmbeddings`, all-MiniLM-L6-v2, offline), BM25
(`rank_bm25.BM25Okapi` over lowercase words) and hybrid (reciprocal rank fusion of
the two, k=60). No LLM is involved. The issue's earlier NBA measurement was
ROC-AUC 0.51 (MiniLM) and 0.59 (BM25).

Run from the repository root:

    python benchmarks/bench_diagnostic.py [--data-dir DIR] [--json results.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _common
from langchain_tag_experiments.evaluation import (
    MismatchReport,
    load_nba,
    load_obliqa,
    mismatch_diagnostic,
)

from langchain_tag.embeddings import LocalMiniLMEmbeddings
from langchain_tag.matching.prefilters import (
    BM25Scorer,
    DenseScorer,
    HybridScorer,
    SimilarityScorer,
    rule_items,
)

KS = (5, 10, 20, 40)
REQUIRED = (
    Path("rulearena_nba/problems_dev.jsonl"),
    Path("rulearena_nba/rule_catalog.json"),
    Path("obliqa_sample/questions_dev.json"),
)

LabelledSet = tuple[list[tuple[str, str]], dict[str, set[str]], list[tuple[str, str]]]
"""(queries as (id, text), gold unit ids per query id, units as (id, text))."""


def nba_set(data_dir: Path) -> LabelledSet:
    """NBA dev problems against the catalogue rules."""
    nba = load_nba(data_dir)
    return (
        [(p.id, p.text) for p in nba.problems],
        {p.id: set(p.gold_rule_ids) for p in nba.problems},
        rule_items(nba.catalogue),
    )


def obliqa_set(data_dir: Path) -> LabelledSet:
    """ObliQA dev questions against the passages."""
    obliqa = load_obliqa(data_dir)
    return (
        [(q.id, q.text) for q in obliqa.questions],
        {q.id: set(q.gold_unit_ids) for q in obliqa.questions},
        [(u.unit_id, u.text) for u in obliqa.units],
    )


def scorers(
    items: Sequence[tuple[str, str]],
) -> dict[str, Callable[[], SimilarityScorer]]:
    """Each scorer, built on demand (the dense one embeds every item)."""
    embeddings = LocalMiniLMEmbeddings()
    built: dict[str, SimilarityScorer] = {}

    def dense() -> SimilarityScorer:
        if "dense" not in built:
            built["dense"] = DenseScorer(items, embeddings)
        return built["dense"]

    return {
        "minilm": dense,
        "bm25": lambda: BM25Scorer(items),
        "hybrid": lambda: HybridScorer(dense(), BM25Scorer(items)),
    }


def run(data_dir: Path) -> list[dict[str, Any]]:
    """Every (data set, scorer) report, printed as it finishes."""
    rows = []
    header = (
        f"{'set':<7} {'scorer':<7} {'units':>5} {'AUC pool':>8} {'AUC q':>6} "
        + " ".join(f"{f'R@{k}':>6}" for k in KS)
        + f" {'N95':>4} {'N99':>4} {'s':>5}"
    )
    print(header)
    print("-" * len(header))
    for name, load in (("nba", nba_set), ("obliqa", obliqa_set)):
        queries, gold, items = load(data_dir)
        for scorer_name, make in scorers(items).items():
            started = time.perf_counter()
            report = mismatch_diagnostic(queries, gold, make(), ks=KS)
            seconds = time.perf_counter() - started
            print_row(name, scorer_name, report, seconds)
            rows.append(
                {
                    "set": name,
                    "scorer": scorer_name,
                    "seconds": seconds,
                    **report.model_dump(),
                }
            )
    return rows


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def print_row(name: str, scorer: str, report: MismatchReport, seconds: float) -> None:
    """One line of the table."""
    recalls = " ".join(f"{report.recall_at_k[k]:>6.3f}" for k in KS)
    print(
        f"{name:<7} {scorer:<7} {report.units_total:>5} "
        f"{_figure(report.roc_auc_pooled):>8} "
        f"{_figure(report.roc_auc_mean_per_query):>6} {recalls} "
        f"{report.n_for_95_recall or 'n/a':>4} {report.n_for_99_recall or 'n/a':>4} "
        f"{seconds:>5.1f}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line: `--data-dir`, `--json`."""
    parser = _common.make_parser(__doc__, data=True, repeats_default=None)
    return _common.parse_arguments(parser, argv)


def main(argv: list[str] | None = None) -> int:
    """Run the diagnostic on both sets and print the table.

    Returns:
        The exit status, 0.

    Raises:
        SystemExit: With status 2 if the data is missing.
    """
    args = parse_args(argv)
    data_dir = _common.require_data_dir(args.data_dir, REQUIRED)
    rows = run(data_dir)
    print(
        "\nAUC pool: pooled over all (query, unit) pairs; AUC q: mean per-query AUC;"
        "\nR@k: mean per-query recall of the top k; N95/N99: top-N keeping 95%/99%"
        " of all gold pairs."
    )
    if args.json:
        _common.write_json(args.json, {"ks": list(KS), "rows": rows})
        print(f"\nFigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
