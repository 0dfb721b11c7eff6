"""The methods compared: each way of choosing what the executor is given, as data.

A method picks the units (rules, chunks or passages) the executor is given for an
input, so every method is built as a LangChain `BaseRetriever`, from no retrieval
to TAG and the oracle (TAG through the real `TAGRetriever`, judged by a chat model
that reads the gold labels: an upper bound, never a result). `tag-decision` judges
with a decision model (`DecisionJudge`: every candidate rule of an input one
question, in one request), and `oracle-decision` with the oracle as one, so its
requests and tokens show what that costs. `tag+learned` and
`oracle+learned` put a `LearnedPrefilter` in front of the judge, k-fold over the
inputs: each input's prefilter was trained on the other folds' verdicts only.

`standard_methods(task)` is the registry: one `Method` row each, naming its builder,
a plain function of the `MethodContext` with its parameters bound by
`functools.partial`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.decisions import BaseDecisionModel
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig

from langchain_tag.engine import rule_document
from langchain_tag.matching import (
    ApplicabilityJudge,
    BaseJudge,
    CascadeJudge,
    DecisionJudge,
    prefilters,
)
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rulebook
from langchain_tag_experiments import baselines
from langchain_tag_experiments.evaluation.learned import KFOLDS, fit_kfold
from langchain_tag_experiments.evaluation.oracle import (
    oracle_decision_judge,
    oracle_judge,
)
from langchain_tag_experiments.evaluation.tasks import EvalTask, TaskName, UnitKind

__all__ = [
    "CHUNK_KS",
    "LEARNED_NOTES",
    "ORACLE_DECISION_NOTE",
    "PREFILTER_KINDS",
    "PREFILTER_NS",
    "PREFILTER_SHARES",
    "RULES_PER_CALL",
    "RULE_SIMILARITY_FALLBACK_K",
    "SUITES",
    "Family",
    "Method",
    "MethodContext",
    "Requirement",
    "Scorer",
    "ShortlistedRules",
    "methods_for",
    "prefilter_sizes",
    "select_methods",
    "standard_methods",
]

RULES_PER_CALL = (5, 10)
"""The `tag-bB` methods: TAG judging B rules per call (the method judges one)."""

Family = Literal[
    "none",
    "all",
    "similarity",
    "prefilter",
    "tag",
    "cascade",
    "oracle",
    "reranker",
    "applicability",
    "llm-filter",
]
"""What kind of selection a method makes (the plot colours points by family)."""

Requirement = Literal[
    "judge", "cheap_judge", "decision", "rulebook", "gold", "documents", "folds"
]
"""What a method needs: a judge model, a cheap judge model with logprobs (the
cascade), a decision model, a rulebook for the task, gold labels (the oracle),
documents to chunk (a custom task has only its rulebook), or two inputs or more
(a prefilter trained k-fold over them)."""

JudgeKind = Literal["model", "cascade", "decision", "oracle", "oracle-decision"]
"""TAG's judge: the judge model, the cascade in front of it, the decision model,
or the oracle (as a chat model, or as a decision model)."""

Shortlist = tuple[prefilters.Method, int]

Scorer = Literal[prefilters.Method, "learned"]
"""What ranks rules in the mismatch diagnostic: a similarity scorer, or the learned
prefilter's held-out margins (`learned`)."""
"""A prefilter: its similarity scorer and how many rules it keeps."""

CHUNK_KS = (5, 10, 15, 20)
"""M2's top-k, as in the paper."""

PREFILTER_KINDS: tuple[prefilters.Method, ...] = ("dense", "bm25", "hybrid")

PREFILTER_NS: Mapping[TaskName, tuple[int, ...]] = {
    # NBA has 55 catalogued rules; ObliQA hundreds of passage rules; PEP 8 and the
    # NPOV policy 50-120.
    "nba": (5, 10, 20),
    "obliqa": (10, 25, 50),
    "humaneval": (10, 20, 40),
    "npov": (10, 20, 40),
}
"""The prefilter sizes per task; a custom rulebook's are `PREFILTER_SHARES` of it."""

PREFILTER_SHARES = (0.1, 0.25, 0.5)
"""A custom rulebook's prefilter sizes, as shares of its rules."""

RULE_SIMILARITY_FALLBACK_K = 10
"""rules+similarity's k when TAG did not run before it (the method sets k to TAG's
mean picks on the same run)."""

