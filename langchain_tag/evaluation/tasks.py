"""The evaluation tasks: their inputs, what methods retrieve from, how answers score.

- RuleArena-NBA (`nba`): rule selection against the gold `relevant_rules`, and
  strict accuracy of the executor's verdict.
- ObliQA (`obliqa`): Recall@10 and MAP@10 of the gold passages (retrieval only).
- HumanEval + PEP 8 (`humaneval`): pass@1 of the executor's code, and its pylint
  score.

`METRICS` names each task's quality metrics (`EvalResult.metrics`, report columns).
"""

from __future__ import annotations

import copy
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

from langchain_core.documents import Document
from typing_extensions import Self

from langchain_tag.evaluation import datasets, metrics
from langchain_tag.evaluation.humaneval import apylint_score, arun_check
from langchain_tag.execution import (
    CODE_TEMPLATE,
    NBA_TEMPLATE,
    ExecutionTemplate,
    NBAVerdict,
)
from langchain_tag.matching import CONDITION_PROFILE, RuleSchemaProfile
from langchain_tag.rules import Rule, Rulebook

__all__ = [
    "METRICS",
    "TASKS",
    "EvalItem",
    "EvalTask",
    "HumanEvalTask",
    "ItemOutcome",
    "Metric",
    "NBATask",
    "ObliQATask",
    "TaskName",
    "UnitKind",
    "humaneval_task",
    "load_task",
    "nba_task",
    "obliqa_task",
]

TaskName = Literal["nba", "obliqa", "humaneval"]
TASKS: tuple[TaskName, ...] = ("nba", "obliqa", "humaneval")

UnitKind = Literal["rules", "chunks", "passages"]
"""What a method hands the executor: rules' actions, text chunks, or whole passages
(ObliQA's passage rulebook)."""

RANK_CUTOFF = 10
"""k of the ranked-retrieval metrics (ObliQA Recall@10 and MAP@10)."""


class Metric(NamedTuple):
    """A quality metric: its key in `EvalResult.metrics` and its column heading."""

    key: str
    heading: str


METRICS: Mapping[TaskName, tuple[Metric, ...]] = {
    # Rule selection against the gold rules (macro: per input, then averaged;
    # micro: over all (input, rule) pairs pooled), and the executor's verdict.
    "nba": (
        Metric("precision_macro", "P macro"),
        Metric("recall_macro", "R macro"),
        Metric("f1_macro", "F1 macro"),
        Metric("precision_micro", "P micro"),
        Metric("recall_micro", "R micro"),
        Metric("f1_micro", "F1 micro"),
        Metric("strict_accuracy", "strict acc."),
    ),
    # Gold passages in the first 10 units, and among all units returned.
    "obliqa": (
        Metric("recall_at_10", "Recall@10"),
        Metric("map_at_10", "MAP@10"),
        Metric("recall_returned", "recall (all returned)"),
    ),
    # The executor's code: its problem's check passes; pylint's score out of 10.
    "humaneval": (Metric("pass_at_1", "pass@1"), Metric("pylint", "pylint")),
}
"""Per task, its quality metrics in column order. A metric that was not measured
(no executor, or rule selection by a chunk method) is absent from
`EvalResult.metrics`."""


@dataclass(frozen=True)
class EvalItem:
    """One input of a task, with its gold labels."""

    id: str
    text: str
    gold: frozenset[str]
    """Gold rule ids (NBA), gold passage ids (ObliQA); empty for HumanEval."""
    problem: Any
    """The dataset's own record, for grading the executor's answer."""
    task_input: str | None = None
    """What the executor is given, when more than `text` (e.g. the constants every
    NBA problem assumes); retrieval always sees `text`."""


@dataclass
class ItemOutcome:
    """What a method did with one input: its units, the grade of the answer."""

    item: EvalItem
    units: list[Document] = field(default_factory=list)
    answer: Any = None
    """The executor's parsed answer; None when there was no executor or it failed."""
    grade: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass(eq=False, repr=False)
