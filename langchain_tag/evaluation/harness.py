"""The evaluation harness: every method as a retriever, scored with what it cost.

A method is anything that picks the units (rules, chunks or passages) the executor is
given for an input, so every method is a LangChain `BaseRetriever`: no retrieval,
all rules, similarity over chunks or rules, the similarity prefilters, TAG with or
without a prefilter, the relevance reranker, the judge over chunks, LangChain's
`LLMChainFilter`, and the oracle (TAG through the real `TAGRetriever`, judged by a
chat model that reads the gold labels: an upper bound, never a result).

`run_nba`, `run_obliqa` and `run_humaneval` run the standard methods of a task on
its development data and return one `EvalResult` per method: the task's quality
metrics and the cost columns (LLM calls, input and output tokens, wall time, units
given to the executor). Methods that need a judge model run only when one is given;
otherwise they come back as skipped rows with the reason, so an offline run covers
the methods without an LLM and the oracle.
"""

from __future__ import annotations

import asyncio
import copy
import fnmatch
import hashlib
import logging
import os
import sqlite3
import statistics
import threading
import time
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypedDict

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    BaseCallbackHandler,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.retrievers import BaseRetriever
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Self, Unpack

from langchain_tag import baselines
from langchain_tag.matching import prefilters as prefilter
from langchain_tag.embeddings import LocalMiniLMEmbeddings
from langchain_tag.evaluation import datasets, metrics
from langchain_tag.evaluation.diagnostic import MismatchReport, mismatch_diagnostic
from langchain_tag.evaluation.humaneval import apylint_score, arun_check
from langchain_tag.evaluation.oracle import oracle_judge
from langchain_tag.execution import (
    CODE_TEMPLATE,
    NBA_TEMPLATE,
    ActionOnlyExecutor,
    ExecutionTemplate,
    NBAVerdict,
)
from langchain_tag.matching import (
    CONDITION_PROFILE,
    ApplicabilityJudge,
    CascadeJudge,
    RuleSchemaProfile,
)
from langchain_tag.retrievers import TAGRetriever, rule_document
from langchain_tag.rules import Rule, Rulebook

__all__ = [
    "TASKS",
    "CachedEmbeddings",
    "CostTracker",
    "DiagnosticResult",
    "EvalItem",
    "EvalResult",
    "EvalTask",
    "HumanEvalTask",
    "ItemOutcome",
    "Method",
    "MethodContext",
    "NBATask",
    "ObliQATask",
    "RunOptions",
    "ShortlistedRules",
    "aevaluate",
    "diagnose",
    "embedding_namespace",
    "humaneval_task",
    "load_task",
    "nba_task",
    "obliqa_task",
    "run_humaneval",
    "run_nba",
    "run_obliqa",
    "select_methods",
    "shared_embeddings",
    "standard_methods",
]

logger = logging.getLogger(__name__)

TaskName = Literal["nba", "obliqa", "humaneval"]
TASKS: tuple[TaskName, ...] = ("nba", "obliqa", "humaneval")

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

UnitKind = Literal["rules", "chunks", "passages"]
"""What a method hands the executor: rules' actions, text chunks, or whole passages
(ObliQA's passage rulebook)."""

Requirement = Literal["judge", "cheap_judge", "rulebook", "gold"]
"""What a method needs beyond the task's documents: a judge model, a cheap judge
model with logprobs (the cascade), a rulebook for the task, or gold labels (the
oracle)."""

RANK_CUTOFF = 10
"""k of the ranked-retrieval metrics (ObliQA Recall@10 and MAP@10)."""


# --- Cost accounting ------------------------------------------------------------------


class CostTracker(BaseCallbackHandler):
    """Counts the chat model calls of a run and the tokens they report.

    Every call counts, whether or not the model reports usage; tokens are summed from
    each answer's `usage_metadata` (or an OpenAI-style `llm_output["token_usage"]`).
    Fakes and some local servers report none: then `reported_calls` stays 0 and the
    token columns are left empty rather than shown as 0.
    """

    # Counting is a few additions under a lock: no need for a worker thread per event.
    run_inline = True

    def __init__(self) -> None:
        """Start from zero."""
        self.calls = 0
        self.reported_calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self._lock = threading.Lock()

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        **kwargs: Any,
    ) -> None:
        """Count a chat model call."""
        with self._lock:
            self.calls += 1

    def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], **kwargs: Any
    ) -> None:
        """Count a completion model call."""
        with self._lock:
            self.calls += 1

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        """Add the tokens the answer reports."""
        tokens = _reported_tokens(response)
        if tokens is None:
            return
        with self._lock:
            self.reported_calls += 1
            self.input_tokens += tokens[0]
            self.output_tokens += tokens[1]