SUITES: Mapping[str, tuple[str, ...]] = {
    # The paper's 2x2: units (chunks | rules) x selection (similarity |
    # applicability); chunks by similarity is M2 at k=10.
    "2x2": ("m2-chunks-k10", "chunks+applicability", "tag", "rules-sim"),
}
"""Named method selections (`tag eval --suite`); `phases` is run by
`evaluation.suites`, as it extracts a rulebook per ablation."""


_MISSING: Mapping[Requirement, str] = {
    "rulebook": "the task has no rulebook",
    "documents": "the task has no documents to split into chunks",
    "gold": "the task has no gold rule labels",
    "judge": "needs a judge model: pass --judge-model NAME (or judge_model=) and "
    "configure OPENAI_API_KEY or OPENAI_BASE_URL; not run offline",
    "cheap_judge": "needs a cheap judge model with logprobs as its first stage: "
    "pass --cheap-judge-model NAME (or cheap_judge_model=)",
    "decision": "needs a decision model: pass --decision-model NAME (or "
    "decision_model=) and configure OPENAI_API_KEY or OPENAI_BASE_URL; not run "
    "offline",
    "folds": "needs at least 2 inputs: its prefilter is trained k-fold over them "
    "(raise --limit, or limit=)",
}
"""Why a method lacking each requirement cannot run, checked in this order."""


@dataclass(frozen=True)
class MethodContext:
    """What a method's builder builds its retriever from, for one task."""

    task: EvalTask
    embeddings: Embeddings
    judge_model: BaseChatModel | None = None
    cheap_judge_model: BaseChatModel | None = None
    """The cascade's first-stage judge (needs logprobs)."""
    decision_model: BaseDecisionModel | None = None
    """Judges `tag-decision`: every candidate rule of an input in one request."""
    max_concurrency: int = 8
    """In-flight LLM calls at most, per method."""
    rules_sim_k: int | None = None
    """rules+similarity's k; None: TAG's mean picks on this run (the method)."""
    tag_picks: tuple[float | None, int, int] | None = None
    """Once TAG ran: the rules it gave the executor per input (None if every
    input failed), over how many inputs, of how many."""

    def unavailable(self, method: Method) -> str | None:
        """Why `method` cannot run here, or None."""
        return next(
            (
                why
                for need, why in _MISSING.items()
                if need in method.needs and not self._has(need)
            ),
            None,
        )

    def _has(self, need: Requirement) -> bool:
        models = {
            "judge": self.judge_model,
            "cheap_judge": self.cheap_judge_model,
            "decision": self.decision_model,
        }
        if need in models:
            return models[need] is not None
        if need == "rulebook":
            return self.task.rulebook is not None
        if need == "documents":
            return bool(self.task.documents)
        if need == "folds":
            return len(self.task.items) >= 2  # noqa: PLR2004 - a training fold and a test one
        return self.task.gold_rules() is not None

    def rules(self) -> Rulebook:
        """The rulebook (a method needing `rulebook` only runs when there is one)."""
        if self.task.rulebook is None:  # guarded by `unavailable`
            msg = f"The {self.task.name} task has no rulebook."
            raise ValueError(msg)
        return self.task.rulebook

    def similarity_k(self) -> tuple[int, str]:
        """rules+similarity's k, and where it came from (for the row's notes)."""
        if self.rules_sim_k is not None:
            return self.rules_sim_k, f"rules-sim: k={self.rules_sim_k}, as set"
        k = RULE_SIMILARITY_FALLBACK_K
        if self.tag_picks is None:
            return k, f"rules-sim: k={k}, since TAG did not run before it"
        picks, counted, inputs = self.tag_picks
        if picks is None:
            return k, f"rules-sim: k={k}, since every input of TAG failed"
        k = max(1, round(picks))
        over = "" if counted == inputs else f" over {counted} of {inputs} inputs"
        return k, f"rules-sim: k={k}, TAG's mean picks on this run ({picks:.1f}{over})"

    def judge(self) -> BaseChatModel:
        """The judge model (a method needing `judge` only runs when there is one)."""
        if self.judge_model is None:  # guarded by `unavailable`
            msg = "No judge model is configured."
            raise ValueError(msg)
        return self.judge_model

    def decision(self) -> BaseDecisionModel:
        """The decision model (`decision` methods only run when there is one)."""
        if self.decision_model is None:  # guarded by `unavailable`
            msg = "No decision model is configured."
            raise ValueError(msg)
        return self.decision_model


Builder = Callable[[MethodContext], BaseRetriever]

