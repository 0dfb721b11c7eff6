"""`TAGRetriever`: applicability retrieval as a drop-in LangChain retriever.

Where a similarity retriever returns the passages most like the query, `TAGRetriever`
returns the rules whose condition the query satisfies, one judgment per rule, each
returned as a `Document` whose content is the rule's action (the executor sees only
actions, principle P3).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, ensure_config
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from langchain_tag._text import check_text, digest
from langchain_tag.matching.judge import (
    EXPLORE_RATE,
    EXPLORED,
    ApplicabilityJudge,
    BaseJudge,
    Verdict,
    check_selection,
    select_applicable,
)
from langchain_tag.matching.limiter import ConcurrencyLimiter
from langchain_tag.matching.shadow import (
    RecallEstimate,
    RetrainPolicy,
    estimate_recall,
    explore_pairs,
)
from langchain_tag.models import default_chat_model
from langchain_tag.rules import Rule, Rulebook

__all__ = [
    "MATCH_EVENT",
    "MatchResult",
    "RuleFilter",
    "TAGRetriever",
    "reassemble_chunks",
    "rule_document",
    "rule_passes",
]

logger = logging.getLogger(__name__)

RuleFilter = Mapping[str, Any] | Callable[[Rule], bool]
"""Field -> accepted value(s), or a predicate. List fields match on any overlap."""

MATCH_EVENT = "tag_match"
"""Name of the custom event each retrieval dispatches with its `MatchResult` summary."""

_CALL = "_tag_call"
_PER_CALL = ("k", "filter", "score_threshold")


class _Call(NamedTuple):
    """One retrieval's options, checked before any judgment."""

    k: int | None
    threshold: float | None
    rule_filter: RuleFilter | None
    limiter: ConcurrencyLimiter
    sink: list[MatchResult] | None


def rule_passes(rule: Rule, rule_filter: RuleFilter | None) -> bool:
    """Whether `rule` passes a metadata filter.

    A mapping filter names Rule fields (`tags`, `source_document_id`, ...) or keys of
    `Rule.metadata`; each value is an accepted value or a list of them. For list fields
    such as `tags`, a rule passes when any of its values is accepted.
    """
    if rule_filter is None:
        return True
    if callable(rule_filter):
        return bool(rule_filter(rule))
    for key, expected in rule_filter.items():
        if key in type(rule).model_fields or key == "source_document_id":
            value = getattr(rule, key)
        else:
            value = rule.metadata.get(key)
        accepted = (
            set(expected)
            if isinstance(expected, list | tuple | set | frozenset)
            else {expected}
        )
        values = set(value) if isinstance(value, list | tuple) else {value}
        if not values & accepted:
            return False
    return True