def _reported_tokens(response: LLMResult) -> tuple[int, int] | None:
    found = [
        generation.message.usage_metadata
        for generations in response.generations
        for generation in generations
        if isinstance(generation, ChatGeneration)
        and isinstance(generation.message, AIMessage)
        and generation.message.usage_metadata
    ]
    if found:
        return (
            sum(usage["input_tokens"] for usage in found),
            sum(usage["output_tokens"] for usage in found),
        )
    usage = (response.llm_output or {}).get("token_usage")
    if isinstance(usage, Mapping) and usage:
        return (
            int(usage.get("prompt_tokens", 0)),
            int(usage.get("completion_tokens", 0)),
        )
    return None


class CachedEmbeddings(Embeddings):
    """Remembers every vector, so methods sharing texts embed each text once.

    Several methods index the same chunks, rules or passages and embed the same
    queries; without this every one of them would pay the embedding model again.
    With `path`, vectors are also kept in a SQLite file, so a later run embeds
    only texts it has not seen (embedding is most of an offline run's time).

    Args:
        embeddings: The model.
        path: A SQLite file to keep vectors in across runs; None keeps them in
            memory only.
        namespace: Names the model in the file's keys, so vectors of different
            models never mix; required with `path` (see `embedding_namespace`).
    """

    def __init__(
        self,
        embeddings: Embeddings,
        path: str | os.PathLike[str] | None = None,
        namespace: str | None = None,
    ) -> None:
        """Wrap `embeddings`, optionally over a vector file."""
        if path is not None and not namespace:
            msg = (
                "A persistent embedding cache needs a namespace naming the model "
                "(e.g. embedding_namespace(embeddings)), or vectors of different "
                "models would mix."
            )
            raise ValueError(msg)
        self.embeddings = embeddings
        self.namespace = namespace or ""
        self._memory: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            # Shared by worker threads; every use holds `_lock`.
            self._db = sqlite3.connect(path, check_same_thread=False)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, "
                "vector BLOB NOT NULL)"
            )

    def _key(self, kind: str, text: str) -> str:
        payload = f"{self.namespace}\0{kind}\0{text}".encode()
        return hashlib.sha256(payload).hexdigest()

    def _known(self, kind: str, texts: Iterable[str]) -> list[str]:
        """The texts without a vector in memory, after loading those on file."""
        with self._lock:
            missing = list(
                dict.fromkeys(t for t in texts if (kind, t) not in self._memory)
            )
            if self._db is None or not missing:
                return missing
            for text in missing:
                row = self._db.execute(
                    "SELECT vector FROM vectors WHERE key = ?", (self._key(kind, text),)
                ).fetchone()
                if row is not None:
                    self._memory[kind, text] = array("d", row[0]).tolist()
            return [t for t in missing if (kind, t) not in self._memory]

    def _remember(
        self, kind: str, texts: list[str], vectors: list[list[float]]
    ) -> None:
        with self._lock:
            self._memory.update(
                ((kind, text), vector)
                for text, vector in zip(texts, vectors, strict=True)
            )
            if self._db is not None:
                with self._db:
                    self._db.executemany(
                        "INSERT OR REPLACE INTO vectors VALUES (?, ?)",
                        [
                            (self._key(kind, text), array("d", vector).tobytes())
                            for text, vector in zip(texts, vectors, strict=True)
                        ],
                    )

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed the texts not seen before, in one call; the others from the cache."""
        missing = self._known("document", texts)
        if missing:
            self._remember(
                "document", missing, self.embeddings.embed_documents(missing)
            )
        with self._lock:
            return [self._memory["document", text] for text in texts]

    def embed_query(self, text: str) -> list[float]:
        """Embed a query once."""
        if self._known("query", [text]):
            self._remember("query", [text], [self.embeddings.embed_query(text)])
        with self._lock:
            return self._memory["query", text]


def embedding_namespace(embeddings: Embeddings) -> str | None:
    """A name for the model behind `embeddings`, for a persistent cache.

    None if it cannot be told (then vectors are kept in memory only). Known:
    `LocalMiniLMEmbeddings` (its model directory) and embeddings with a `model` or
    `model_name` field (most LangChain integrations).
    """
    if isinstance(embeddings, LocalMiniLMEmbeddings):
        return f"minilm:{embeddings.model_path.resolve()}"
    name = getattr(embeddings, "model", None) or getattr(embeddings, "model_name", None)
    return f"{type(embeddings).__qualname__}:{name}" if isinstance(name, str) else None


# --- Methods --------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodContext:
    """What a method's factory builds its retriever from, for one task."""

    task: TaskName
    rulebook: Rulebook | None
    """The task's rules; None when the task has none (see `EvalTask.rulebook`)."""
    documents: Sequence[Document]
    """The instruction text (or passages) that chunk methods split and index."""
    embeddings: Embeddings
    judge_model: BaseChatModel | None
    cheap_judge_model: BaseChatModel | None
    """The cascade's first-stage judge (needs logprobs)."""
    profile: RuleSchemaProfile
    """What a TAG judge sees of each rule."""
    oracle_gold: Mapping[str, frozenset[str]]
    """Input text -> the rule ids the oracle judges applicable."""
    max_concurrency: int
    """In-flight LLM calls at most, per method."""

    def rules(self) -> Rulebook:
        """The rulebook (a method requiring `rulebook` only runs when there is one)."""
        if self.rulebook is None:  # guarded by EvalTask.unavailable
            msg = f"The {self.task} task has no rulebook."
            raise ValueError(msg)
        return self.rulebook

    def judge(self) -> BaseChatModel:
        """The judge model (a method requiring `judge` only runs when there is one)."""
        if self.judge_model is None:  # guarded by EvalTask.unavailable
            msg = "No judge model is configured."
            raise ValueError(msg)
        return self.judge_model