_RULEBOOK: tuple[Requirement, ...] = ("rulebook",)
_JUDGE: tuple[Requirement, ...] = ("judge", "documents")
_DOCUMENTS: tuple[Requirement, ...] = ("documents",)
_JUDGED: tuple[Requirement, ...] = ("rulebook", "judge")
_CASCADE: tuple[Requirement, ...] = ("rulebook", "judge", "cheap_judge")
_DECIDED: tuple[Requirement, ...] = ("rulebook", "decision")
_ORACLE: tuple[Requirement, ...] = ("rulebook", "gold")
_JUDGED_LEARNED: tuple[Requirement, ...] = ("rulebook", "judge", "gold", "folds")
_ORACLE_LEARNED: tuple[Requirement, ...] = ("rulebook", "gold", "folds")

_LEARNED_FROM_GOLD = (
    f"learned prefilter: {KFOLDS}-fold over the inputs, each fold's trained on the "
    "other folds' verdicts"
)
LEARNED_NOTES: Mapping[JudgeKind, str] = {
    "oracle": f"{_LEARNED_FROM_GOLD}: the oracle's (gold labels)",
    "model": f"{_LEARNED_FROM_GOLD}: the gold labels standing in for the judge "
    "model's (the harness does not collect its verdicts beforehand)",
}
"""What the learned methods trained on, added to their rows' notes."""

ORACLE_DECISION_NOTE = (
    "its oracle look-ups are decision requests (an input's candidate rules in "
    "one); its input tokens are counted, what those requests would send a "
    "decision model, not measured or paid"
)
"""Said of every `oracle-decision` row: what its look-ups and tokens are."""


@dataclass(frozen=True)
class Method:
    """One way of choosing what the executor is given, with how to build it."""

    name: str
    """Unique within a task; what `--methods` selects."""
    family: Family
    units: UnitKind
    build: Builder
    """Builds the method's retriever for a task."""
    needs: tuple[Requirement, ...] = ()
    scorer: Scorer | None = None
    """For a prefilter method, the similarity scorer it ranks rules by; for a
    learned one, `learned`: the diagnostic row the method stands on."""
    notes: tuple[str, ...] = ()
    """Said of every result of the method (e.g. what it was trained on)."""
    explain: Callable[[MethodContext], str] | None = None
    """A note that depends on the run (e.g. the k rules+similarity used)."""


# --- Builders -------------------------------------------------------------------------


def _no_retrieval(_context: MethodContext) -> BaseRetriever:
    return baselines.NoRetrieval()


def _all_rules(context: MethodContext) -> BaseRetriever:
    return baselines.AllRulesRetriever(rulebook=context.rules())


def _chunks(context: MethodContext, *, k: int) -> BaseRetriever:
    chunks = baselines.split_into_chunks(context.task.documents)
    return baselines.chunk_retriever(chunks, context.embeddings, k)


def _similar_rules(context: MethodContext) -> BaseRetriever:
    return baselines.RuleSimilarityRetriever(
        rulebook=context.rules(),
        embeddings=context.embeddings,
        k=context.similarity_k()[0],
    )


def _similarity_note(context: MethodContext) -> str:
    return context.similarity_k()[1]


def _shortlist(context: MethodContext, shortlist: Shortlist) -> BaseRetriever:
    scorer, n = shortlist
    found = prefilters.build_prefilter(
        context.rules(),
        scorer,
        n,
        embeddings=None if scorer == "bm25" else context.embeddings,
    )
    if found is None:  # only for n=None, which no method uses
        msg = f"prefilter {scorer} with n={n} built nothing"
        raise ValueError(msg)
    return found


def _prefilter(context: MethodContext, *, shortlist: Shortlist) -> BaseRetriever:
    return ShortlistedRules(
        shortlist=_shortlist(context, shortlist), rulebook=context.rules()
    )


def _judge(
    context: MethodContext, kind: JudgeKind, rules_per_call: int = 1
) -> BaseJudge:
    profile = context.task.profile
    if kind == "oracle":
        return oracle_judge(context.task.oracle_gold() or {}, profile)
    if kind == "oracle-decision":
        return oracle_decision_judge(context.task.oracle_gold() or {}, profile)
    if kind == "decision":
        return DecisionJudge(model=context.decision(), profile=profile)
    judge = ApplicabilityJudge(
        llm=context.judge(), profile=profile, rules_per_call=rules_per_call
    )
    if kind == "model":
        return judge
    if context.cheap_judge_model is None:  # guarded by `unavailable`
        msg = "No cheap judge model is configured."
        raise ValueError(msg)
    cheap = ApplicabilityJudge(
        llm=context.cheap_judge_model, profile=profile, logprobs=True
    )
    return CascadeJudge(cheap=cheap, strong=judge)


