"""Evaluation reports: results tables (Markdown, CSV, JSON) and a cost-quality plot.

The Markdown table has one section per task, with that task's quality columns and
the cost columns; skipped methods are listed under it with the reason, and the
mismatch diagnostic of the similarity scorers follows. CSV and JSON hold every
field of every `EvalResult` (`diagnostic.json` the diagnostics). The plot
(matplotlib) puts each method at (LLM calls per input, quality)
and (units given to the executor per input, quality), one row of panels per task.

Tokens are as the models reported them ("-": a model reported none); "cached in"
is the part of the input tokens a provider read from its prompt cache, billed at
its cached-input price. The oracle's answers are read from the gold labels: the
tables count them as oracle look-ups, never as LLM calls, and say what a judge
model in the oracle's place would cost; the plot puts the oracle at those calls,
so it is compared with TAG at TAG's cost.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from langchain_tag_experiments.evaluation.diagnostic import DiagnosticResult
from langchain_tag_experiments.evaluation.learned import KFOLDS
from langchain_tag_experiments.evaluation.methods import SUITES
from langchain_tag_experiments.evaluation.runner import EvalResult
from langchain_tag_experiments.evaluation.tasks import METRICS, TaskName

__all__ = [
    "ReportFiles",
    "main_metric",
    "markdown_table",
    "plot_cost_quality",
    "write_csv",
    "write_json",
    "write_report",
]

MAIN_METRICS: dict[TaskName, tuple[str, ...]] = {
    # The first one measured is plotted: end-task quality when an executor ran.
    "nba": ("strict_accuracy", "f1_micro"),
    "obliqa": ("recall_at_10",),
    "humaneval": ("pass_at_1", "pylint"),
    "npov": ("vfr", "exact_match", "bleu"),
    "custom": ("f1_micro", "reference_exact"),
}

TASK_TITLES: dict[TaskName, str] = {
    "nba": "RuleArena-NBA",
    "obliqa": "ObliQA sample",
    "humaneval": "HumanEval + PEP 8",
    "npov": "NPOV rewriting (WNC sample)",
    "custom": "Your labelled set",
}

SCORER_LABELS: dict[str, str] = {
    "learned": f"learned from verdicts ({KFOLDS}-fold)",
}
"""How the diagnostic table names a scorer (others by their key)."""


class ReportFiles(NamedTuple):
    """Where `write_report` wrote the results."""

    markdown: Path
    csv: Path
    json: Path
    diagnostic: Path
    plot: Path | None


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _table(headings: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Markdown table lines: the heading row, the rule, a line per row of cells."""
    return [
        "| " + " | ".join(headings) + " |",
        "|" + "|".join("---" for _ in headings) + "|",
        *("| " + " | ".join(_cell(c) for c in cells) + " |" for cells in rows),
    ]


def main_metric(task: TaskName, results: Sequence[EvalResult]) -> str | None:
    """The quality metric plotted for `task`: its first one any method measured."""
    return next(
        (
            name
            for name in MAIN_METRICS[task]
            if any(name in r.metrics for r in results)
        ),
        None,
    )


def markdown_table(
    results: Sequence[EvalResult], diagnostics: Sequence[DiagnosticResult] = ()
) -> str:
    """The results as Markdown: a section per task, skipped methods listed below.

    Quality columns nobody measured are left out; the notes say why. With
    `diagnostics`, each task's section ends with how well each similarity scorer
    predicts the gold rules (the N a prefilter needs).
    """
    sections = []
    for task in METRICS:
        rows = [r for r in results if r.task == task]
        found = [d for d in diagnostics if d.task == task]
        if rows:
            sections.append(_task_section(task, rows))
            if square := _two_by_two(task, rows):
                sections.append(square)
        if found:
            sections.append(_diagnostic_section(found))
    return "\n\n".join(sections) + "\n"