MethodFactory = Callable[[MethodContext], BaseRetriever]


class Method(BaseModel):
    """One way of choosing what the executor is given, with how to build it."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Unique within a task; what `--methods` selects.")
    family: Family
    units: UnitKind
    description: str
    needs: frozenset[Requirement] = frozenset()
    scorer: prefilter.Method | None = None
    """For a prefilter method: the similarity scorer it ranks rules by."""
    factory: MethodFactory = Field(exclude=True)
    """Builds the method's retriever for a task."""


def _no_retrieval(_context: MethodContext) -> BaseRetriever:
    return baselines.NoRetrieval()


def _all_rules(context: MethodContext) -> BaseRetriever:
    return baselines.AllRulesRetriever(rulebook=context.rules())


def _chunk_index(context: MethodContext, k: int) -> BaseRetriever:
    chunks = baselines.split_into_chunks(context.documents)
    return baselines.chunk_retriever(chunks, context.embeddings, k)


def _chunks(k: int) -> MethodFactory:
    def build(context: MethodContext) -> BaseRetriever:
        return _chunk_index(context, k)

    return build


def _rule_similarity(k: int) -> MethodFactory:
    def build(context: MethodContext) -> BaseRetriever:
        return baselines.RuleSimilarityRetriever(
            rulebook=context.rules(), embeddings=context.embeddings, k=k
        )

    return build


def _shortlist(
    kind: prefilter.Method, n: int
) -> Callable[[MethodContext], BaseRetriever]:
    def build(context: MethodContext) -> BaseRetriever:
        found = prefilter.build_prefilter(
            context.rules(),
            kind,
            n,
            embeddings=None if kind == "bm25" else context.embeddings,
        )
        if found is None:  # only for n=None, which no method uses
            msg = f"prefilter {kind} with n={n} built nothing"
            raise ValueError(msg)
        return found

    return build


def _prefilter(kind: prefilter.Method, n: int) -> MethodFactory:
    shortlist = _shortlist(kind, n)

    def build(context: MethodContext) -> BaseRetriever:
        return ShortlistedRules(shortlist=shortlist(context), rulebook=context.rules())

    return build


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
        found = self.shortlist.invoke(query, {"callbacks": run_manager.get_child()})
        return self._as_rules(found)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        found = await self.shortlist.ainvoke(
            query, {"callbacks": run_manager.get_child()}
        )
        return self._as_rules(found)

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


def _tag(
    judge: Callable[[MethodContext], ApplicabilityJudge],
    shortlist: Callable[[MethodContext], BaseRetriever] | None = None,
) -> MethodFactory:
    def build(context: MethodContext) -> BaseRetriever:
        return TAGRetriever(
            rulebook=context.rules(),
            judge=judge(context),
            prefilter=None if shortlist is None else shortlist(context),
            max_concurrency=context.max_concurrency,
        )

    return build


def _model_judge(context: MethodContext) -> ApplicabilityJudge:
    return ApplicabilityJudge(llm=context.judge(), profile=context.profile)


def _oracle_judge(context: MethodContext) -> ApplicabilityJudge:
    return oracle_judge(context.oracle_gold, context.profile)


def _cascade_judge(context: MethodContext) -> ApplicabilityJudge:
    if context.cheap_judge_model is None:  # guarded by EvalTask.unavailable
        msg = "No cheap judge model is configured."
        raise ValueError(msg)
    cheap = ApplicabilityJudge(
        llm=context.cheap_judge_model, profile=context.profile, logprobs=True
    )
    return CascadeJudge(cheap=cheap, strong=_model_judge(context))


def _reranker(context: MethodContext) -> BaseRetriever:
    return baselines.RelevanceReranker(
        rulebook=context.rules(),
        llm=context.judge(),
        max_concurrency=context.max_concurrency,
    )


def _chunk_applicability(context: MethodContext) -> BaseRetriever:
    return baselines.ChunkApplicabilityRetriever(
        chunks=baselines.split_into_chunks(context.documents),
        llm=context.judge(),
        max_concurrency=context.max_concurrency,
    )