def _tag(
    context: MethodContext,
    *,
    judge: JudgeKind,
    shortlist: Shortlist | None = None,
    rules_per_call: int = 1,
) -> BaseRetriever:
    return TAGRetriever(
        rulebook=context.rules(),
        judge=_judge(context, judge, rules_per_call),
        prefilter=None if shortlist is None else _shortlist(context, shortlist),
        max_concurrency=context.max_concurrency,
    )


def _tag_learned(context: MethodContext, *, judge: JudgeKind) -> BaseRetriever:
    """TAG behind a learned prefilter, k-fold over the inputs.

    Trained on the gold labels (the oracle's verdicts) of the other folds, for the
    judge model too (see `LEARNED_NOTES`).
    """
    return TAGRetriever(
        rulebook=context.rules(),
        judge=_judge(context, judge),
        prefilter=fit_kfold(context.rules(), context.task.oracle_gold() or {}),
        max_concurrency=context.max_concurrency,
    )


def _reranker(context: MethodContext) -> BaseRetriever:
    return baselines.RelevanceReranker(
        rulebook=context.rules(),
        llm=context.judge(),
        max_concurrency=context.max_concurrency,
    )


def _chunk_applicability(context: MethodContext) -> BaseRetriever:
    return baselines.ChunkApplicabilityRetriever(
        chunks=baselines.split_into_chunks(context.task.documents),
        llm=context.judge(),
        max_concurrency=context.max_concurrency,
    )


def _llm_filter(context: MethodContext, *, k: int) -> BaseRetriever:
    return baselines.llm_chain_filter_retriever(
        _chunks(context, k=k), context.judge(), max_concurrency=context.max_concurrency
    )


class ShortlistedRules(BaseRetriever):
    """A prefilter's shortlist as the executor would get it: the rules' actions.

    A prefilter names rules (its documents carry the text it compared); used as a
    method on its own, the executor is given those rules as every rule-level
    retriever gives them (`rule_document`: the action), in the prefilter's order.
    """

    shortlist: BaseRetriever
    """Names the rules by `metadata["rule_id"]` or `id`."""
    rulebook: Rulebook

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        config: RunnableConfig = {"callbacks": run_manager.get_child()}
        return self._as_rules(self.shortlist.invoke(query, config))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        config: RunnableConfig = {"callbacks": run_manager.get_child()}
        return self._as_rules(await self.shortlist.ainvoke(query, config))

    def _as_rules(self, found: Sequence[Document]) -> list[Document]:
        rules = []
        for doc in found:
            rule = self.rulebook.get(str(doc.metadata.get("rule_id") or doc.id))
            if rule is None:
                msg = f"The prefilter named {doc.id!r}, which is not in the rulebook."
                raise ValueError(msg)
            rules.append(
                rule_document(rule, relevance_score=doc.metadata.get("similarity"))
            )
        return rules


# --- The registry ---------------------------------------------------------------------


def prefilter_sizes(task: TaskName, n_rules: int | None = None) -> tuple[int, ...]:
    """The prefilter sizes compared on `task` (a custom one: shares of its rules).

    Raises:
        ValueError: A custom task without `n_rules`.
    """
    if task != "custom":
        return PREFILTER_NS[task]
    if n_rules is None:
        msg = "A custom task's prefilter sizes need its rule count."
        raise ValueError(msg)
    return tuple(sorted({max(1, round(n_rules * share)) for share in PREFILTER_SHARES}))