def _two_by_two(task: TaskName, rows: Sequence[EvalResult]) -> str | None:
    """The paper's 2x2 (units x selection) on the main metric, when all four ran."""
    chunks_sim, chunks_app, rules_app, rules_sim = SUITES["2x2"]
    found = {r.method: r for r in rows if r.status == "ok"}
    metric = main_metric(task, list(found.values()))
    if metric is None or not all(name in found for name in SUITES["2x2"]):
        return None

    def cell(name: str) -> str:
        return _cell(found[name].metrics.get(metric))

    return "\n".join(
        [
            f"### {TASK_TITLES[task]}: units x selection ({metric})",
            "",
            *_table(
                ["units", "similarity", "applicability"],
                [
                    [
                        f"chunks ({chunks_sim}, {chunks_app})",
                        cell(chunks_sim),
                        cell(chunks_app),
                    ],
                    [
                        f"rules ({rules_sim}, {rules_app})",
                        cell(rules_sim),
                        cell(rules_app),
                    ],
                ],
            ),
        ]
    )


def _diagnostic_section(diagnostics: Sequence[DiagnosticResult]) -> str:
    ks = sorted({k for d in diagnostics for k in d.report.recall_at_k})
    first = diagnostics[0].report
    headings = [
        "scorer",
        "AUC pooled",
        "AUC per input",
        *(f"recall@{k}" for k in ks),
        "N for 95%",
        "N for 99%",
    ]
    title = (
        f"### {TASK_TITLES[diagnostics[0].task]}: similarity as a predictor of "
        f"the gold rules ({first.n_queries} inputs, {first.units_total} rules, "
        f"{first.gold_pairs} gold pairs)"
    )
    rows = (
        [
            SCORER_LABELS.get(d.scorer, d.scorer),
            d.report.roc_auc_pooled,
            d.report.roc_auc_mean_per_query,
            *(d.report.recall_at_k.get(k) for k in ks),
            d.report.n_for_95_recall,
            d.report.n_for_99_recall,
        ]
        for d in diagnostics
    )
    return "\n".join([title, "", *_table(headings, rows)])


def _task_section(task: TaskName, rows: Sequence[EvalResult]) -> str:
    ran = [r for r in rows if r.status == "ok"]
    graded = any(r.grader_calls for r in ran)
    looked_up = any(r.oracle_lookups for r in ran)
    quality = [
        metric for metric in METRICS[task] if any(metric.key in r.metrics for r in ran)
    ]
    headings = [
        "method",
        "units",
        "n",
        *(metric.heading for metric in quality),
        "LLM calls",
        *(["oracle look-ups"] if looked_up else []),
        "calls/input",
        "tokens in",
        "cached in",
        "tokens out",
        "wall s",
        "units/input",
        "chars/input",
        "malformed",
        "failures",
        *(["grader calls"] if graded else []),
    ]
    cells = (
        [
            r.method,
            r.units,
            r.n,
            *(r.metrics.get(metric.key) for metric in quality),
            r.llm_calls,
            *([r.oracle_lookups] if looked_up else []),
            r.calls_per_input,
            r.input_tokens,
            r.cached_input_tokens,
            r.output_tokens,
            f"{r.wall_seconds:.2f}",
            r.mean_units,
            None if r.mean_context_chars is None else round(r.mean_context_chars),
            r.malformed,
            r.failures,
            *([r.grader_calls] if graded else []),
        ]
        for r in ran
    )
    lines = [f"## {TASK_TITLES[task]}", "", *_table(headings, cells)]
    notes = _notes(ran)
    failures = [
        f"Failures of {r.method}: {r.failures}, the first: {r.first_error}"
        for r in ran
        if r.failures
    ]
    skipped: dict[str, list[str]] = {}
    for r in rows:
        if r.status == "skipped":
            skipped.setdefault(r.skip_reason or "", []).append(r.method)
    lookups = [_lookups_line(r) for r in ran if r.oracle_lookups]
    if notes or lookups or failures:
        lines += [
            "",
            *(f"Note: {note}." for note in notes),
            *lookups,
            *failures,
        ]
    if skipped:
        lines += [
            "",
            "Skipped:",
            *(f"- {', '.join(names)}: {reason}" for reason, names in skipped.items()),
        ]
    return "\n".join(lines)