def _llm_filter(k: int) -> MethodFactory:
    def build(context: MethodContext) -> BaseRetriever:
        return baselines.llm_chain_filter_retriever(
            _chunk_index(context, k),
            context.judge(),
            max_concurrency=context.max_concurrency,
        )

    return build


CHUNK_KS = (5, 10, 15, 20)
"""M2's top-k, as in the paper."""

PREFILTER_KINDS: tuple[prefilter.Method, ...] = ("dense", "bm25", "hybrid")

PREFILTER_NS: Mapping[TaskName, tuple[int, ...]] = {
    # NBA has 55 catalogued rules; ObliQA hundreds of passage rules; PEP 8 ~120.
    "nba": (5, 10, 20),
    "obliqa": (10, 25, 50),
    "humaneval": (10, 20, 40),
}

RULE_SIMILARITY_KS: Mapping[TaskName, tuple[int, ...]] = {
    # Around TAG's mean picks in the paper (14-21 rules) and the gold label count.
    "nba": (10,),
    "obliqa": (10,),
    "humaneval": (10,),
}

TAG_PREFILTER: Mapping[TaskName, tuple[prefilter.Method, int]] = {
    "nba": ("hybrid", 20),
    "obliqa": ("hybrid", 50),
    "humaneval": ("hybrid", 40),
}
"""The prefilter put in front of TAG (and of the oracle, to bound TAG + prefilter)."""


def standard_methods(task: TaskName) -> list[Method]:
    """The methods compared on `task`, cheapest first.

    M0 (no retrieval), M1 (all rules), M2 (chunks by similarity, top 5/10/15/20),
    rules by similarity, the dense / BM25 / hybrid prefilters on their own at
    several N, TAG, TAG behind a prefilter, the TAG cascade, the relevance
    reranker, the judge over chunks, LangChain's LLMChainFilter over M2, and the
    oracle, alone and behind the prefilter. The oracle is named as such: it reads
    the gold labels.
    """
    kind, n = TAG_PREFILTER[task]
    # ObliQA's rulebook is its passages, one pseudo-rule each.
    rule_units: UnitKind = "passages" if task == "obliqa" else "rules"
    tag_prefilter = _shortlist(kind, n)
    return [
        Method(
            name="m0-no-retrieval",
            family="none",
            units=rule_units,
            description="M0: the executor gets no guidance",
            factory=_no_retrieval,
        ),
        Method(
            name="m1-all-rules",
            family="all",
            units=rule_units,
            description="M1: every rule's action",
            needs=frozenset({"rulebook"}),
            factory=_all_rules,
        ),
        *(
            Method(
                name=f"m2-chunks-k{k}",
                family="similarity",
                units="chunks",
                description=f"M2: top {k} 500-character chunks by embedding similarity",
                factory=_chunks(k),
            )
            for k in CHUNK_KS
        ),
        *(
            Method(
                name=f"rules-sim-k{k}",
                family="similarity",
                units=rule_units,
                description=f"top {k} rules by embedding similarity (name, "
                "condition, action)",
                needs=frozenset({"rulebook"}),
                factory=_rule_similarity(k),
            )
            for k in RULE_SIMILARITY_KS[task]
        ),
        *(
            Method(
                name=f"prefilter-{kind_}-n{n_}",
                family="prefilter",
                units=rule_units,
                description=f"the {kind_} prefilter's {n_} rules, unjudged",
                needs=frozenset({"rulebook"}),
                scorer=kind_,
                factory=_prefilter(kind_, n_),
            )
            for kind_ in PREFILTER_KINDS
            for n_ in PREFILTER_NS[task]
        ),
        Method(
            name="tag",
            family="tag",
            units=rule_units,
            description="M3: TAG, one applicability judgment per rule",
            needs=frozenset({"rulebook", "judge"}),
            factory=_tag(_model_judge),
        ),
        Method(
            name=f"tag+{kind}-n{n}",
            family="tag",
            units=rule_units,
            description=f"TAG judging the {kind} prefilter's {n} rules",
            needs=frozenset({"rulebook", "judge"}),
            factory=_tag(_model_judge, tag_prefilter),
        ),
        Method(
            name="tag-cascade",
            family="cascade",
            units=rule_units,
            description="TAG with the judge cascade: the cheap judge's confident "
            "NOs are final, the rest go to the judge",
            needs=frozenset({"rulebook", "judge", "cheap_judge"}),
            factory=_tag(_cascade_judge),
        ),
        Method(
            name="relevance-reranker",
            family="reranker",
            units=rule_units,
            description="pairwise 'is this rule relevant', action shown",
            needs=frozenset({"rulebook", "judge"}),
            factory=_reranker,
        ),
        Method(
            name="chunks+applicability",
            family="applicability",
            units="chunks",
            description="the applicability judge over 500-character chunks",
            needs=frozenset({"judge"}),
            factory=_chunk_applicability,
        ),
        Method(
            name="llm-chain-filter-k20",
            family="llm-filter",
            units="chunks",
            description="LangChain LLMChainFilter over M2's top 20 chunks",
            needs=frozenset({"judge"}),
            factory=_llm_filter(20),
        ),
        Method(
            name="oracle",
            family="oracle",
            units=rule_units,
            description="ORACLE: TAG judged from the gold labels (upper bound)",
            needs=frozenset({"rulebook", "gold"}),
            factory=_tag(_oracle_judge),
        ),
        Method(
            name=f"oracle+{kind}-n{n}",
            family="oracle",
            units=rule_units,
            description=f"ORACLE behind the {kind} prefilter's {n} rules "
            "(upper bound of TAG + prefilter)",
            needs=frozenset({"rulebook", "gold"}),
            factory=_tag(_oracle_judge, tag_prefilter),
        ),
    ]


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