class MatchResult(BaseModel):
    """Everything one retrieval decided, not only the documents it returned."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    query: str
    documents: list[Document]
    verdicts: list[Verdict] = Field(description="Every judged rule, in rulebook order.")
    total_rules: int
    candidates: int = Field(description="Rules judged after filter and prefilter.")
    failed_rule_ids: list[str]
    reason: str | None = Field(description="Why nothing was returned, when empty.")
    prefix_share: float = Field(
        description="Share of prompt characters common to all judgments of the query."
    )
    elapsed_seconds: float
    explored_rule_ids: list[str] = Field(
        default_factory=list,
        description="Rules the prefilter skipped but that were judged anyway "
        "(shadow judging); a YES among them is a miss of the prefilter, returned.",
    )
    recall_estimate: RecallEstimate | None = Field(
        default=None,
        description="The learned prefilter's recall of YES verdicts so far, "
        "estimated from the shadow judgments, with its interval.",
    )

    def summary(self) -> dict[str, Any]:
        """A JSON-ready digest, as dispatched in the `tag_match` event."""
        return {
            "query": self.query,
            "matched_rule_ids": [d.metadata["rule_id"] for d in self.documents],
            "total_rules": self.total_rules,
            "candidates": self.candidates,
            "applicable": sum(v.applies for v in self.verdicts),
            "cached": sum(v.cached for v in self.verdicts),
            "failed_rule_ids": self.failed_rule_ids,
            "empty_reason": self.reason,
            "prefix_share": round(self.prefix_share, 4),
            "elapsed_seconds": round(self.elapsed_seconds, 4),
            "explored_rule_ids": self.explored_rule_ids,
            "prefilter_misses": [
                v.rule_id
                for v in self.verdicts
                if v.applies and v.rule_id in self.explored_rule_ids
            ],
            "recall_estimate": (
                None
                if self.recall_estimate is None
                else self.recall_estimate.model_dump()
            ),
        }


def _judge_from_llm(data: dict[str, Any]) -> ApplicabilityJudge:
    return ApplicabilityJudge(llm=data.get("llm") or default_chat_model())


class TAGRetriever(BaseRetriever):
    """Retrieve the rules whose condition the query satisfies.

    Each candidate rule gets one applicability judgment; the rules judged applicable
    come back as `Document(id=rule_id, page_content=action, metadata={...})`, ordered
    by relevance score (logprob-based when available, else 1.0), then rulebook order.

    Setup:
        ```bash
        pip install langchain-tag
        export OPENAI_API_KEY=...  # or pass any chat model as llm=
        ```

    Instantiate:
        ```python
        from langchain_tag import TAGRetriever

        retriever = TAGRetriever.from_rulebook("pep8.rulebook.json", llm=llm, k=5)
        ```

    Invoke:
        ```python
        docs = retriever.invoke("from os import *")
        docs[0].metadata["rule_id"], docs[0].page_content
        ```

    Use within a chain: anywhere a vector store's `as_retriever()` was used; the
    documents' `page_content` is what the executor should follow.

    Per call, `invoke(query, k=..., filter=..., score_threshold=...)` overrides the
    fields of the same names. When nothing applies the result is `[]`, and the reason
    is in the `tag_match` custom event of the run (and in `match(...).reason`).
    """

    rulebook: Rulebook
    """The rules to retrieve from."""
    llm: BaseChatModel | None = Field(default=None, exclude=True)
    """The judging chat model, when no `judge` is given (default: from the
    environment, see `default_chat_model`)."""
    judge: BaseJudge = Field(default_factory=_judge_from_llm)
    """Judges each (query, rule) pair; built from `llm` when not given."""
    k: int | None = Field(default=None, ge=0)
    """Return at most this many rules; None returns every applicable rule."""
    score_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """Drop applicable rules scoring below this (a rule without a score counts 1.0)."""
    max_concurrency: int | None = Field(default=8, ge=1)
    """In-flight judgments at most, across concurrent calls of this retriever."""
    filter: RuleFilter | None = None
    """Judge only rules passing this filter (see `rule_passes`)."""
    prefilter: BaseRetriever | None = None
    """Shortlists candidate rules before judging; its documents name rules by
    `metadata["rule_id"]` or `id`. None judges every rule, as in the paper. A
    prefilter with `partition(text)` (`LearnedPrefilter`) also says which rules it
    skipped, for shadow judging."""
    explore: float = Field(default=0.05, ge=0.0, le=1.0)
    """With a prefilter that says what it skipped: the share of skipped (input,
    rule) pairs judged anyway, in the same concurrency budget. Labels keep coming
    for skipped rules, and `MatchResult.recall_estimate` tracks the prefilter's
    recall live; a YES among them is returned (and counted as a miss)."""
    retrain_every: int | None = Field(default=None, ge=1)
    """With a `LearnedPrefilter` and a judge keeping a `verdict_log`: train the
    prefilter again from the log once this many new verdicts are logged (after the
    retrieval that crosses the mark, in its thread)."""

    _limiter: ConcurrencyLimiter = PrivateAttr()
    _warned_unscored: bool = PrivateAttr(default=False)
    _shadow_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _yes: list[int] = PrivateAttr(default_factory=lambda: [0, 0])
    """YES verdicts since the prefilter was trained: [kept, shadow]."""
    _trained_at: int | None = PrivateAttr(default=None)
    _training: bool = PrivateAttr(default=False)

    @model_validator(mode="before")
    @classmethod
    def _llm_or_judge(cls, data: Any) -> Any:
        if isinstance(data, dict) and None not in (data.get("llm"), data.get("judge")):
            msg = "Pass either llm= or judge=, not both (the judge has its own llm)."
            raise ValueError(msg)
        return data

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        self._limiter = ConcurrencyLimiter(self.max_concurrency)
        if self.retrain_every is not None and (
            not callable(getattr(self.prefilter, "fit", None))
            or getattr(self.judge, "verdict_log", None) is None
        ):
            msg = (
                "retrain_every needs a prefilter that learns (LearnedPrefilter) and "
                "a judge keeping a verdict_log to learn from."
            )
            raise ValueError(msg)

    @classmethod
    def from_rulebook(
        cls,
        rulebook: Rulebook | str | os.PathLike[str],
        llm: BaseChatModel | None = None,
        **kwargs: Any,
    ) -> TAGRetriever:
        """Build a retriever over a rulebook object or file.

        Args:
            rulebook: A `Rulebook`, or the path of a rulebook JSON file.
            llm: The judging chat model; default from the environment (see
                `default_chat_model`). Ignored if `judge=` is passed.
            **kwargs: Other fields (`k`, `score_threshold`, `max_concurrency`,
                `filter`, `prefilter`, `judge`, ...).
        """
        if not isinstance(rulebook, Rulebook):
            rulebook = Rulebook.load(rulebook)
        if kwargs.get("judge") is None:
            kwargs["llm"] = llm
        return cls(rulebook=rulebook, **kwargs)

    @classmethod
    def from_documents(
        cls,
        documents: Iterable[Document | str],
        llm: BaseChatModel | None = None,
        *,
        rulebook_path: str | os.PathLike[str] | None = None,
        domain: str = "instruction",
        extraction: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> TAGRetriever:
        """Extract a rulebook from documents, then retrieve over it.

        A rulebook file at `rulebook_path` is loaded only if it records the same
        documents: the same ids (as extraction gives them) with the same content
        (SHA-256); their order and source paths do not matter. If documents were
        added, removed or edited, a warning names them, the rulebook is extracted
        again and the file replaced. Under a persistent checkpoint (the default)
        that costs only the changed sections' calls; with `extraction=
        {"checkpoint": None}` every section is sent again. The domain and the
        extraction settings are not compared: delete the file to apply new ones.

        Args:
            documents: LangChain documents from any loader, or strings.
            llm: The model for extraction and judging; default from the environment.
            rulebook_path: Where to keep the rulebook (saved atomically); see above.
            domain: What the documents govern, for the extraction prompts.
            extraction: Other `extract_rules` arguments (`checkpoint`,
                `skip_phases`, `max_concurrency`, ...).
            **kwargs: `TAGRetriever` fields (`k`, `judge`, ...).

        Raises:
            RulebookError: The file at `rulebook_path` records no documents (it was
                not extracted), so it cannot be checked; it is left untouched.
        """
        # Imported here: extraction loads langgraph.
        from langchain_tag.extraction import extract_rules  # noqa: PLC0415
        from langchain_tag.extraction.run import changed_documents  # noqa: PLC0415
        from langchain_tag.rules import RulebookError  # noqa: PLC0415

        docs = list(documents)  # read twice: compared, then extracted
        path = None if rulebook_path is None else Path(rulebook_path)
        if path is not None and path.exists():
            rulebook = Rulebook.load(path)
            if not rulebook.documents:
                raise RulebookError(
                    path,
                    "records no source documents, so it cannot be checked against "
                    "the documents given.",
                    "Load it with TAGRetriever.from_rulebook(Rulebook.load(path)), "
                    "or delete it to extract the documents again.",
                )
            changes = changed_documents(rulebook.documents, docs)
            if not any(changes.values()):
                return cls.from_rulebook(rulebook, llm=llm, **kwargs)
            changed = "; ".join(
                f"{what}: {', '.join(ids)}" for what, ids in changes.items() if ids
            )
            logger.warning(
                "Rulebook %s was extracted from other documents (%s): extracting "
                "again.",
                path,
                changed,
            )
        rulebook = extract_rules(docs, llm=llm, domain=domain, **dict(extraction or {}))
        if path is not None:
            rulebook.save(path)
        return cls.from_rulebook(rulebook, llm=llm, **kwargs)

    @classmethod
    def from_vectorstore(
        cls,
        vectorstore: Any,
        llm: BaseChatModel | None = None,
        **kwargs: Any,
    ) -> TAGRetriever:
        """Extract rules from the documents already stored in a Chroma collection.

        Chunks that carry `source` and `start_index` metadata (as LangChain's text
        splitters add with `add_start_index=True`) are reassembled into their
        documents first, so sections and source offsets refer to the whole text;
        other chunks are extracted as documents of their own.

        Args:
            vectorstore: A `langchain_chroma.Chroma` store (anything with Chroma's
                `get(include=[...])`).
            llm: The model for extraction and judging.
            **kwargs: As for `from_documents`.
        """
        stored = vectorstore.get(include=["documents", "metadatas"])
        chunks = [
            Document(page_content=text or "", metadata=metadata or {}, id=chunk_id)
            for chunk_id, text, metadata in zip(
                stored["ids"], stored["documents"], stored["metadatas"], strict=True
            )
        ]
        return cls.from_documents(reassemble_chunks(chunks), llm, **kwargs)

    # -- public API beyond BaseRetriever ----------------------------------------------

    def match(
        self, query: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> MatchResult:
        """Retrieve, returning every verdict and the empty-result reason as well."""
        sink: list[MatchResult] = []
        self.invoke(query, config, **kwargs, _sink=sink)
        return sink[0]

    async def amatch(
        self, query: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> MatchResult:
        """Async `match`."""
        sink: list[MatchResult] = []
        await self.ainvoke(query, config, **kwargs, _sink=sink)
        return sink[0]

    # -- BaseRetriever ----------------------------------------------------------------

    def invoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        """Retrieve the applicable rules; per call: `k`, `filter`, `score_threshold`."""
        return super().invoke(input, config, **self._call(input, config, kwargs))

    async def ainvoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        """Async `invoke`."""
        return await super().ainvoke(input, config, **self._call(input, config, kwargs))

    def _call(
        self, query: object, config: RunnableConfig | None, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """Check the query and the per-call options before anything is judged.

        The run config's `max_concurrency` (as `batch` passes it) bounds this call's
        judgments too, within the retriever's own bound.
        """
        check_text(query, "The query")
        passed = {key: kwargs.pop(key) for key in _PER_CALL if key in kwargs}
        sink = kwargs.pop("_sink", None)
        unknown = sorted(set(kwargs) - {"run_id"})
        if unknown:
            msg = (
                f"TAGRetriever got unknown keyword argument(s) {', '.join(unknown)}; "
                f"per call it takes {', '.join(_PER_CALL)}."
            )
            raise TypeError(msg)
        k = passed.get("k", self.k)
        threshold = passed.get("score_threshold", self.score_threshold)
        check_selection(k, threshold)
        self.rulebook.check()
        limit = ensure_config(config).get("max_concurrency")
        limiter = (
            self._limiter
            if limit is None or limit == self._limiter.bound
            else ConcurrencyLimiter(limit, within=self._limiter)
        )
        call = _Call(k, threshold, passed.get("filter", self.filter), limiter, sink)
        return {**kwargs, _CALL: call}

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        started = time.perf_counter()
        call = self._call_of(query, kwargs)
        child: RunnableConfig = {"callbacks": run_manager.get_child()}
        candidates, explored = self.candidates(query, call.rule_filter, child)
        verdicts = self.judge.judge_rules(
            query,
            candidates,
            self._shadow_config(child, explored),
            limiter=call.limiter,
        )
        result = self._result(query, candidates, verdicts, call, started, explored)
        dispatch_custom_event(MATCH_EVENT, result.summary(), config=child)
        self._retrain_if_due()
        return result.documents

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        started = time.perf_counter()
        call = self._call_of(query, kwargs)
        child: RunnableConfig = {"callbacks": run_manager.get_child()}
        candidates, explored = await self.acandidates(query, call.rule_filter, child)
        verdicts = await self.judge.ajudge_rules(
            query,
            candidates,
            self._shadow_config(child, explored),
            limiter=call.limiter,
        )
        result = self._result(query, candidates, verdicts, call, started, explored)
        await adispatch_custom_event(MATCH_EVENT, result.summary(), config=child)
        if self.retrain_every is not None:  # training is CPU work: off the loop
            await asyncio.to_thread(self._retrain_if_due)
        return result.documents

    # -- the steps around the judgments -----------------------------------------------

    def candidates(
        self,
        query: str,
        rule_filter: RuleFilter | None = None,
        config: RunnableConfig | None = None,
    ) -> tuple[list[Rule], list[str]]:
        """The rules a retrieval of `query` judges, and the ids of those explored.

        The rules passing `rule_filter`, then those the prefilter keeps: a learned
        prefilter's kept rules plus the skipped ones explored in the shadow (their
        ids, second), or a similarity prefilter's shortlist. No model is called.
        """
        candidates = self._filtered(rule_filter)
        if (split := self._partitioned(query, candidates)) is not None:
            return split
        if self.prefilter is None or not candidates:
            return candidates, []
        shortlist = self.prefilter.invoke(query, config)
        return self._shortlisted(candidates, shortlist), []

    async def acandidates(
        self,
        query: str,
        rule_filter: RuleFilter | None = None,
        config: RunnableConfig | None = None,
    ) -> tuple[list[Rule], list[str]]:
        """Async `candidates`: the prefilter runs without blocking the loop."""
        candidates = self._filtered(rule_filter)
        if (split := self._partitioned(query, candidates)) is not None:
            return split
        if self.prefilter is None or not candidates:
            return candidates, []
        shortlist = await self.prefilter.ainvoke(query, config)
        return self._shortlisted(candidates, shortlist), []

    def _call_of(self, query: str, kwargs: Mapping[str, Any]) -> _Call:
        call = kwargs.get(_CALL)
        # Subclasses and tests may call the BaseRetriever hooks directly.
        return call if isinstance(call, _Call) else self._call(query, None, {})[_CALL]

    def _partitioned(
        self, query: str, candidates: list[Rule]
    ) -> tuple[list[Rule], list[str]] | None:
        """Candidates a learned prefilter keeps, plus the skipped ones explored."""
        partition = getattr(self.prefilter, "partition", None)
        if partition is None or not candidates:
            return None
        judged, skipped = partition(query)
        explored = explore_pairs(skipped, digest(query), rate=self.explore)
        wanted = {*judged, *explored}
        kept = [rule for rule in candidates if rule.rule_id in wanted]
        return kept, [rule_id for rule_id in explored if rule_id in wanted]

    def _shadow_config(
        self, config: RunnableConfig, explored: Sequence[str]
    ) -> RunnableConfig:
        # The judge marks these verdicts in its log: they weigh 1 / explore.
        if not explored:
            return config
        metadata = {EXPLORED: list(explored), EXPLORE_RATE: self.explore}
        return {**config, "metadata": {**config.get("metadata", {}), **metadata}}

    def _recall(
        self, verdicts: Sequence[Verdict], explored: Sequence[str]
    ) -> RecallEstimate | None:
        """Count YES verdicts kept and found in the shadow; the running estimate."""
        if not getattr(self.prefilter, "fitted", False) or not self.explore:
            return None
        shadow = set(explored)
        kept_yes = sum(v.applies for v in verdicts if v.rule_id not in shadow)
        shadow_yes = sum(v.applies for v in verdicts if v.rule_id in shadow)
        with self._shadow_lock:
            self._yes[0] += kept_yes
            self._yes[1] += shadow_yes
            kept, found = self._yes
        return estimate_recall(kept, found, self.explore)

    def _retrain_if_due(self) -> None:
        if self.retrain_every is None:
            return
        log = getattr(self.judge, "verdict_log", None)
        position = log.position()  # type: ignore[union-attr]
        with self._shadow_lock:
            due = not self._training and RetrainPolicy(every=self.retrain_every).due(
                position, self._trained_at
            )
            self._training = self._training or due
        if not due:
            return
        try:
            self.prefilter.fit(log.examples(self.rulebook))  # type: ignore[union-attr]
        finally:
            with self._shadow_lock:
                self._training = False
                self._trained_at = position
                self._yes = [0, 0]  # the new model's recall is counted afresh

    def _filtered(self, rule_filter: RuleFilter | None) -> list[Rule]:
        return [rule for rule in self.rulebook.rules if rule_passes(rule, rule_filter)]

    def _shortlisted(
        self, candidates: list[Rule], shortlist: Sequence[Document]
    ) -> list[Rule]:
        wanted = {doc.metadata.get("rule_id") or doc.id for doc in shortlist}
        known = {rule.rule_id for rule in candidates}
        unknown = wanted - known - {None}
        if unknown:
            logger.warning(
                "The prefilter returned %d rule id(s) not among the candidate rules "
                "(rulebook and store out of sync, or filtered out): %s",
                len(unknown),
                sorted(map(str, unknown))[:10],
            )
        return [rule for rule in candidates if rule.rule_id in wanted]

    def _result(
        self,
        query: str,
        candidates: list[Rule],
        verdicts: list[Verdict],
        call: _Call,
        started: float,
        explored: Sequence[str] = (),
    ) -> MatchResult:
        k, threshold, rule_filter = call.k, call.threshold, call.rule_filter
        rules = {rule.rule_id: rule for rule in candidates}
        applicable = [v for v in verdicts if v.applies]
        kept = select_applicable(
            verdicts, [rule.rule_id for rule in candidates], k=k, threshold=threshold
        )
        documents = [_to_document(rules[v.rule_id], v) for v in kept]
        failed = [v.rule_id for v in verdicts if v.failed]
        reason = None
        if not documents:
            reason = _empty_reason(
                total=len(self.rulebook),
                candidates=len(candidates),
                applicable=len(applicable),
                k=k,
                threshold=threshold,
                rule_filter=rule_filter,
                prefiltered=self.prefilter is not None,
            )
            if failed:
                reason += (
                    f" ({len(failed)} judgment(s) failed and were treated as not "
                    "applicable)"
                )
            logger.info("TAG retrieval returned nothing for %r: %s", query[:80], reason)
        if threshold is not None and not self._warned_unscored:
            unscored = [v.rule_id for v in applicable if v.score is None]
            if unscored:
                self._warned_unscored = True
                warnings.warn(
                    f"score_threshold={threshold} has no effect on verdicts without a "
                    f"score ({len(unscored)} here, e.g. {unscored[0]!r}): they rank "
                    "as 1.0. Scores come from logprobs: ApplicabilityJudge("
                    "logprobs=True) with a model that returns them (e.g. ChatOpenAI).",
                    UserWarning,
                    stacklevel=2,
                )
        result = MatchResult(
            query=query,
            documents=documents,
            verdicts=verdicts,
            total_rules=len(self.rulebook),
            candidates=len(candidates),
            failed_rule_ids=failed,
            reason=reason,
            prefix_share=self.judge.prefix_share(query, candidates),
            elapsed_seconds=time.perf_counter() - started,
            explored_rule_ids=list(explored),
            recall_estimate=self._recall(verdicts, explored),
        )
        if call.sink is not None:
            call.sink.append(result)
        return result


def reassemble_chunks(chunks: Sequence[Document]) -> list[Document]:
    """Rebuild documents from overlapping chunks that know their source and offset.

    Chunks with `metadata["source"]` and an integer `metadata["start_index"]` are laid
    back at their offsets (overlaps agree, so later chunks just extend the text, and
    a gap, whitespace the splitter stripped, becomes newlines); the others are
    returned as they are, in their original order.
    """
    placed: dict[str, list[Document]] = defaultdict(list)
    loose: list[Document] = []
    for chunk in chunks:
        source, start = chunk.metadata.get("source"), chunk.metadata.get("start_index")
        if isinstance(source, str) and isinstance(start, int):
            placed[source].append(chunk)
        else:
            loose.append(chunk)
    documents = []
    for source, parts in placed.items():
        text = ""
        for part in sorted(parts, key=lambda c: c.metadata["start_index"]):
            start = part.metadata["start_index"]
            # Splitters strip the whitespace they cut at; newlines fill exactly that
            # gap, so every later chunk lands at its own offset.
            text = text.ljust(start, "\n")[:start] + part.page_content
        documents.append(Document(page_content=text, metadata={"source": source}))
    return documents + loose


def rule_document(rule: Rule, **extra: Any) -> Document:
    """The `Document` every rule-level retriever returns for a rule.

    `id` and `metadata["rule_id"]` are the rule id, `page_content` is the action
    (all an executor should see), and the metadata also carries the rule's name,
    condition, source text, tags and source offsets, for tracing and scoring.

    Args:
        rule: The rule.
        **extra: More metadata, such as the `relevance_score` that ranked it.
    """
    metadata: dict[str, Any] = {
        "rule_id": rule.rule_id,
        "name": rule.name,
        "condition": rule.condition,
        "source_text": rule.source_text,
        "tags": list(rule.tags),
        "source_document_id": rule.source_document_id,
        "source_start": None if rule.source is None else rule.source.start,
        "source_end": None if rule.source is None else rule.source.end,
        **extra,
    }
    return Document(id=rule.rule_id, page_content=rule.action, metadata=metadata)


def _to_document(rule: Rule, verdict: Verdict) -> Document:
    return rule_document(
        rule,
        relevance_score=verdict.relevance,
        score=verdict.score,
        reason=verdict.reason,
        cached=verdict.cached,
    )


def _empty_reason(
    *,
    total: int,
    candidates: int,
    applicable: int,
    k: int | None,
    threshold: float | None,
    rule_filter: RuleFilter | None,
    prefiltered: bool,
) -> str:
    if total == 0:
        return "the rulebook has no rules"
    if candidates == 0 and rule_filter is not None and not prefiltered:
        return f"the filter {rule_filter!r} excluded all {total} rules"
    if candidates == 0:
        return "no rule passed the filter and the prefilter"
    if applicable == 0:
        return f"no rule's condition is satisfied by the input ({candidates} judged)"
    if k == 0:
        return "k=0"
    return f"{applicable} rule(s) applied but none reached score_threshold={threshold}"
