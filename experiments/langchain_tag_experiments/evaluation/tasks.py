"""The evaluation tasks: their inputs, what methods retrieve from, how answers score.

- RuleArena-NBA (`nba`): rule selection against the gold `relevant_rules`, and
  strict accuracy of the executor's verdict.
- ObliQA (`obliqa`): Recall@10 and MAP@10 of the gold passages (retrieval only).
- HumanEval + PEP 8 (`humaneval`): pass@1 of the executor's code, and its pylint
  score.
- NPOV rewriting on the Wiki Neutrality Corpus sample (`npov`): exact match with
  the neutral sentence, BLEU, edit recall/precision (LLM-free), and with a judge
  model the VFR judge's verdict and four 1-5 scores.
- A user's own labelled set (`custom`): rule selection against the labels, and
  the executor's answer against an optional reference.

Every quality mean is over the inputs whose retrieval and execution succeeded: a
failed input (a judgment that failed after its retries, say) is flagged and
counted in `EvalResult.failures`, never scored as a wrong answer.

`METRICS` names each task's quality metrics (`EvalResult.metrics`, report columns).
"""

from __future__ import annotations

import copy
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from typing_extensions import Self

from langchain_tag.execution import (
    CODE_TEMPLATE,
    GENERIC_TEMPLATE,
    NBA_TEMPLATE,
    NPOV_TEMPLATE,
    ExecutionTemplate,
    NBAVerdict,
    NPOVResult,
)
from langchain_tag.matching import (
    CONDITION_PROFILE,
    NBA_PROFILE,
    RuleSchemaProfile,
    constraint_profile,
    profile_for,
)
from langchain_tag.resources import curated_rulebook, document_name, resource_text
from langchain_tag.rules import Rule, Rulebook
from langchain_tag_experiments.evaluation import datasets, metrics, npov
from langchain_tag_experiments.evaluation.humaneval import (
    UNPARSEABLE_SCORE,
    apylint_score,
    arun_check,
)

logger = logging.getLogger(__name__)

__all__ = [
    "GENERIC_CONSTRAINT_PROFILE",
    "METRICS",
    "NBA_LEVELS",
    "TASKS",
    "CustomTask",
    "EvalItem",
    "EvalTask",
    "FailedInputs",
    "HumanEvalTask",
    "ItemOutcome",
    "Metric",
    "NBATask",
    "NPOVTask",
    "ObliQATask",
    "TaskName",
    "UnitKind",
    "catalogue_id",
    "custom_task",
    "humaneval_task",
    "load_task",
    "nba_task",
    "npov_task",
    "obliqa_task",
]

TaskName = Literal["nba", "obliqa", "humaneval", "npov", "custom"]
TASKS: tuple[TaskName, ...] = ("nba", "obliqa", "humaneval", "npov")
"""The tasks on the shared data (`tag eval all`); `custom` reads a user's files."""

NBA_LEVELS = (0, 1, 2)
"""RuleArena's difficulty levels, each with its strict-accuracy column."""

UnitKind = Literal["rules", "chunks", "passages"]
"""What a method hands the executor: rules' actions, text chunks, or whole passages
(ObliQA's passage rulebook)."""

FailedInputs = Literal["excluded", "wrong"]
"""What quality metrics make of an input that failed (see `EvalTask.failed_inputs`)."""

GENERIC_CONSTRAINT_PROFILE = constraint_profile()
"""The judge of constraint-schema rules outside NBA (no domain criteria)."""

VFR_FAILED = "vfr_failed"
"""The grade key flagging an NPOV input whose VFR judgment failed."""

RANK_CUTOFF = 10
"""k of the ranked-retrieval metrics (ObliQA Recall@10 and MAP@10)."""


class Metric(NamedTuple):
    """A quality metric: its key in `EvalResult.metrics` and its column heading."""

    key: str
    heading: str


_SELECTION = (
    # Rule selection against the gold rules (macro: per input, then averaged;
    # micro: over all (input, rule) pairs pooled).
    Metric("precision_macro", "P macro"),
    Metric("recall_macro", "R macro"),
    Metric("f1_macro", "F1 macro"),
    Metric("precision_micro", "P micro"),
    Metric("recall_micro", "R micro"),
    Metric("f1_micro", "F1 micro"),
)