class EvalTask(ABC):
    """A task: its inputs, what methods retrieve from, and how answers are scored."""

    name: ClassVar[TaskName]
    template: ClassVar[ExecutionTemplate | None]
    """The executor's template; None for a retrieval-only task."""

    items: Sequence[EvalItem]
    """The inputs."""
    _: KW_ONLY
    rulebook: Rulebook | None
    """The rules rule methods select from, or None."""
    documents: Sequence[Document]
    """The text chunk methods split and index."""
    profile: RuleSchemaProfile = CONDITION_PROFILE
    """What a TAG judge sees of each rule."""
    missing_rulebook: str = ""
    """Why there is no rulebook (shown for skipped methods)."""

    def __post_init__(self) -> None:
        """Keep the inputs and documents as lists of their own."""
        self.items, self.documents = list(self.items), list(self.documents)

    def limited(self, limit: int | None) -> Self:
        """This task on its first `limit` inputs only (all for None).

        Raises:
            ValueError: `limit` is below 1.
        """
        if limit is None:
            return self
        if limit < 1:
            msg = f"limit must be a positive number of inputs, got {limit}"
            raise ValueError(msg)
        subset = copy.copy(self)
        subset.items = self.items[:limit]
        return subset

    def gold_rules(self) -> dict[str, frozenset[str]] | None:
        """Input id -> the ids of its gold rules; None when there are none."""
        return {item.id: item.gold for item in self.items}

    def oracle_gold(self) -> dict[str, frozenset[str]] | None:
        """Input text (as judged) -> gold rule ids, for the oracle."""
        gold = self.gold_rules()
        if gold is None:
            return None
        return {item.text: gold[item.id] for item in self.items}

    async def grade(self, item: EvalItem, answer: Any) -> dict[str, float]:
        """Per-input quality of the executor's answer (1.0/0.0 or a score).

        Only called for tasks with a `template`; retrieval-only tasks keep this.
        """
        del item, answer
        return {}

    @abstractmethod
    def quality(
        self, outcomes: Sequence[ItemOutcome], *, units: UnitKind, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """The `METRICS` over all inputs, and notes on what was not measured.

        Args:
            outcomes: What the method did with each input.
            units: What the method hands the executor.
            executed: Whether an executor ran (and `grade` graded its answers).
        """


def _rule_ids(units: Sequence[Document]) -> list[str]:
    return [
        str(rule_id)
        for doc in units
        if (rule_id := doc.metadata.get("rule_id") or doc.id)
    ]


@dataclass(eq=False, repr=False)
class NBATask(EvalTask):
    """RuleArena-NBA: rule selection against `relevant_rules`, strict accuracy."""

    name = "nba"
    template = NBA_TEMPLATE

    async def grade(self, item: EvalItem, answer: Any) -> dict[str, float]:
        """Strict accuracy: answer, illegal operation and team all right."""
        problem: datasets.NBAProblem = item.problem
        verdict: NBAVerdict = answer
        right = verdict.answer == problem.answer and (
            not problem.answer
            or (
                verdict.illegal_operation == (problem.illegal_operation or None)
                and verdict.problematic_team == (problem.problematic_team or None)
            )
        )
        return {"strict_accuracy": float(right)}

    def quality(
        self, outcomes: Sequence[ItemOutcome], *, units: UnitKind, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Rule-selection P/R/F1 (rule methods) and strict accuracy (executed)."""
        found: dict[str, float | None] = {}
        notes = []
        if units == "rules":
            total = metrics.aggregate(
                [
                    metrics.selection_scores(set(_rule_ids(o.units)), set(o.item.gold))
                    for o in outcomes
                ]
            )
            found |= {
                "precision_macro": total.macro_precision,
                "recall_macro": total.macro_recall,
                "f1_macro": total.macro_f1,
                "precision_micro": total.micro.precision,
                "recall_micro": total.micro.recall,
                "f1_micro": total.micro.f1,
            }
        else:
            notes.append("rule selection: not defined for chunks")
        if executed:
            found["strict_accuracy"] = metrics.mean(
                o.grade.get("strict_accuracy", 0.0) for o in outcomes
            )
        else:
            notes.append("strict accuracy: needs an executor model")
        return found, notes


@dataclass(eq=False, repr=False)
class ObliQATask(EvalTask):
    """ObliQA: Recall@10 and MAP@10 of gold passages (retrieval only)."""

    name = "obliqa"
    template = None

    units_of_rule: InitVar[Callable[[Rule], Iterable[str]]]
    """Maps a rule to its passages' ids."""
    passages_of_rule: dict[str, list[str]] = field(init=False)

    def __post_init__(self, units_of_rule: Callable[[Rule], Iterable[str]]) -> None:
        """Map every rule to its passages."""
        super().__post_init__()
        # Mapped once: ranking the units of every input looks rules up again and
        # again (M1 returns every rule for every question).
        self.passages_of_rule = {
            rule.rule_id: sorted(units_of_rule(rule))
            for rule in (self.rulebook.rules if self.rulebook else ())
        }

    def gold_rules(self) -> dict[str, frozenset[str]] | None:
        """Question id -> the rules whose passages include a gold passage."""
        if self.rulebook is None:
            return None
        return {
            item.id: frozenset(
                rule_id
                for rule_id, units in self.passages_of_rule.items()
                if not item.gold.isdisjoint(units)
            )
            for item in self.items
        }

    def ranked_passages(self, units: Sequence[Document]) -> list[str]:
        """Passage ids in the order the method ranked its units (first wins)."""
        ranked: dict[str, None] = {}
        for doc in units:
            unit_id = doc.metadata.get("unit_id")
            if unit_id is not None:
                ranked[str(unit_id)] = None
                continue
            rule_id = doc.metadata.get("rule_id") or doc.id
            ranked.update(dict.fromkeys(self.passages_of_rule.get(str(rule_id), ())))
        return list(ranked)

    def quality(
        self, outcomes: Sequence[ItemOutcome], *, units: UnitKind, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Recall@10, MAP@10, and recall over everything returned."""
        rankings = [(self.ranked_passages(o.units), o.item.gold) for o in outcomes]
        return {
            "recall_at_10": metrics.mean(
                metrics.recall_at_k(ranked, gold, RANK_CUTOFF)
                for ranked, gold in rankings
            ),
            "map_at_10": metrics.mean(
                metrics.average_precision_at_k(ranked, gold, RANK_CUTOFF)
                for ranked, gold in rankings
            ),
            "recall_returned": metrics.mean(
                metrics.recall_at_k(ranked, gold, max(len(ranked), 1))
                for ranked, gold in rankings
            ),
        }, []


@dataclass(eq=False, repr=False)
class HumanEvalTask(EvalTask):
    """HumanEval + PEP 8: pass@1 (each `check` in a subprocess) and pylint score."""

    name = "humaneval"
    template = CODE_TEMPLATE

    timeout: float = field(default=10.0, kw_only=True)
    """Bounds each `check` run, in seconds."""

    def gold_rules(self) -> dict[str, frozenset[str]] | None:
        """HumanEval has no gold PEP 8 rule labels."""
        return None

    async def grade(self, item: EvalItem, answer: Any) -> dict[str, float]:
        """Pass/fail of the problem's `check`, and the code's pylint score.

        `answer` is the code the template's parser took from the executor's
        answer (the complete function).
        """
        checked = await arun_check(item.problem, answer, self.timeout)
        score = await apylint_score(answer)
        return {"pass_at_1": float(checked.passed), "pylint": score}

    def quality(
        self, outcomes: Sequence[ItemOutcome], *, units: UnitKind, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Mean pass@1 and pylint score when executed."""
        if not executed:
            return {}, ["pass@1 and pylint: need an executor model"]
        return {
            "pass_at_1": metrics.mean(o.grade.get("pass_at_1", 0.0) for o in outcomes),
            "pylint": metrics.mean(
                o.grade["pylint"] for o in outcomes if "pylint" in o.grade
            ),
        }, []


# --- The tasks on the shared data -----------------------------------------------------


def nba_task(dataset: datasets.NBADataset) -> NBATask:
    """RuleArena-NBA over its 55 catalogued rules and the CBA text.

    Retrieval sees a problem's situations and operations; the executor also gets
    the constants every problem assumes (cap, tax, aprons), as RuleArena's prompt
    gives them.
    """
    assumptions = "Assumptions:\n" + dataset.assumptions_text()
    return NBATask(
        [
            EvalItem(
                p.id,
                p.text,
                frozenset(p.gold_rule_ids),
                p,
                task_input=f"{p.text}\n\n{assumptions}",
            )
            for p in dataset.problems
        ],
        rulebook=dataset.catalogue,
        documents=[Document(dataset.cba_text, metadata={"source": "reference_rules"})],
    )


def obliqa_task(dataset: datasets.ObliQADataset) -> ObliQATask:
    """ObliQA over its passages as rules (mapped back to passages by source)."""
    return ObliQATask(
        [
            EvalItem(q.id, q.text, frozenset(q.gold_unit_ids), q)
            for q in dataset.questions
        ],
        rulebook=dataset.passage_rulebook(),
        documents=dataset.passages,
        units_of_rule=dataset.units_of_rule,
    )


def humaneval_task(
    problems: Sequence[Any],
    pep8_text: str,
    rulebook: Rulebook | None = None,
    *,
    timeout: float = 10.0,
) -> HumanEvalTask:
    """HumanEval + PEP 8; rule methods need a PEP 8 rulebook (`tag extract`)."""
    return HumanEvalTask(
        [EvalItem(p.task_id, p.prompt, frozenset(), p) for p in problems],
        rulebook=rulebook,
        documents=[Document(pep8_text, metadata={"source": "pep-0008.rst"})],
        missing_rulebook=(
            "no PEP 8 rulebook: extract one with `tag extract pep-0008.rst --domain "
            "'PEP 8' -o pep8.rulebook.json` and pass --pep8-rulebook"
        ),
        timeout=timeout,
    )


def load_task(
    name: TaskName,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    pep8_rulebook: Rulebook | str | os.PathLike[str] | None = None,
    timeout: float = 10.0,
) -> EvalTask:
    """A task on its development data from the shared data directory.

    Args:
        name: `nba`, `obliqa` or `humaneval`.
        data_dir: The shared data directory (default: `shared_data_dir()`).
        pep8_rulebook: HumanEval: a PEP 8 rulebook (object or file) for the rule
            methods; without one they are skipped.
        timeout: HumanEval: seconds each problem's `check` may run.

    Raises:
        DataNotFoundError: The data directory or a file of the task is missing.
    """
    if name == "nba":
        return nba_task(datasets.load_nba(data_dir))
    if name == "obliqa":
        return obliqa_task(datasets.load_obliqa(data_dir))
    if pep8_rulebook is not None and not isinstance(pep8_rulebook, Rulebook):
        pep8_rulebook = Rulebook.load(pep8_rulebook)
    return humaneval_task(
        datasets.load_humaneval(data_dir),
        datasets.pep8_path(data_dir).read_text(encoding="utf-8"),
        pep8_rulebook,
        timeout=timeout,
    )