# --- Results --------------------------------------------------------------------------


class EvalResult(BaseModel):
    """One method on one task: quality metrics and cost columns.

    Metrics a task does not define, or that were not measured (no executor model),
    are None; `notes` says why.
    """

    task: TaskName
    method: str
    family: Family
    units: UnitKind
    status: Literal["ok", "skipped"] = "ok"
    skip_reason: str | None = None
    n: int = Field(default=0, description="Inputs evaluated.")
    # NBA rule selection against the gold `relevant_rules`, and strict accuracy.
    precision_macro: float | None = None
    recall_macro: float | None = None
    f1_macro: float | None = None
    precision_micro: float | None = None
    recall_micro: float | None = None
    f1_micro: float | None = None
    strict_accuracy: float | None = None
    # ObliQA ranked passages.
    recall_at_10: float | None = None
    map_at_10: float | None = None
    recall_returned: float | None = Field(
        default=None, description="Recall of gold passages among all units returned."
    )
    # HumanEval + PEP 8.
    pass_at_1: float | None = None
    pylint: float | None = None
    # Cost.
    llm_calls: int = Field(default=0, description="Judge and executor calls.")
    executor_calls: int = 0
    input_tokens: int | None = Field(
        default=None, description="As reported by the models; None if none reported."
    )
    output_tokens: int | None = None
    wall_seconds: float = Field(
        default=0.0, description="Retrieval and execution of all inputs (not grading)."
    )
    setup_seconds: float = Field(
        default=0.0, description="Building the method (indexing, embedding)."
    )
    mean_units: float | None = Field(
        default=None, description="Units given to the executor per input."
    )
    mean_context_chars: float | None = Field(
        default=None, description="Characters of those units per input."
    )
    failures: int = Field(
        default=0, description="Inputs whose retrieval or execution raised."
    )
    first_error: str | None = Field(
        default=None, description="The first failure's error, when any failed."
    )
    notes: list[str] = Field(
        default_factory=list, description="What was not measured, and why."
    )

    @property
    def calls_per_input(self) -> float | None:
        """LLM calls per evaluated input."""
        return self.llm_calls / self.n if self.n else None


# --- Tasks ----------------------------------------------------------------------------


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