METRICS: Mapping[TaskName, tuple[Metric, ...]] = {
    # Rule selection, and the executor's verdict overall and per level.
    "nba": (
        *_SELECTION,
        Metric("strict_accuracy", "strict acc."),
        *(Metric(f"strict_l{level}", f"strict L{level}") for level in NBA_LEVELS),
    ),
    # Gold passages in the first 10 units, and among all units returned.
    "obliqa": (
        Metric("recall_at_10", "Recall@10"),
        Metric("map_at_10", "MAP@10"),
        Metric("recall_returned", "recall (all returned)"),
    ),
    # The executor's code: its problem's check passes; pylint's score out of 10.
    "humaneval": (Metric("pass_at_1", "pass@1"), Metric("pylint", "pylint")),
    # The rewrite against WNC's neutral sentence (LLM-free), then the VFR judge.
    "npov": (
        Metric("exact_match", "exact match"),
        Metric("bleu", "BLEU"),
        Metric("edit_recall", "edit R"),
        Metric("edit_precision", "edit P"),
        Metric("pass_through", "passed through"),
        Metric("vfr", "VFR"),
        Metric("rem", "Rem"),
        Metric("pres", "Pres"),
        Metric("tone", "Tone"),
        Metric("flu", "Flu"),
        Metric("avg", "Avg"),
    ),
    # Rule selection against the user's labels; the answer against a reference.
    "custom": (
        *_SELECTION,
        Metric("reference_exact", "ref. exact"),
        Metric("reference_bleu", "ref. BLEU"),
    ),
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
    """Why the input failed (retrieval, a provider error, grading): left out."""
    malformed: str | None = None
    """Why the executor's answer could not be parsed: a wrong answer, scored as one
    (the method's output, unlike a provider's error)."""


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
    grading_model: BaseChatModel | None = None
    """An LLM grader's model (NPOV's VFR judge); None grades without one."""
    failed_inputs: FailedInputs = "excluded"
    """A failed input (a provider's error, not the method's answer): `excluded`
    from the quality means and counted (the method), or scored as `wrong`."""

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

    def with_rulebook(self, rulebook: Rulebook) -> Self:
        """This task over another rulebook, judged with the profile its rules need.

        Rules carrying the constraint-schema fields (`applies_when`, `constraint`,
        ...) are judged with the generic constraint profile (NBA: its matcher's);
        a rulebook extracted in a user-defined rule schema with that schema's
        profile; others with the condition profile.
        """
        changed = copy.copy(self)
        changed.rulebook = rulebook
        own_schema = (
            rulebook.rule_schema is not None and rulebook.rule_schema.built_in() is None
        )
        if not own_schema and any(map(_has_constraints, rulebook.rules)):
            changed.profile = self.constraint_profile
        else:
            changed.profile = profile_for(rulebook)
        return changed

    @property
    def constraint_profile(self) -> RuleSchemaProfile:
        """The profile of rules written in the constraint schema."""
        return GENERIC_CONSTRAINT_PROFILE

    def scored(self, outcomes: Sequence[ItemOutcome]) -> list[ItemOutcome]:
        """The outcomes quality is measured on (see `failed_inputs`).

        By default those of inputs that did not fail: a failed input (its
        retrieval, execution or grading raised, e.g. a judgment failed after its
        retries) is flagged and counted by the runner, since scoring it as a wrong
        answer would blame the method for the provider's error. A malformed answer
        is always kept: it is the method's own output, and scores as wrong.
        """
        if self.failed_inputs == "wrong":
            return list(outcomes)
        return [o for o in outcomes if o.error is None]

    def gold_rules(self) -> dict[str, frozenset[str]] | None:
        """Input id -> the ids of its gold rules; None when there are none."""
        return {item.id: item.gold for item in self.items}

    def oracle_gold(self) -> dict[str, frozenset[str]] | None:
        """Input text (as judged) -> gold rule ids, for the oracle."""
        gold = self.gold_rules()
        if gold is None:
            return None
        return {item.text: gold[item.id] for item in self.items}

    async def grade(
        self, item: EvalItem, answer: Any, config: RunnableConfig | None = None
    ) -> dict[str, float]:
        """Per-input quality of the executor's answer (1.0/0.0 or a score).

        Only called for tasks with a `template`; retrieval-only tasks keep this.
        `config` carries the callbacks an LLM grader's calls report to.
        """
        del item, answer, config
        return {}

    def grading_prompts(self, item: EvalItem) -> list[list[BaseMessage]]:
        """The messages of each LLM grading call `item` may need (cost estimates).

        At most these calls are made (a grader may skip an answer, as NPOV's skips
        a copied sentence). Empty for tasks graded without a model, or without
        `grading_model`.
        """
        del item
        return []

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


def _selection(
    chosen: Sequence[set[str]], gold: Sequence[set[str]]
) -> dict[str, float | None]:
    """Rule-selection P/R/F1 of what each input chose against its gold (in order).

    Empty when there is no input to score (every one failed).
    """
    if not chosen:
        return {}
    total = metrics.aggregate(
        [metrics.selection_scores(c, g) for c, g in zip(chosen, gold, strict=True)]
    )
    return {
        "precision_macro": total.macro_precision,
        "recall_macro": total.macro_recall,
        "f1_macro": total.macro_f1,
        "precision_micro": total.micro.precision,
        "recall_micro": total.micro.recall,
        "f1_micro": total.micro.f1,
    }


@dataclass(eq=False, repr=False)
class NBATask(EvalTask):
    """RuleArena-NBA: rule selection against `relevant_rules`, strict accuracy.

    With the catalogue as the rulebook every rule is a gold label. An extracted
    rulebook (`nba_task(..., rulebook=)`, the method's setup) is scored on rule
    selection only through the rules that map onto the catalogue (`catalogue_ids`);
    strict accuracy needs no mapping.
    """

    name = "nba"
    template = NBA_TEMPLATE

    catalogue_labels: frozenset[str] = field(default=frozenset(), kw_only=True)
    """RuleArena's catalogue ids (the gold labels)."""
    catalogue_of_rule: dict[str, str] = field(init=False)
    """Rule id -> the catalogue id it maps onto (every rule of the catalogue)."""

    def __post_init__(self) -> None:
        """Map the rules onto the catalogue."""
        super().__post_init__()
        self._map_rules()

    def with_rulebook(self, rulebook: Rulebook) -> Self:
        """This task over another rulebook, its rules mapped onto the catalogue."""
        changed = super().with_rulebook(rulebook)
        changed._map_rules()  # noqa: SLF001 - the copy's own mapping
        return changed

    @property
    def constraint_profile(self) -> RuleSchemaProfile:
        """The paper's NBA matcher."""
        return NBA_PROFILE

    def _map_rules(self) -> None:
        rules = self.rulebook.rules if self.rulebook else ()
        self.catalogue_of_rule = {
            rule.rule_id: label
            for rule in rules
            if (label := catalogue_id(rule, self.catalogue_labels)) is not None
        }

    def _label_selection(
        self, outcomes: Sequence[ItemOutcome], notes: list[str]
    ) -> dict[str, float | None]:
        """Selection P/R/F1 by catalogue label, through the rules that map.

        Several rules may map onto one label (one hit), a chosen rule that maps
        nowhere is not counted, and the gold is what the mapped rules can cover.
        """
        covered = set(self.catalogue_of_rule.values())
        scored = [o for o in outcomes if o.item.gold & covered]
        rulebook_size = len(self.rulebook.rules) if self.rulebook else 0
        if len(self.catalogue_of_rule) < rulebook_size:
            notes.append(
                f"rule selection: by catalogue label, through the "
                f"{len(self.catalogue_of_rule)} of {rulebook_size} rules that map "
                f"onto RuleArena's catalogue ({len(covered)} of its "
                f"{len(self.catalogue_labels)} labels)"
            )
        if len(scored) < len(outcomes):
            notes.append(
                f"rule selection: {len(outcomes) - len(scored)} inputs left out, "
                "no mapped rule covering their gold labels"
            )
        return _selection(
            [
                {
                    self.catalogue_of_rule[rule_id]
                    for rule_id in _rule_ids(o.units)
                    if rule_id in self.catalogue_of_rule
                }
                for o in scored
            ],
            [set(o.item.gold & covered) for o in scored],
        )

    def gold_rules(self) -> dict[str, frozenset[str]] | None:
        """Input id -> the rules of the rulebook whose catalogue id is gold.

        None when no rule of the rulebook maps onto the catalogue.
        """
        if not self.catalogue_of_rule:
            return None
        return {
            item.id: frozenset(
                rule_id
                for rule_id, label in self.catalogue_of_rule.items()
                if label in item.gold
            )
            for item in self.items
        }

    async def grade(
        self, item: EvalItem, answer: Any, config: RunnableConfig | None = None
    ) -> dict[str, float]:
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
        """Rule-selection P/R/F1 (rule methods), strict accuracy per level."""
        found: dict[str, float | None] = {}
        notes: list[str] = []
        outcomes = self.scored(outcomes)
        if units != "rules":
            notes.append("rule selection: not defined for chunks")
        elif not self.catalogue_of_rule:
            notes.append(
                "rule selection: no rule of the rulebook maps onto RuleArena's "
                "catalogue (a rule maps by its rule_id, a tag, or "
                "metadata['catalogue_id'] naming a catalogue id)"
            )
        else:
            found |= self._label_selection(outcomes, notes)
        if executed:
            found["strict_accuracy"] = metrics.mean(
                o.grade.get("strict_accuracy", 0.0) for o in outcomes
            )
            for level in NBA_LEVELS:
                at_level = [o for o in outcomes if o.item.problem.level == level]
                if at_level:
                    found[f"strict_l{level}"] = metrics.mean(
                        o.grade.get("strict_accuracy", 0.0) for o in at_level
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

    def with_rulebook(self, rulebook: Rulebook) -> Self:
        """Refused: ObliQA's rules are its passages, mapped back when built.

        Raises:
            ValueError: Always.
        """
        del rulebook
        msg = "The obliqa task's rules are its passages: it takes no other rulebook."
        raise ValueError(msg)

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
        rankings = [
            (self.ranked_passages(o.units), o.item.gold) for o in self.scored(outcomes)
        ]
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
    unparseable_score: float = field(default=UNPARSEABLE_SCORE, kw_only=True)
    """The pylint score of code pylint cannot parse, or an answer with no code: 0
    (the method), counted in the mean."""

    def gold_rules(self) -> dict[str, frozenset[str]] | None:
        """HumanEval has no gold PEP 8 rule labels."""
        return None

    async def grade(
        self, item: EvalItem, answer: Any, config: RunnableConfig | None = None
    ) -> dict[str, float]:
        """Pass/fail of the problem's `check`, and the code's pylint score.

        `answer` is the code the template's parser took from the executor's
        answer (the complete function).
        """
        checked = await arun_check(item.problem, answer, self.timeout)
        score = await apylint_score(answer, unparseable_score=self.unparseable_score)
        return {"pass_at_1": float(checked.passed), "pylint": score}

    def quality(
        self, outcomes: Sequence[ItemOutcome], *, units: UnitKind, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Mean pass@1 and pylint score when executed."""
        if not executed:
            return {}, ["pass@1 and pylint: need an executor model"]
        outcomes = self.scored(outcomes)
        return {
            "pass_at_1": metrics.mean(o.grade.get("pass_at_1", 0.0) for o in outcomes),
            # An unparseable answer scores 0, as pylint scores a syntax error.
            "pylint": metrics.mean(
                o.grade.get("pylint", self.unparseable_score) for o in outcomes
            ),
        }, []


@dataclass(eq=False, repr=False)
class NPOVTask(EvalTask):
    """NPOV rewriting on WNC pairs: the rewrite against the neutral sentence.

    Retrieval and the executor see the biased sentence. LLM-free metrics are
    always computed: exact match with the neutral sentence (WNC's accuracy), BLEU,
    edit recall/precision and the pass-through share. With `grading_model`, the VFR
    judge grades each rewrite against the violation description derived from the
    pair (`npov.violation_description`). Without an executor the input is scored
    as its own rewrite: the identity baseline, the same for every method.
    """

    name = "npov"
    template = NPOV_TEMPLATE

    _vfr_judge: npov.VFRJudge | None = field(default=None, init=False, repr=False)

    def gold_rules(self) -> dict[str, frozenset[str]] | None:
        """WNC pairs carry no rule labels."""
        return None

    def vfr_judge(self, llm: BaseChatModel) -> npov.VFRJudge:
        """The VFR judge on `llm`, built once per model (not once per rewrite)."""
        judge = self._vfr_judge
        if judge is None or judge.llm is not llm:
            judge = self._vfr_judge = npov.VFRJudge(llm=llm)
        return judge

    async def grade(
        self, item: EvalItem, answer: Any, config: RunnableConfig | None = None
    ) -> dict[str, float]:
        """The LLM-free scores of the rewrite, then the VFR judge's (if a model)."""
        pair: datasets.WNCPair = item.problem
        result: NPOVResult = answer
        found = _npov_scores(pair, result.rewrite)
        if self.grading_model is None:
            return found
        try:
            judged = await self.vfr_judge(self.grading_model).ajudge(
                pair.biased,
                npov.violation_description(pair.biased, pair.neutral),
                result.rewrite,
                config=config,
            )
        except npov.VFRJudgmentError as error:
            # Flagged and left out of the VFR means; the LLM-free scores stand.
            logger.warning("npov %s: the VFR judgment failed: %s", item.id, error)
            return found | {VFR_FAILED: 1.0}
        return found | judged.scores()

    def grading_prompts(self, item: EvalItem) -> list[list[BaseMessage]]:
        """The VFR judge's messages, the input standing in for the rewrite."""
        if self.grading_model is None:
            return []
        pair: datasets.WNCPair = item.problem
        return [
            npov.vfr_messages(
                pair.biased,
                npov.violation_description(pair.biased, pair.neutral),
                pair.biased,
            )
        ]

    def quality(
        self, outcomes: Sequence[ItemOutcome], *, units: UnitKind, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Means of the per-input scores, corpus BLEU, the VFR judge's means."""
        notes = []
        outcomes = self.scored(outcomes)
        pairs: list[datasets.WNCPair] = [o.item.problem for o in outcomes]
        if executed:
            # A malformed answer changed nothing: scored as the input unchanged.
            rewrites = [
                o.item.problem.biased if o.answer is None else o.answer.rewrite
                for o in outcomes
            ]
            grades = [
                o.grade if o.answer is not None else _unfixed(o.item.problem)
                for o in outcomes
            ]
        else:
            notes.append(
                "no executor: each input is scored as its own rewrite (the identity "
                "baseline, the same for every method)"
            )
            rewrites = [pair.biased for pair in pairs]
            grades = [_npov_scores(pair, pair.biased) for pair in pairs]
        found: dict[str, float | None] = {
            "bleu": npov.corpus_bleu(rewrites, [pair.neutral for pair in pairs])
            if pairs
            else None
        }
        for key in ("exact_match", "edit_recall", "edit_precision", "pass_through"):
            found[key] = metrics.mean(g.get(key) for g in grades)
        if executed and self.grading_model is not None:
            for key in npov.VFR_KEYS:
                found[key] = metrics.mean(g.get(key) for g in grades)
            if failed := sum(VFR_FAILED in g for g in grades):
                notes.append(
                    f"VFR: {failed} judgments failed (see the log), left out of the "
                    "VFR means"
                )
        elif executed:
            notes.append("VFR and the 1-5 scores: need a judge model")
        return found, notes


def _unfixed(pair: datasets.WNCPair) -> dict[str, float]:
    """A malformed answer's scores: the input unchanged, and VFR false."""
    return _npov_scores(pair, pair.biased) | {"vfr": 0.0}


def _npov_scores(pair: datasets.WNCPair, rewrite: str) -> dict[str, float]:
    """The LLM-free per-input scores (an undefined edit share is left out)."""
    edits = npov.edit_scores(pair.biased, pair.neutral, rewrite)
    found = {
        "exact_match": float(npov.exact_match(rewrite, pair.neutral)),
        "pass_through": float(npov.passes_through(pair.biased, rewrite)),
    }
    if edits.recall is not None:
        found["edit_recall"] = edits.recall
    if edits.precision is not None:
        found["edit_precision"] = edits.precision
    return found


@dataclass(eq=False, repr=False)
class CustomTask(EvalTask):
    """A user's labelled set: rule selection against the labels.

    With an executor, inputs that carry a `reference` are also scored: exact match
    (whitespace-normalised) and corpus BLEU (sacrebleu's 13a tokenizer) of the
    answer against it.
    """

    name = "custom"
    template = GENERIC_TEMPLATE

    async def grade(
        self, item: EvalItem, answer: Any, config: RunnableConfig | None = None
    ) -> dict[str, float]:
        """Exact match with the reference, when the input has one."""
        labelled: datasets.LabelledInput = item.problem
        if labelled.reference is None:
            return {}
        return {"reference_exact": float(_same_text(str(answer), labelled.reference))}

    def quality(
        self, outcomes: Sequence[ItemOutcome], *, units: UnitKind, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Rule-selection P/R/F1; the answers against the references (executed)."""
        outcomes = self.scored(outcomes)
        found = _selection(
            [set(_rule_ids(o.units)) for o in outcomes],
            [set(o.item.gold) for o in outcomes],
        )
        notes = []
        referenced = [o for o in outcomes if o.item.problem.reference is not None]
        if not referenced:
            notes.append("answers: no input has a reference")
        elif executed:
            found["reference_exact"] = metrics.mean(
                o.grade.get("reference_exact", 0.0) for o in referenced
            )
            found["reference_bleu"] = npov.corpus_bleu(
                ["" if o.answer is None else str(o.answer) for o in referenced],
                [str(o.item.problem.reference) for o in referenced],
                wnc=False,
            )
        else:
            notes.append("answers against the references: need an executor model")
        return found, notes


def _same_text(answer: str, reference: str) -> bool:
    return " ".join(answer.split()) == " ".join(reference.split())


# --- The tasks on the shared data -----------------------------------------------------


def nba_task(dataset: datasets.NBADataset, rulebook: Rulebook | None = None) -> NBATask:
    """RuleArena-NBA over a rulebook (default its 55 catalogued rules) and the CBA.

    Retrieval sees a problem's situations and operations; the executor also gets
    the constants every problem assumes (cap, tax, aprons), as RuleArena's prompt
    gives them. An extracted `rulebook` (the method's setup) is judged with
    `NBA_PROFILE` when its rules carry the constraint-schema fields
    (`applies_when`, `constraint`, ...), else with the condition profile.
    """
    assumptions = "Assumptions:\n" + dataset.assumptions_text()
    task = NBATask(
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
        catalogue_labels=frozenset(rule.rule_id for rule in dataset.catalogue.rules),
    )
    return task if rulebook is None else task.with_rulebook(rulebook)


def catalogue_id(rule: Rule, labels: Container[str]) -> str | None:
    """The RuleArena catalogue id a rule maps onto, or None.

    A rule maps by `metadata["catalogue_id"]`, else its `rule_id`, else its first
    tag that is a catalogue id.
    """
    named = rule.metadata.get("catalogue_id")
    candidates = [named] if named else [rule.rule_id, *rule.tags]
    return next((c for c in candidates if c in labels), None)


def _has_constraints(rule: Rule) -> bool:
    return any(
        (
            rule.applies_when,
            rule.constraint,
            rule.violation_check,
            rule.does_not_apply_to,
        )
    )


def npov_task(
    pairs: Sequence[datasets.WNCPair], rulebook: Rulebook | None = None
) -> NPOVTask:
    """NPOV rewriting on WNC pairs over the shipped NPOV policy.

    `rulebook` defaults to the curated one written from that policy (labelled
    curated); pass an extracted rulebook (`tag extract`) for the method's setup,
    judged with the profile its rules need (`with_rulebook`).
    """
    task = NPOVTask(
        [EvalItem(pair.id, pair.biased, frozenset(), pair) for pair in pairs],
        rulebook=curated_rulebook("npov"),
        documents=[
            Document(
                resource_text(document_name("npov")),
                metadata={"source": document_name("npov")},
            )
        ],
    )
    return task if rulebook is None else task.with_rulebook(rulebook)


def custom_task(
    rulebook: Rulebook, inputs: Sequence[datasets.LabelledInput]
) -> CustomTask:
    """A user's labelled inputs over their rulebook.

    Raises:
        ValueError: An input names a rule id that is not in the rulebook.
    """
    known = {rule.rule_id for rule in rulebook.rules}
    for labelled in inputs:
        if unknown := sorted(set(labelled.applicable) - known):
            msg = (
                f"input {labelled.id!r} labels {', '.join(map(repr, unknown))} "
                "applicable, which the rulebook does not have: correct the label or "
                "pass the rulebook the labels were written for."
            )
            raise ValueError(msg)
    task = CustomTask(
        [
            EvalItem(
                labelled.id, labelled.input, frozenset(labelled.applicable), labelled
            )
            for labelled in inputs
        ],
        rulebook=rulebook,
        documents=[],
    )
    return task.with_rulebook(rulebook)


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
    """HumanEval + PEP 8 over a PEP 8 rulebook (default the curated one shipped).

    Another `rulebook` is judged with the profile its rules need (`with_rulebook`).
    """
    task = HumanEvalTask(
        [EvalItem(p.task_id, p.prompt, frozenset(), p) for p in problems],
        rulebook=curated_rulebook("pep8"),
        documents=[Document(pep8_text, metadata={"source": "pep-0008.rst"})],
        timeout=timeout,
    )
    return task if rulebook is None else task.with_rulebook(rulebook)


def load_task(
    name: TaskName,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    rulebook: Rulebook | str | os.PathLike[str] | None = None,
    inputs: str | os.PathLike[str] | None = None,
    timeout: float = 10.0,
) -> EvalTask:
    """A task on its development data from the shared data directory.

    Args:
        name: `nba`, `obliqa`, `humaneval`, `npov` or `custom`.
        data_dir: The shared data directory (default: `shared_data_dir()`).
        rulebook: The rulebook (object or file) rule methods select from: NBA an
            extracted one instead of the catalogue; HumanEval and NPOV instead of
            the curated one shipped; `custom` the user's (required).
        inputs: `custom`: the labelled inputs (JSON lines, see
            `datasets.load_labelled`).
        timeout: HumanEval: seconds each problem's `check` may run.

    Raises:
        DataNotFoundError: The data directory or a file of the task is missing.
        RulebookError: The rulebook file cannot be read.
        ValueError: `custom` without `rulebook` and `inputs`; `inputs` for another
            task; a `rulebook` for obliqa (its rules are its passages).
    """
    if inputs is not None and name != "custom":
        msg = f"inputs= is for the custom task, not {name}."
        raise ValueError(msg)
    if rulebook is not None and not isinstance(rulebook, Rulebook):
        rulebook = Rulebook.load(rulebook)
    if name == "custom":
        if rulebook is None or inputs is None:
            msg = "The custom task needs a rulebook and a file of labelled inputs."
            raise ValueError(msg)
        return custom_task(rulebook, datasets.load_labelled(inputs))
    if name == "nba":
        return nba_task(datasets.load_nba(data_dir), rulebook)
    if name == "obliqa":
        task = obliqa_task(datasets.load_obliqa(data_dir))
        return task if rulebook is None else task.with_rulebook(rulebook)
    if name == "npov":
        return npov_task(datasets.load_wnc(data_dir), rulebook)
    return humaneval_task(
        datasets.load_humaneval(data_dir),
        datasets.pep8_path(data_dir).read_text(encoding="utf-8"),
        rulebook,
        timeout=timeout,
    )
