"""The phase ablations (the method's Table 4): one extraction per skipped phase.

`aphase_ablation` extracts a rulebook from the task's instruction document with all
five phases, then once with each phase skipped, and evaluates the chosen methods
(TAG by default) on each rulebook: rows named `tag [full]`, `tag [w/o phase 3:
operationalisation]`, ... with the rulebook's size and the extraction's calls in
their notes. Extraction answers are kept in one SQLite file under
`checkpoint_dir`, so an interrupted suite resumes, and a section's answers from an
earlier phase are never asked for again by a later variant that keeps that phase.

The other named suite, the 2x2, is only a method selection (`methods.SUITES`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel

from langchain_tag.extraction import ExtractionReport, extract_rules
from langchain_tag_experiments.evaluation.runner import EvalResult, aevaluate
from langchain_tag_experiments.evaluation.tasks import EvalTask

__all__ = ["DOMAINS", "PHASE_NAMES", "VARIANTS", "aphase_ablation", "variant_label"]

PHASE_NAMES = {
    1: "span detection",
    2: "atomic decomposition",
    3: "operationalisation",
    4: "dedup and conflicts",
    5: "verification",
}

VARIANTS: tuple[frozenset[int], ...] = (
    frozenset(),
    *(frozenset({phase}) for phase in PHASE_NAMES),
)
"""All phases, then each phase skipped alone."""

DOMAINS = {
    "nba": "NBA salary cap and player transactions (Collective Bargaining Agreement)",
    "humaneval": "Python code style (PEP 8)",
    "npov": "Neutral point of view in encyclopedic writing",
    "custom": "instruction",
}
"""What each task's document governs, given to the extraction prompts."""


def variant_label(skipped: frozenset[int]) -> str:
    """`full`, or `w/o phase N: name` for the phases skipped."""
    if not skipped:
        return "full"
    return ", ".join(f"w/o phase {p}: {PHASE_NAMES[p]}" for p in sorted(skipped))


async def aphase_ablation(
    task: EvalTask,
    *,
    extraction_model: BaseChatModel,
    judge_model: BaseChatModel,
    executor_model: BaseChatModel | None = None,
    embeddings: Embeddings | None = None,
    methods: Sequence[str] = ("tag",),
    variants: Sequence[frozenset[int]] = VARIANTS,
    max_concurrency: int = 8,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    on_result: Callable[[EvalResult], None] | None = None,
) -> list[EvalResult]:
    """Extract the task's documents per variant and evaluate `methods` on each.

    Args:
        task: The task; its `documents` are extracted, its inputs evaluated.
        extraction_model: The model of the five phases.
        judge_model: TAG's judge (and the task's LLM grader).
        executor_model: The executor; None measures selection only.
        embeddings: For similarity methods, if chosen.
        methods: Method names or globs evaluated on every rulebook.
        variants: The phase sets to skip, one extraction each.
        max_concurrency: LLM calls in flight, in extraction and per method.
        checkpoint_dir: Where extraction answers are kept (resumable); None keeps
            none.
        on_result: Called with each row as soon as it is known.

    Raises:
        ValueError: The task has no documents to extract from.
    """
    if not task.documents:
        msg = f"The {task.name} task has no documents to extract rules from."
        raise ValueError(msg)
    checkpoint: Path | None = None
    if checkpoint_dir is not None:
        await asyncio.to_thread(Path(checkpoint_dir).mkdir, parents=True, exist_ok=True)
        checkpoint = Path(checkpoint_dir) / "extraction.sqlite"
    results: list[EvalResult] = []
    for skipped in variants:
        label = variant_label(skipped)
        # Synchronous extraction in a thread: a failed async run can leave its
        # SQLite checkpoint locked for the rest of the process.
        rulebook = await asyncio.to_thread(
            extract_rules,
            task.documents,
            llm=extraction_model,
            domain=DOMAINS[task.name],
            skip_phases=skipped,
            checkpoint=checkpoint,
            max_concurrency=max_concurrency,
        )
        report = ExtractionReport.model_validate(rulebook.diagnostics)
        calls = sum(phase.calls for phase in report.phases.values())
        note = (
            f"rulebook [{label}]: {len(rulebook.rules)} rules, {calls} extraction "
            f"calls ({sum(p.stored_answers for p in report.phases.values())} answers "
            "reused)"
        )
        for found in await aevaluate(
            task.with_rulebook(rulebook),
            methods=methods,
            judge_model=judge_model,
            executor_model=executor_model,
            embeddings=embeddings,
            max_concurrency=max_concurrency,
        ):
            row = found.model_copy(
                update={
                    "method": f"{found.method} [{label}]",
                    "notes": [*found.notes, note],
                }
            )
            results.append(row)
            if on_result is not None:
                on_result(row)
    return results