def _lookups_line(result: EvalResult) -> str:
    """What the oracle's look-ups of `result` are, and what a model would cost."""
    per_input = result.oracle_lookups / result.n if result.n else 0.0
    paid = (
        "no model ran and nothing was paid; the tokens shown are what a decision "
        "model's requests would carry"
        if result.input_tokens
        else "no model ran, no tokens, nothing paid"
    )
    return (
        f"Oracle look-ups of {result.method}: {result.oracle_lookups:,} "
        f"({per_input:.1f} per input), answered from the gold labels, not LLM calls: "
        f"{paid}. A judge model in the oracle's place would make "
        f"{result.oracle_lookups:,} calls, at its price."
    )


def _notes(rows: Sequence[EvalResult]) -> list[str]:
    """Each note once, naming the methods it is about unless it is about all."""
    said: dict[str, list[str]] = {}
    for r in rows:
        for note in r.notes:
            said.setdefault(note, []).append(r.method)
    return sorted(
        note if len(methods) == len(rows) else f"{', '.join(methods)}: {note}"
        for note, methods in said.items()
    )


def write_csv(results: Sequence[EvalResult], path: str | os.PathLike[str]) -> Path:
    """Every field of every result, one row each (notes joined by '; ')."""
    target = Path(path)
    with target.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=EvalResult.columns())
        writer.writeheader()
        writer.writerows(
            {**result.model_dump(mode="json"), "notes": "; ".join(result.notes)}
            for result in results
        )
    return target


def write_json(
    results: Sequence[EvalResult | DiagnosticResult], path: str | os.PathLike[str]
) -> Path:
    """The results (or diagnostics) as a JSON list."""
    target = Path(path)
    payload = [result.model_dump(mode="json") for result in results]
    target.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return target


_FAMILY_COLOURS = {
    "none": "#7f7f7f",
    "all": "#8c564b",
    "similarity": "#1f77b4",
    "prefilter": "#17becf",
    "tag": "#d62728",
    "cascade": "#ff7f0e",
    "oracle": "#2ca02c",
    "reranker": "#9467bd",
    "applicability": "#e377c2",
    "llm-filter": "#bcbd22",
}


def _figure(rows: int) -> Any:
    """A figure of `rows` x 2 panels, drawn by Agg and unknown to pyplot.

    Neither the process's backend nor pyplot's figure list is touched, so a
    notebook's inline plots keep working after a report is written.
    """
    try:
        from matplotlib.backends.backend_agg import (  # noqa: PLC0415 - optional
            FigureCanvasAgg,
        )
        from matplotlib.figure import Figure  # noqa: PLC0415 - only to plot
    except ImportError as error:
        msg = (
            "The cost-versus-quality plot needs matplotlib, a dependency of "
            "langchain-tag-experiments: pip install langchain-tag-experiments."
        )
        raise ImportError(msg) from error
    figure = Figure(figsize=(14, 5.5 * rows), dpi=_DPI)
    FigureCanvasAgg(figure)  # attaches itself: layout and labels need a renderer
    return figure


PLOT_LABELS = {
    "strict_accuracy": "strict accuracy",
    "f1_micro": "rule-selection F1 (micro)",
    "recall_at_10": "Recall@10 of gold passages",
    "pass_at_1": "pass@1",
    "pylint": "pylint score",
    "vfr": "violation fix rate (VFR)",
    "exact_match": "exact match with the neutral sentence",
    "bleu": "BLEU against the neutral sentence",
    "reference_exact": "exact match with the reference",
}

_DPI = 120
_FONT = 7
_LINE = _FONT * _DPI / 72 * 1.25
"""Height of one label line, in pixels."""


def plot_cost_quality(
    results: Sequence[EvalResult], path: str | os.PathLike[str]
) -> Path:
    """Plot each task's main quality metric against cost, as a PNG.

    One row per task that has a quality metric, two panels: x = LLM calls per
    input (the oracle's look-ups counted as the judge calls they stand for) and
    x = units given to the executor per input, both on a symmetric-log
    scale (linear below 1, so methods without calls or units sit at 0). Points are
    coloured by family and labelled with the method name; methods at the same
    point share a label, and labels are moved apart so none covers another.
    Methods without the metric (skipped, or chunks where rule selection is
    undefined) are left out.

    Raises:
        ImportError: matplotlib is not installed.
    """
    measured = [
        (task, rows, metric)
        for task in METRICS
        if (rows := [r for r in results if r.task == task and r.status == "ok"])
        and (metric := main_metric(task, rows)) is not None
    ]
    figure = _figure(max(len(measured), 1))
    axes = figure.subplots(max(len(measured), 1), 2, squeeze=False)
    if not measured:
        axes[0][0].set_title("no quality metric was measured")
    labels = []
    for row, (task, rows, metric) in zip(axes, measured, strict=False):
        for axis, x_name, x_label in (
            (
                row[0],
                "calls_per_input_with_lookups",
                "LLM calls per input (oracle: look-ups, as many as a judge's calls)",
            ),
            (row[1], "mean_units", "units given to the executor per input"),
        ):
            labels.append(_panel(axis, task, rows, metric, x_name, x_label))
    figure.tight_layout()
    for axis, points in labels:
        _annotate(axis, points)
    target = Path(path)
    figure.savefig(target, dpi=_DPI)
    return target