def standard_methods(task: TaskName, n_rules: int | None = None) -> list[Method]:
    """The methods compared on `task`, cheapest first, rules+similarity after TAG.

    rules+similarity comes after TAG because its k is TAG's mean picks on the same
    run. The oracle is named as such: it reads the gold labels.

    Args:
        task: The task's name.
        n_rules: The rulebook's size (needed for `custom`: its prefilter sizes).
    """
    # ObliQA's rulebook is its passages, one pseudo-rule each.
    rules: UnitKind = "passages" if task == "obliqa" else "rules"
    sizes = prefilter_sizes(task, n_rules)
    behind: Shortlist = ("hybrid", max(sizes))
    behind_name = f"+hybrid-n{max(sizes)}"
    tag, oracle = partial(_tag, judge="model"), partial(_tag, judge="oracle")
    return [
        # M0: the executor gets no guidance. M1: every rule's action.
        Method("m0-no-retrieval", "none", rules, _no_retrieval),
        Method("m1-all-rules", "all", rules, _all_rules, _RULEBOOK),
        # M2: the top k 500-character chunks by embedding similarity.
        *(
            Method(
                f"m2-chunks-k{k}",
                "similarity",
                "chunks",
                partial(_chunks, k=k),
                _DOCUMENTS,
            )
            for k in CHUNK_KS
        ),
        # A prefilter's N rules, unjudged.
        *(
            Method(
                f"prefilter-{kind}-n{size}",
                "prefilter",
                rules,
                partial(_prefilter, shortlist=(kind, size)),
                _RULEBOOK,
                scorer=kind,
            )
            for kind in PREFILTER_KINDS
            for size in sizes
        ),
        # M3: TAG, one applicability judgment per rule, of all rules or of the
        # prefilter's; the cascade's cheap judge's confident NOs are final.
        Method("tag", "tag", rules, tag, _JUDGED),
        # TAG judged by a decision model: an input's candidate rules in one request.
        Method(
            "tag-decision",
            "tag",
            rules,
            partial(_tag, judge="decision"),
            _DECIDED,
        ),
        Method(
            "tag" + behind_name, "tag", rules, partial(tag, shortlist=behind), _JUDGED
        ),
        # TAG behind a prefilter trained on past verdicts (k-fold over the inputs).
        Method(
            "tag+learned",
            "tag",
            rules,
            partial(_tag_learned, judge="model"),
            _JUDGED_LEARNED,
            scorer="learned",
            notes=(LEARNED_NOTES["model"],),
        ),
        # Several rules per judge call: fewer calls and tokens, quality to measure.
        *(
            Method(f"tag-b{b}", "tag", rules, partial(tag, rules_per_call=b), _JUDGED)
            for b in RULES_PER_CALL
        ),
        Method(
            "tag-cascade", "cascade", rules, partial(_tag, judge="cascade"), _CASCADE
        ),
        # The top k rules by embedding similarity (name, condition, action), k
        # TAG's mean picks on this run.
        Method(
            "rules-sim",
            "similarity",
            rules,
            _similar_rules,
            _RULEBOOK,
            explain=_similarity_note,
        ),
        # Pairwise "is this rule relevant", the action shown.
        Method("relevance-reranker", "reranker", rules, _reranker, _JUDGED),
        # The applicability judge over chunks; LangChain's LLMChainFilter over M2.
        Method(
            "chunks+applicability",
            "applicability",
            "chunks",
            _chunk_applicability,
            _JUDGE,
        ),
        Method(
            "llm-chain-filter-k20",
            "llm-filter",
            "chunks",
            partial(_llm_filter, k=20),
            _JUDGE,
        ),
        # TAG judged from the gold labels: the upper bound of TAG, and of TAG
        # behind the prefilter.
        Method("oracle", "oracle", rules, oracle, _ORACLE),
        # The oracle as a decision model: its requests and their tokens are what
        # one decision request per input costs.
        Method(
            "oracle-decision",
            "oracle",
            rules,
            partial(_tag, judge="oracle-decision"),
            _ORACLE,
            notes=(ORACLE_DECISION_NOTE,),
        ),
        Method(
            "oracle" + behind_name,
            "oracle",
            rules,
            partial(oracle, shortlist=behind),
            _ORACLE,
        ),
        Method(
            "oracle+learned",
            "oracle",
            rules,
            partial(_tag_learned, judge="oracle"),
            _ORACLE_LEARNED,
            scorer="learned",
            notes=(LEARNED_NOTES["oracle"],),
        ),
    ]


def methods_for(task: EvalTask) -> list[Method]:
    """`standard_methods` of `task`, sized by its rulebook."""
    return standard_methods(
        task.name, len(task.rulebook.rules) if task.rulebook else None
    )


def select_methods(
    methods: Sequence[Method], patterns: Iterable[str], *, strict: bool = True
) -> list[Method]:
    """The methods whose name matches any pattern (exact or glob: `prefilter-*`).

    Args:
        methods: The methods to choose from, e.g. `standard_methods(task)`.
        patterns: Names or shell-style globs.
        strict: Raise when a pattern matches nothing.

    Raises:
        ValueError: Under `strict`, a pattern matches no method; the message lists
            the names.
    """
    wanted = [p.strip() for p in patterns if p.strip()]
    unmatched = [
        p for p in wanted if not any(fnmatch.fnmatchcase(m.name, p) for m in methods)
    ]
    if strict and unmatched:
        msg = (
            f"No method matches {', '.join(map(repr, unmatched))}. Methods: "
            f"{', '.join(m.name for m in methods)} (globs such as 'prefilter-*' work)."
        )
        raise ValueError(msg)
    return [m for m in methods if any(fnmatch.fnmatchcase(m.name, p) for p in wanted)]