class EvalTask(ABC):
    """A task: its inputs, what methods retrieve from, and how answers are scored."""

    name: ClassVar[TaskName]
    template: ClassVar[ExecutionTemplate | None]
    """The executor's template; None for a retrieval-only task."""

    def __init__(
        self,
        items: Sequence[EvalItem],
        *,
        rulebook: Rulebook | None,
        documents: Sequence[Document],
        profile: RuleSchemaProfile = CONDITION_PROFILE,
        missing_rulebook: str = "",
    ) -> None:
        """Describe the task.

        Args:
            items: The inputs.
            rulebook: The rules rule methods select from, or None.
            documents: The text chunk methods split and index.
            profile: What a TAG judge sees of each rule.
            missing_rulebook: Why there is no rulebook (shown for skipped methods).
        """
        self.items = list(items)
        self.rulebook = rulebook
        self.documents = list(documents)
        self.profile = profile
        self.missing_rulebook = missing_rulebook

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

    def unavailable(self, method: Method, context: MethodContext) -> str | None:
        """Why `method` cannot run on this task here, or None."""
        if "rulebook" in method.needs and self.rulebook is None:
            return self.missing_rulebook or "the task has no rulebook"
        if "gold" in method.needs and self.gold_rules() is None:
            return "the task has no gold rule labels"
        if "judge" in method.needs and context.judge_model is None:
            return (
                "needs a judge model: pass --judge-model NAME (or judge_model=) and "
                "configure OPENAI_API_KEY or OPENAI_BASE_URL; not run offline"
            )
        if "cheap_judge" in method.needs and context.cheap_judge_model is None:
            return (
                "needs a cheap judge model with logprobs as its first stage: pass "
                "--cheap-judge-model NAME (or cheap_judge_model=)"
            )
        return None

    async def grade(self, item: EvalItem, answer: Any) -> dict[str, float]:
        """Per-input quality of the executor's answer (1.0/0.0 or a score).

        Only called for tasks with a `template`; retrieval-only tasks keep this.
        """
        del item, answer
        return {}

    @abstractmethod
    def metrics(
        self, method: Method, outcomes: Sequence[ItemOutcome], *, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """The quality metrics over all inputs, and notes on what was not measured."""


def _rule_ids(units: Sequence[Document]) -> list[str]:
    return [
        str(rule_id)
        for doc in units
        if (rule_id := doc.metadata.get("rule_id") or doc.id)
    ]


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

    def metrics(
        self, method: Method, outcomes: Sequence[ItemOutcome], *, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Rule-selection P/R/F1 (rule methods) and strict accuracy (executed)."""
        found: dict[str, float | None] = {}
        notes = []
        if method.units == "rules":
            scores = [
                metrics.selection_scores(set(_rule_ids(o.units)), set(o.item.gold))
                for o in outcomes
            ]
            total = metrics.aggregate(scores)
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
            found["strict_accuracy"] = _mean(
                o.grade.get("strict_accuracy", 0.0) for o in outcomes
            )
        else:
            notes.append("strict accuracy: needs an executor model")
        return found, notes


class ObliQATask(EvalTask):
    """ObliQA: Recall@10 and MAP@10 of gold passages (retrieval only)."""

    name = "obliqa"
    template = None

    def __init__(
        self,
        items: Sequence[EvalItem],
        *,
        units_of_rule: Callable[[Rule], Iterable[str]],
        **kwargs: Any,
    ) -> None:
        """Describe the task; `units_of_rule` maps a rule to its passages' ids."""
        super().__init__(items, **kwargs)
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

    def metrics(
        self, method: Method, outcomes: Sequence[ItemOutcome], *, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Recall@10, MAP@10, and recall over everything returned."""
        rankings = [(self.ranked_passages(o.units), o.item.gold) for o in outcomes]
        return {
            "recall_at_10": _mean(
                metrics.recall_at_k(ranked, gold, RANK_CUTOFF)
                for ranked, gold in rankings
            ),
            "map_at_10": _mean(
                metrics.average_precision_at_k(ranked, gold, RANK_CUTOFF)
                for ranked, gold in rankings
            ),
            "recall_returned": _mean(
                metrics.recall_at_k(ranked, gold, max(len(ranked), 1))
                for ranked, gold in rankings
            ),
        }, []


class HumanEvalTask(EvalTask):
    """HumanEval + PEP 8: pass@1 (each `check` in a subprocess) and pylint score."""

    name = "humaneval"
    template = CODE_TEMPLATE

    def __init__(
        self, items: Sequence[EvalItem], *, timeout: float = 10.0, **kwargs: Any
    ) -> None:
        """Describe the task; `timeout` bounds each `check` run, in seconds."""
        super().__init__(items, **kwargs)
        self.timeout = timeout

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

    def metrics(
        self, method: Method, outcomes: Sequence[ItemOutcome], *, executed: bool
    ) -> tuple[dict[str, float | None], list[str]]:
        """Mean pass@1 and pylint score when executed."""
        if not executed:
            return {}, ["pass@1 and pylint: need an executor model"]
        return {
            "pass_at_1": _mean(o.grade.get("pass_at_1", 0.0) for o in outcomes),
            "pylint": _mean(o.grade["pylint"] for o in outcomes if "pylint" in o.grade),
        }, []


def _mean(values: Iterable[float]) -> float | None:
    found = list(values)
    return statistics.fmean(found) if found else None


# --- Running --------------------------------------------------------------------------


class RunOptions(TypedDict, total=False):
    """Options of `evaluate` and the `run_*` functions."""

    methods: Sequence[str] | None
    """Method names or globs to run (default: every standard method)."""
    limit: int | None
    """Evaluate only the first `limit` inputs."""
    judge_model: BaseChatModel | None
    """Judges for TAG, the reranker and the LLM filters; None skips them."""
    cheap_judge_model: BaseChatModel | None
    """The cascade's cheap first judge (a model with logprobs); None skips it."""
    executor_model: BaseChatModel | None
    """Executes the task (strict accuracy, pass@1); None measures retrieval only."""
    embeddings: Embeddings | None
    """For similarity methods; default the offline MiniLM."""
    max_concurrency: int
    """Inputs in progress at once, and LLM calls in flight per method."""
    on_result: Callable[[EvalResult], None] | None
    """Called with each method's result as soon as it is known (progress)."""


async def aevaluate(task: EvalTask, **options: Unpack[RunOptions]) -> list[EvalResult]:
    """Run the task's standard methods (or those selected) and score them.

    Methods run one after another, so their wall times do not disturb each other;
    the inputs of a method run concurrently, at most `max_concurrency` at once.
    """
    methods = standard_methods(task.name)
    if options.get("methods"):
        methods = select_methods(methods, options["methods"] or ())
    task = task.limited(options.get("limit"))
    max_concurrency = options.get("max_concurrency", 8)
    context = MethodContext(
        task=task.name,
        rulebook=task.rulebook,
        documents=task.documents,
        embeddings=shared_embeddings(options.get("embeddings")),
        judge_model=options.get("judge_model"),
        cheap_judge_model=options.get("cheap_judge_model"),
        profile=task.profile,
        oracle_gold=task.oracle_gold() or {},
        max_concurrency=max_concurrency,
    )
    on_result = options.get("on_result")
    executor_model = options.get("executor_model")
    executor = (
        None
        if executor_model is None or task.template is None
        else ActionOnlyExecutor(llm=executor_model, template=task.template)
    )
    results = []
    for method in methods:
        reason = task.unavailable(method, context)
        result = (
            _skipped(task, method, reason)
            if reason is not None
            else await _evaluate_method(
                task, method, context, executor, max_concurrency
            )
        )
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def _skipped(task: EvalTask, method: Method, reason: str) -> EvalResult:
    return EvalResult(
        task=task.name,
        method=method.name,
        family=method.family,
        units=method.units,
        status="skipped",
        skip_reason=reason,
    )


async def _evaluate_method(
    task: EvalTask,
    method: Method,
    context: MethodContext,
    executor: ActionOnlyExecutor | None,
    max_concurrency: int,
) -> EvalResult:
    started = time.perf_counter()
    try:
        # Building may embed a whole corpus: keep the event loop free meanwhile.
        retriever = await asyncio.to_thread(method.factory, context)
    except Exception as error:  # noqa: BLE001 - one bad configuration skips one row
        logger.warning("%s: %s could not be built: %s", task.name, method.name, error)
        return _skipped(task, method, f"could not be built: {error}")
    setup_seconds = time.perf_counter() - started
    retrieval, execution = CostTracker(), CostTracker()
    slots = asyncio.Semaphore(max_concurrency)

    async def run(item: EvalItem) -> ItemOutcome:
        async with slots:
            return await _run_item(
                task, method, retriever, executor, item, retrieval, execution
            )

    async def grade(outcome: ItemOutcome) -> None:
        async with slots:
            await _grade(task, method, outcome)

    started = time.perf_counter()
    outcomes = await asyncio.gather(*(run(item) for item in task.items))
    wall_seconds = time.perf_counter() - started
    # Graded after the clock stops: running checks and pylint is not the method's.
    await asyncio.gather(*(grade(o) for o in outcomes if o.answer is not None))
    quality, notes = task.metrics(method, outcomes, executed=executor is not None)
    errors = [o.error for o in outcomes if o.error]
    reported = retrieval.reported_calls + execution.reported_calls
    return EvalResult(
        task=task.name,
        method=method.name,
        family=method.family,
        units=method.units,
        n=len(outcomes),
        **quality,
        llm_calls=retrieval.calls + execution.calls,
        executor_calls=execution.calls,
        input_tokens=retrieval.input_tokens + execution.input_tokens
        if reported
        else None,
        output_tokens=retrieval.output_tokens + execution.output_tokens
        if reported
        else None,
        wall_seconds=wall_seconds,
        setup_seconds=setup_seconds,
        mean_units=_mean(len(o.units) for o in outcomes),
        mean_context_chars=_mean(
            sum(len(d.page_content) for d in o.units) for o in outcomes
        ),
        failures=len(errors),
        first_error=errors[0] if errors else None,
        notes=notes,
    )


async def _run_item(
    task: EvalTask,
    method: Method,
    retriever: BaseRetriever,
    executor: ActionOnlyExecutor | None,
    item: EvalItem,
    retrieval: CostTracker,
    execution: CostTracker,
) -> ItemOutcome:
    """Retrieve and execute one input; a failing step ends it, recorded."""
    outcome = ItemOutcome(item)
    try:
        outcome.units = await retriever.ainvoke(
            item.text, {"callbacks": [retrieval], "run_name": method.name}
        )
    except Exception as error:  # noqa: BLE001 - a failed input is counted, not fatal
        return _failed(task, method, outcome, "retrieval", error)
    if executor is None:
        return outcome
    try:
        outcome.answer = await executor.ainvoke(
            {"input": item.task_input or item.text, "rules": outcome.units},
            {"callbacks": [execution]},
        )
    except Exception as error:  # noqa: BLE001 - a failed input is counted, not fatal
        return _failed(task, method, outcome, "execution", error)
    return outcome


async def _grade(task: EvalTask, method: Method, outcome: ItemOutcome) -> None:
    try:
        outcome.grade = await task.grade(outcome.item, outcome.answer)
    except Exception as error:  # noqa: BLE001 - a failed input is counted, not fatal
        _failed(task, method, outcome, "grading", error)


def _failed(
    task: EvalTask, method: Method, outcome: ItemOutcome, step: str, error: Exception
) -> ItemOutcome:
    outcome.error = f"{step}: {type(error).__name__}: {error}"
    logger.warning(
        "%s %s %s: %s", task.name, method.name, outcome.item.id, outcome.error
    )
    return outcome


def shared_embeddings(
    embeddings: Embeddings | None = None,
    cache: str | os.PathLike[str] | None = None,
) -> CachedEmbeddings:
    """Embeddings every method of a run shares, each text embedded once.

    Args:
        embeddings: The model; default the offline MiniLM. Already shared
            embeddings are returned as they are.
        cache: A SQLite file keeping the vectors across runs, used when the model
            can be named (see `embedding_namespace`).
    """
    if isinstance(embeddings, CachedEmbeddings):
        return embeddings
    model = embeddings or LocalMiniLMEmbeddings()
    namespace = embedding_namespace(model)
    if cache is not None and namespace is None:
        logger.warning(
            "Cannot tell which model %s is, so its vectors are not kept in %s.",
            type(model).__name__,
            cache,
        )
        cache = None
    return CachedEmbeddings(model, cache, namespace)


class DiagnosticResult(BaseModel):
    """How well one similarity scorer predicts the gold rules of a task's inputs."""

    task: TaskName
    scorer: prefilter.Method
    report: MismatchReport


DIAGNOSTIC_KS: Mapping[TaskName, tuple[int, ...]] = {
    "nba": (5, 10, 20, 40),
    "obliqa": (10, 25, 50, 100),
    "humaneval": (10, 20, 40),
}


def diagnose(
    task: EvalTask,
    embeddings: Embeddings | None = None,
    scorers: Iterable[prefilter.Method] = PREFILTER_KINDS,
) -> list[DiagnosticResult]:
    """The mismatch diagnostic of the prefilters' scorers on the task's gold labels.

    For each scorer (dense, BM25, hybrid, as the prefilters rank rules): ROC-AUC of
    similarity as a predictor of gold (input, rule) pairs, recall of the top k, and
    the N a prefilter needs to keep 95% and 99% of the gold pairs. Empty for a task
    without a rulebook or gold rule labels.
    """
    gold = task.gold_rules()
    if task.rulebook is None or gold is None:
        return []
    items = prefilter.rule_items(task.rulebook)
    wanted_kinds = set(scorers)
    dense = (
        prefilter.DenseScorer(items, shared_embeddings(embeddings))
        if wanted_kinds & {"dense", "hybrid"}
        else None
    )
    bm25 = prefilter.BM25Scorer(items)
    built: dict[prefilter.Method, prefilter.SimilarityScorer] = {"bm25": bm25}
    if dense is not None:
        built |= {"dense": dense, "hybrid": prefilter.HybridScorer(dense, bm25)}
    queries = [(item.id, item.text) for item in task.items if gold[item.id]]
    wanted = {item_id: set(rule_ids) for item_id, rule_ids in gold.items()}
    return [
        DiagnosticResult(
            task=task.name,
            scorer=kind,
            report=mismatch_diagnostic(
                queries, wanted, built[kind], DIAGNOSTIC_KS[task.name]
            ),
        )
        for kind in PREFILTER_KINDS
        if kind in wanted_kinds
    ]


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


def run_nba(
    data_dir: str | os.PathLike[str] | None = None, **options: Unpack[RunOptions]
) -> list[EvalResult]:
    """Evaluate the standard methods on RuleArena-NBA (dev problems)."""
    return asyncio.run(aevaluate(load_task("nba", data_dir), **options))


def run_obliqa(
    data_dir: str | os.PathLike[str] | None = None, **options: Unpack[RunOptions]
) -> list[EvalResult]:
    """Evaluate the standard methods on the ObliQA sample (dev questions)."""
    return asyncio.run(aevaluate(load_task("obliqa", data_dir), **options))


def run_humaneval(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    rulebook: Rulebook | str | os.PathLike[str] | None = None,
    timeout: float = 10.0,
    **options: Unpack[RunOptions],
) -> list[EvalResult]:
    """Evaluate the standard methods on HumanEval + PEP 8.

    Args:
        data_dir: The shared data directory (default `../shared/data`).
        rulebook: A PEP 8 rulebook (object or file) for the rule methods; without
            one they are skipped.
        timeout: Seconds each problem's `check` may run.
        **options: See `RunOptions`.
    """
    task = load_task("humaneval", data_dir, pep8_rulebook=rulebook, timeout=timeout)
    return asyncio.run(aevaluate(task, **options))