def _panel(
    axis: Any,
    task: TaskName,
    rows: Sequence[EvalResult],
    metric: str,
    x_name: str,
    x_label: str,
) -> tuple[Any, dict[tuple[float, float], list[str]]]:
    """Draw one panel's points; returns them, by position, for labelling."""
    label = PLOT_LABELS[metric]
    axis.set_title(f"{TASK_TITLES[task]}: {label}")
    axis.set_xlabel(f"{x_label} (symlog)")
    axis.set_ylabel(label)
    axis.grid(visible=True, alpha=0.3)
    axis.set_xscale("symlog", linthresh=1.0)
    names: dict[tuple[float, float], list[str]] = {}
    for family, colour in _FAMILY_COLOURS.items():
        points = [
            (float(getattr(r, x_name)), r.metrics[metric], r.method)
            for r in rows
            if r.family == family
            and metric in r.metrics
            and getattr(r, x_name) is not None
        ]
        if not points:
            continue
        xs, ys, _ = zip(*points, strict=True)
        axis.scatter(xs, ys, color=colour, label=family, s=36, zorder=3)
        for x, y, name in points:
            names.setdefault((x, y), []).append(name)
    axis.legend(fontsize=_FONT, loc="best")
    axis.margins(x=0.12, y=0.08)  # room for the labels of the outermost points
    return axis, names


def _annotate(axis: Any, points: dict[tuple[float, float], list[str]]) -> None:
    """Label the points, lifting a label above any it would cover (greedy)."""
    placed: list[tuple[float, float, float]] = []  # left, right, baseline (pixels)
    for (x, y), names in sorted(points.items(), key=lambda item: item[0][1]):
        text = ", ".join(names)
        left, bottom = axis.transData.transform((x, y))
        left += 4
        right = left + len(text) * _FONT * _DPI / 72 * 0.55
        baseline = bottom + 3
        while any(
            l0 < right and left < r0 and abs(b0 - baseline) < _LINE
            for l0, r0, b0 in placed
        ):
            baseline += _LINE
        placed.append((left, right, baseline))
        lifted = baseline - bottom > _LINE
        axis.annotate(
            text,
            (x, y),
            xytext=(4, baseline - bottom),
            textcoords="offset pixels",
            fontsize=_FONT,
            arrowprops={"arrowstyle": "-", "lw": 0.4, "alpha": 0.5} if lifted else None,
        )


def write_report(
    results: Sequence[EvalResult],
    out_dir: str | os.PathLike[str],
    *,
    diagnostics: Sequence[DiagnosticResult] = (),
    plot: bool = True,
) -> ReportFiles:
    """Write the results tables, the diagnostics and the plot into `out_dir`.

    The files are `results.md`, `results.csv`, `results.json`, `diagnostic.json`
    and `cost_quality.png`. The tables are written before the plot, so they exist
    even when matplotlib is missing.

    Raises:
        ImportError: `plot` is set and matplotlib is not installed.
    """
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    markdown = directory / "results.md"
    markdown.write_text(markdown_table(results, diagnostics), encoding="utf-8")
    return ReportFiles(
        markdown=markdown,
        csv=write_csv(results, directory / "results.csv"),
        json=write_json(results, directory / "results.json"),
        diagnostic=write_json(diagnostics, directory / "diagnostic.json"),
        # Plotted last: the tables are written even when matplotlib is missing.
        plot=plot_cost_quality(results, directory / "cost_quality.png")
        if plot
        else None,
    )
