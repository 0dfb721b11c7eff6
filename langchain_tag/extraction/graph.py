"""Stage 1 as a LangGraph graph: five phases from documents to a verified rulebook.

    prepare -> detect_spans* -> plan_atomics -> decompose* -> plan_rules
      -> operationalise* -> plan_relations -> compare_rules* -> verify
      -> recover_rules* -> finalize

Starred nodes are LLM calls, fanned out with `Send` (one per section, batch of units,
or group of rules sharing a tag). They return the model's raw text only; the plan
nodes after them validate it against the current sections. That split is what makes
answers reusable: an answer is stored under its prompt (plus model and settings) the
moment it arrives, so an unchanged section is never sent again, while offsets are
always recomputed from the documents as they are now.

Run under a checkpointer with a durable answer store (`extract_rules` keeps both in
one SQLite file), a killed run resumes where it stopped without repeating any LLM
call that had finished.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Annotated, Any

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import get_runtime
from langgraph.types import Overwrite, Send
from pydantic import ConfigDict
from pydantic.json_schema import SkipJsonSchema
from typing_extensions import NotRequired, TypedDict

from langchain_tag._graph import as_documents, coerce_context
from langchain_tag._text import batches, slug
from langchain_tag.cache import VerdictCache
from langchain_tag.extraction import phases, prompts
from langchain_tag.extraction.phases import (
    AtomicRecord,
    DraftRule,
    RelationRecord,
    SpanRecord,
)
from langchain_tag.extraction.report import ExtractionReport, PhaseReport
from langchain_tag.extraction.sectioning import Section, detect_format, split_sections
from langchain_tag.extraction.verification import (
    FaithfulnessChecker,
    FaithfulnessMode,
    coverage,
    independence,
)
from langchain_tag.models import (
    CallRetry,
    default_chat_model,
    model_identity,
    with_settings,
)
from langchain_tag.rules import (
    FORMAT_VERSION,
    Rule,
    RuleLineage,
    RuleRelation,
    SourceDocument,
    SourceSpan,
)

SPAN_DETECTION, DECOMPOSITION, OPERATIONALISATION, RELATIONS, VERIFICATION = (
    1,
    2,
    3,
    4,
    5,
)
PHASE_NAMES = {
    SPAN_DETECTION: "spans",
    DECOMPOSITION: "atomics",
    OPERATIONALISATION: "rules",
    RELATIONS: "relations",
    VERIFICATION: "verify",
}
LLM_NODES = (
    "detect_spans",
    "decompose",
    "operationalise",
    "compare_rules",
    "recover_rules",
)


@dataclass(frozen=True)
class ExtractionSettings:
    """Per-run settings (the graph's `context_schema`).

    The model and the answer store are for Python callers; LangGraph Studio shows
    the JSON-able fields only and its runs use the model from the environment.
    """

    __pydantic_config__ = ConfigDict(arbitrary_types_allowed=True)

    llm: SkipJsonSchema[BaseChatModel | None] = None
    """The extracting model; None uses `default_chat_model()` (from the environment)."""
    skip_phases: frozenset[int] = frozenset()
    """Ablations: phases 1-5 to skip (the paper's Table 4)."""
    max_section_tokens: int = 1500
    units_per_call: int = 12
    rules_per_comparison: int = 16
    faithfulness_mode: FaithfulnessMode = "corrected"
    faithfulness_threshold: float = 0.85
    min_coverage_overlap: float = 0.5
    answers: SkipJsonSchema[VerdictCache | None] = None
    """Model answers kept by prompt. A SQLite store makes each answer durable the
    moment it arrives: a killed run resumes without asking again, and a re-run after
    an edit only sends the changed sections' prompts."""

    def __post_init__(self) -> None:
        """Accept any collection of phase numbers (JSON sends a list)."""
        object.__setattr__(self, "skip_phases", frozenset(self.skip_phases))

    def key(self) -> str:
        """What, besides the prompt, decides an LLM node's output (for its cache)."""
        return json.dumps([sorted(self.skip_phases), prompts.EXTRACTION_PROMPT_VERSION])


class ExtractionInput(TypedDict):
    """What an extraction run takes."""

    documents: list[Document]
    domain: NotRequired[str]
    run_key: NotRequired[str]
    """Fingerprint of the documents and settings; a finished run with the same key is
    returned as it is instead of being run again."""


class ExtractionOutput(TypedDict):
    """What an extraction run returns (JSON-ready)."""

    rulebook: dict[str, Any]
    report: dict[str, Any]


def _merge(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    return {**left, **right}


class ExtractionState(TypedDict, total=False):
    """The graph's state. Records are kept as plain JSON for any checkpointer."""

    documents: list[Document]
    domain: str
    run_key: str
    started: float
    model_key: str
    document_ids: list[str]
    sections: list[dict[str, Any]]
    raw: Annotated[dict[str, str], _merge]
    usage: Annotated[dict[str, list[int]], _merge]
    tallies: Annotated[dict[str, dict[str, int]], _merge]
    removed: list[dict[str, Any]]
    spans: list[dict[str, Any]]
    atomics: list[dict[str, Any]]
    drafts: list[dict[str, Any]]
    verified: list[dict[str, Any]]
    uncovered: list[dict[str, Any]]
    rulebook: dict[str, Any]
    report: dict[str, Any]


class ModelRequest(TypedDict):
    """The payload of one LLM node task."""

    key: str
    system: str
    user: str
    cache_key: str


DEFAULT_DOMAIN = "instruction"


def _settings() -> ExtractionSettings:
    return coerce_context(get_runtime(ExtractionSettings).context, ExtractionSettings)


@functools.cache
def _environment_model() -> BaseChatModel:
    return default_chat_model()


def _model(settings: ExtractionSettings) -> BaseChatModel:
    # Every extraction call: temperature 0, top_p 1, at most 4096 output tokens.
    model, _ = with_settings(
        settings.llm or _environment_model(),
        temperature=0.0,
        top_p=1.0,
        max_tokens=4096,
    )
    return model


def _request(
    key: str,
    messages: Sequence[Any],
    state: ExtractionState,
    settings: ExtractionSettings,
) -> ModelRequest:
    system, user = (str(m.content) for m in messages)
    cache_key = hashlib.sha256(
        json.dumps([state["model_key"], settings.key(), system, user]).encode()
    ).hexdigest()
    return {
        "key": key,
        "system": system,
        "user": user,
        "cache_key": cache_key,
    }


# Request-key prefix -> the report row the call counts under.
LLM_NODES_BY_PREFIX = {
    "spans": "spans",
    "atomics": "atomics",
    "rules": "rules",
    "relations": "relations",
    "recover": "recovery",
}


def _answered(request: ModelRequest, text: str, answer: Any = None) -> dict[str, Any]:
    """The node's writes; `answer` is the model's message, None for a stored answer."""
    usage = getattr(answer, "usage_metadata", None) or {}
    return {
        "raw": {request["key"]: text},
        "usage": {
            request["key"]: [
                usage.get("input_tokens", 0),
                usage.get("output_tokens", 0),
                int(answer is not None),
            ]
        },
    }


# --- the LLM nodes (raw text only) ----------------------------------------------------


# The list each LLM node's answer must hold, by request-key prefix.
_ANSWER_LISTS = {
    "spans": "spans",
    "atomics": "atomic_units",
    "rules": "rules",
    "relations": "relations",
    "recover": "rules",
}


def _storable(request: ModelRequest, text: str) -> bool:
    # An unreadable answer (empty, cut off, a refusal) is not kept, so the next run
    # asks again instead of losing the same section's rules for good.
    return phases.readable(text, _ANSWER_LISTS[request["key"].split(":", 1)[0]])


# The answer is stored before the node returns: LangGraph saves a finished task's
# writes only when its thread pool gets to it, which can be after a crash.
def _call(request: ModelRequest, config: RunnableConfig) -> dict[str, Any]:
    settings = _settings()
    store, key = settings.answers, request["cache_key"]
    if store is not None and (stored := store.lookup(key)) is not None:
        return _answered(request, stored)
    messages = [SystemMessage(request["system"]), HumanMessage(request["user"])]
    answer = _model(settings).invoke(messages, config)
    if store is not None and _storable(request, answer.text):
        store.update(key, answer.text)
    return _answered(request, answer.text, answer)


async def _acall(request: ModelRequest, config: RunnableConfig) -> dict[str, Any]:
    settings = _settings()
    store, key = settings.answers, request["cache_key"]
    if store is not None and (stored := await store.alookup(key)) is not None:
        return _answered(request, stored)
    messages = [SystemMessage(request["system"]), HumanMessage(request["user"])]
    answer = await _model(settings).ainvoke(messages, config)
    if store is not None and _storable(request, answer.text):
        await store.aupdate(key, answer.text)
    return _answered(request, answer.text, answer)


# --- prepare -----------------------------------------------------------------------


def _document_ids(documents: Sequence[Document]) -> list[str]:
    ids: list[str] = []
    for position, doc in enumerate(documents, 1):
        source = doc.metadata.get("source")
        base = doc.id or (
            re.sub(r"\.[^./]+$", "", str(source).rsplit("/", 1)[-1]) if source else ""
        )
        base = base or f"document-{position}"
        candidate, n = base, 1
        while candidate in ids:
            n += 1
            candidate = f"{base}-{n}"
        ids.append(candidate)
    return ids


def prepare(state: ExtractionState) -> dict[str, Any]:
    """Split every document into sections and fix the run's model identity."""
    settings = _settings()
    documents = as_documents(state["documents"])
    ids = _document_ids(documents)
    sections: list[Section] = []
    for doc, document_id in zip(documents, ids, strict=True):
        fmt = detect_format(doc.page_content, doc.metadata.get("source"))
        sections += split_sections(
            doc.page_content,
            document_id,
            fmt=fmt,
            max_tokens=settings.max_section_tokens,
        )
    return {
        "documents": documents,  # as Documents, also when a server sent JSON
        "started": time.time(),
        "model_key": model_identity(_model(settings)),
        "document_ids": ids,
        "sections": [s.model_dump(mode="json") for s in sections],
        # A thread may be reused for new documents: start the merged channels empty.
        "raw": Overwrite({}),
        "usage": Overwrite({}),
        "tallies": Overwrite({}),
        "removed": [],
    }


def _sections(state: ExtractionState) -> list[Section]:
    return [Section.model_validate(s) for s in state.get("sections", [])]


def _fan_out(
    state: ExtractionState,
    node: str,
    requests: Iterable[tuple[str, list[BaseMessage]]],
    otherwise: str,
) -> list[Send] | str:
    """One `Send` to `node` per (key, messages); `otherwise` when there is none."""
    settings = _settings()
    sends = [
        Send(node, _request(key, messages, state, settings))
        for key, messages in requests
    ]
    return sends or otherwise


def _domain(state: ExtractionState) -> str:
    return state.get("domain") or DEFAULT_DOMAIN


def to_spans(state: ExtractionState) -> list[Send] | str:
    """One phase-1 call per section."""
    if SPAN_DETECTION in _settings().skip_phases:
        return "plan_atomics"
    requests = (
        (f"spans:{s.section_id}", phases.span_messages(s, _domain(state)))
        for s in _sections(state)
    )
    return _fan_out(state, "detect_spans", requests, "plan_atomics")


# --- the plan nodes: validate raw outputs, fan out the next phase ---------------------


def plan_atomics(state: ExtractionState) -> dict[str, Any]:
    """Phase-1 outputs -> located spans (whole paragraphs when phase 1 is skipped)."""
    settings = _settings()
    tally: Counter[str] = Counter()
    spans: list[SpanRecord] = []
    for section in _sections(state):
        if SPAN_DETECTION in settings.skip_phases:
            spans += phases.whole_section_spans(section)
            continue
        raw = state["raw"].get(f"spans:{section.section_id}", "")
        spans += phases.read_spans(raw, section, tally)
    return {
        "spans": [s.model_dump(mode="json") for s in spans],
        "tallies": {"spans": dict(tally)},
    }


def _by_section(records: Sequence[Any]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = defaultdict(list)
    for record in records:
        grouped[record.section_id].append(record)
    return grouped


def _spans(state: ExtractionState) -> list[SpanRecord]:
    return [SpanRecord.model_validate(s) for s in state.get("spans", [])]


def to_atomics(state: ExtractionState) -> list[Send] | str:
    """One phase-2 call per section with spans."""
    if DECOMPOSITION in _settings().skip_phases:
        return "plan_rules"
    requests = (
        (f"atomics:{section_id}", phases.atomic_messages(spans, _domain(state)))
        for section_id, spans in _by_section(_spans(state)).items()
    )
    return _fan_out(state, "decompose", requests, "plan_rules")


def plan_rules(state: ExtractionState) -> dict[str, Any]:
    """Phase-2 outputs -> atomic units (spans as units when phase 2 is skipped)."""
    settings = _settings()
    tally: Counter[str] = Counter()
    atomics: list[AtomicRecord] = []
    for section_id, spans in _by_section(_spans(state)).items():
        if DECOMPOSITION in settings.skip_phases:
            atomics += [phases.atomic_from_span(s, n) for n, s in enumerate(spans, 1)]
            continue
        raw = state["raw"].get(f"atomics:{section_id}", "")
        atomics += phases.read_atomics(raw, spans, tally)
    return {
        "atomics": [a.model_dump(mode="json") for a in atomics],
        "tallies": {"atomics": dict(tally)},
    }


def _atomics(state: ExtractionState) -> list[AtomicRecord]:
    return [AtomicRecord.model_validate(a) for a in state.get("atomics", [])]


def _unit_batches(
    atomics: Sequence[AtomicRecord], size: int
) -> list[tuple[str, Sequence[AtomicRecord]]]:
    keyed = []
    for section_id, units in _by_section(atomics).items():
        for n, batch in enumerate(batches(units, size)):
            keyed.append((f"{section_id}:{n}", batch))
    return keyed


def to_rules(state: ExtractionState) -> list[Send] | str:
    """Phase-3 calls per batch of units of one section."""
    settings = _settings()
    if OPERATIONALISATION in settings.skip_phases:
        return "plan_relations"
    requests = (
        (f"rules:{key}", phases.rule_messages(batch, _domain(state)))
        for key, batch in _unit_batches(_atomics(state), settings.units_per_call)
    )
    return _fan_out(state, "operationalise", requests, "plan_relations")


def plan_relations(state: ExtractionState) -> dict[str, Any]:
    """Phase-3 outputs -> draft rules (units verbatim when phase 3 is skipped)."""
    settings = _settings()
    tally: Counter[str] = Counter()
    spans = {s.span_id: s for s in _spans(state)}
    drafts: list[DraftRule] = []
    for key, batch in _unit_batches(_atomics(state), settings.units_per_call):
        if OPERATIONALISATION in settings.skip_phases:
            drafts += [phases.draft_from_atomic(a, spans.get(a.span_id)) for a in batch]
            continue
        drafts += phases.read_rules(
            state["raw"].get(f"rules:{key}", ""), batch, spans, tally
        )
    return {
        "drafts": [d.model_dump(mode="json") for d in drafts],
        "tallies": {"rules": dict(tally)},
    }


def _drafts(state: ExtractionState) -> list[DraftRule]:
    return [DraftRule.model_validate(d) for d in state.get("drafts", [])]


def tag_groups(
    drafts: Sequence[DraftRule], limit: int
) -> list[tuple[str, list[DraftRule]]]:
    """Groups of rules sharing a tag, each small enough for one call.

    A tag with more than `limit` rules is cut into chunks of `limit // 2`, and every
    pair of chunks is one group, so every pair of rules sharing the tag meets in at
    least one call.
    """
    by_tag: dict[str, list[DraftRule]] = defaultdict(list)
    for draft in drafts:
        for tag in draft.tags:
            by_tag[tag].append(draft)
    groups = []
    for tag in sorted(by_tag):
        members = by_tag[tag]
        if len(members) < 2:  # noqa: PLR2004 - a pair needs two
            continue
        if len(members) <= limit:
            groups.append((f"{tag}:0", members))
            continue
        chunks = list(batches(members, max(1, limit // 2)))
        for n, (a, b) in enumerate(combinations(range(len(chunks)), 2)):
            groups.append((f"{tag}:{n}", [*chunks[a], *chunks[b]]))
    return groups


def shared_tag_pairs(drafts: Sequence[DraftRule]) -> int:
    """Number of distinct rule pairs that share at least one tag."""
    pairs: set[tuple[str, str]] = set()
    by_tag: dict[str, list[str]] = defaultdict(list)
    for draft in drafts:
        for tag in draft.tags:
            by_tag[tag].append(draft.draft_id)
    for members in by_tag.values():
        pairs.update(combinations(sorted(members), 2))
    return len(pairs)


def to_relations(state: ExtractionState) -> list[Send] | str:
    """Phase-4 calls per group of rules sharing a tag (never all M(M-1)/2 pairs)."""
    settings = _settings()
    if RELATIONS in settings.skip_phases:
        return "verify"
    requests = (
        (f"relations:{key}", phases.relation_messages(group, _domain(state)))
        for key, group in tag_groups(_drafts(state), settings.rules_per_comparison)
    )
    return _fan_out(state, "compare_rules", requests, "verify")


# --- phase 4 applied, phase 5 ---------------------------------------------------------


class _UnionFind:
    def __init__(self, items: Sequence[str]) -> None:
        self.parent = {item: item for item in items}
        self.order = {item: i for i, item in enumerate(items)}

    def find(self, item: str) -> str:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: str, b: str) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a == root_b:
            return
        # The rule that comes first in the documents represents the merged group.
        if self.order[root_b] < self.order[root_a]:
            root_a, root_b = root_b, root_a
        self.parent[root_b] = root_a


def _merge_duplicates(
    drafts: list[DraftRule], relations: list[RelationRecord]
) -> tuple[list[dict[str, Any]], int]:
    """Merge duplicate groups; keep other relations between the survivors."""
    forest = _UnionFind([d.draft_id for d in drafts])
    merges = 0
    for rel in relations:
        if rel.relationship == "duplicate" or rel.preferred_action == "merge":
            if forest.find(rel.rule_i) != forest.find(rel.rule_j):
                merges += 1
            forest.union(rel.rule_i, rel.rule_j)
    members: dict[str, list[DraftRule]] = defaultdict(list)
    for draft in drafts:
        members[forest.find(draft.draft_id)].append(draft)
    links: dict[str, dict[tuple[str, str], dict[str, Any]]] = defaultdict(dict)
    for rel in relations:
        a, b = forest.find(rel.rule_i), forest.find(rel.rule_j)
        if a == b:
            continue
        for here, there in ((a, b), (b, a)):
            links[here].setdefault(
                (rel.relationship, there),
                {
                    "relationship": rel.relationship,
                    "other": there,
                    "preferred_action": rel.preferred_action,
                    "explanation": rel.explanation,
                },
            )
    merged = []
    for root, group in members.items():
        head = group[0]
        tags = tuple(dict.fromkeys(t for d in group for t in d.tags))[: phases.MAX_TAGS]
        merged.append(
            {
                **head.model_dump(mode="json"),
                "tags": list(tags),
                "span_ids": list(dict.fromkeys(s for d in group for s in d.span_ids)),
                "atomic_ids": list(
                    dict.fromkeys(a for d in group for a in d.atomic_ids)
                ),
                "merged": [d.draft_id for d in group[1:]],
                "links": list(links[root].values()),
            }
        )
    return merged, merges


def _documents_text(state: ExtractionState) -> dict[str, str]:
    return {
        document_id: doc.page_content
        for document_id, doc in zip(
            state["document_ids"], state["documents"], strict=True
        )
    }


@functools.lru_cache(maxsize=256)
def _checker(
    document: str, mode: FaithfulnessMode, threshold: float
) -> FaithfulnessChecker:
    return FaithfulnessChecker(document, mode=mode, threshold=threshold)


def _span_sections(state: ExtractionState) -> dict[str, Section]:
    sections = {s.section_id: s for s in _sections(state)}
    return {span.span_id: sections[span.section_id] for span in _spans(state)}


def _own_regions(
    rule: Mapping[str, Any],
    span_sections: Mapping[str, Section],
) -> list[tuple[str, int, int]]:
    """The sections a rule came from: where its source text must be found."""
    sections = {
        span_sections[s].section_id: span_sections[s]
        for s in rule["span_ids"]
        if s in span_sections
    }
    return [(s.document_id, s.start, s.end) for s in sections.values()]


def _faithful(
    rules: Sequence[dict[str, Any]],
    texts: Mapping[str, str],
    span_sections: Mapping[str, Section],
    settings: ExtractionSettings,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Keep the rules whose source text is in (or close to) their own sections.

    Searching only the rule's sections, not the whole document, gives a repeated
    sentence its own offsets and rejects a source quoted from somewhere else.
    """
    kept, removed = [], []
    for rule in rules:
        best = None
        for document_id, start, end in _own_regions(rule, span_sections):
            checker = _checker(
                texts[document_id][start:end],
                settings.faithfulness_mode,
                settings.faithfulness_threshold,
            )
            result = checker.check(rule["source_text"])
            if best is None or result.score > best[1].score:
                best = (document_id, result, start)
            if result.faithful:
                break
        if best is not None and best[1].faithful:
            document_id, result, offset = best
            begin = offset + (result.start or 0)
            end = min(begin + len(rule["source_text"]), len(texts[document_id]))
            kept.append({**rule, "document_id": document_id, "source": [begin, end]})
        else:
            removed.append(
                {
                    "draft_id": rule["draft_id"],
                    "name": rule["name"],
                    "source_text": rule["source_text"][:200],
                    "best_ratio": 0.0 if best is None else round(best[1].score, 3),
                }
            )
    return kept, removed


def _uncovered(
    rules: Sequence[dict[str, Any]], spans: Sequence[SpanRecord], min_overlap: float
) -> list[SpanRecord]:
    """Spans no surviving rule's source covers, per document.

    A rule covers where its source text was found, and the spans of its lineage (in
    their own documents): a merged duplicate's span is covered by the rule it was
    merged into.
    """
    located: dict[str, list[tuple[int, int]]] = defaultdict(list)
    by_id = {s.span_id: s for s in spans}
    for rule in rules:
        if rule.get("source") is not None:
            begin, end = rule["source"]
            located[rule["document_id"]].append((begin, end))
        for span_id in rule["span_ids"]:
            if span_id in by_id:
                span = by_id[span_id]
                located[span.document_id].append((span.start, span.end))
    missing = []
    for document_id, doc_spans in _group_by_document(spans).items():
        indices = coverage(
            [(s.start, s.end) for s in doc_spans],
            located.get(document_id, []),
            min_overlap=min_overlap,
        )
        missing += [doc_spans[i] for i in indices]
    return missing


def _group_by_document(spans: Sequence[SpanRecord]) -> dict[str, list[SpanRecord]]:
    grouped: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        grouped[span.document_id].append(span)
    return grouped


def verify(state: ExtractionState) -> dict[str, Any]:
    """Apply phase 4 (merge duplicates, record relations), then phase-5 checks."""
    settings = _settings()
    drafts = _drafts(state)
    tally: Counter[str] = Counter()
    relations: list[RelationRecord] = []
    for key, group in tag_groups(drafts, settings.rules_per_comparison):
        raw = state["raw"].get(f"relations:{key}")
        if raw is not None:
            relations += phases.read_relations(raw, group, tally)
    merged, merges = _merge_duplicates(drafts, relations)
    tallies: dict[str, dict[str, int]] = {
        "relations": {**tally, "duplicates_merged": merges}
    }
    if VERIFICATION in settings.skip_phases:
        return {"verified": merged, "uncovered": [], "tallies": tallies}
    kept, removed = _faithful(
        merged, _documents_text(state), _span_sections(state), settings
    )
    uncovered = _uncovered(kept, _spans(state), settings.min_coverage_overlap)
    tallies["verify"] = {"unfaithful_removed": len(removed)}
    return {
        "removed": removed,
        "verified": kept,
        "uncovered": [s.model_dump(mode="json") for s in uncovered],
        "tallies": tallies,
    }


def _recovery_batches(state: ExtractionState) -> list[tuple[str, list[AtomicRecord]]]:
    uncovered = [SpanRecord.model_validate(s) for s in state.get("uncovered", [])]
    return [
        (section_id, [phases.atomic_from_span(s, n) for n, s in enumerate(spans, 1)])
        for section_id, spans in _by_section(uncovered).items()
    ]


def to_recovery(state: ExtractionState) -> list[Send] | str:
    """Uncovered spans go back through phase 3 once."""
    skipped = _settings().skip_phases
    if OPERATIONALISATION in skipped or VERIFICATION in skipped:
        return "finalize"
    requests = (
        (f"recover:{section_id}", phases.rule_messages(batch, _domain(state)))
        for section_id, batch in _recovery_batches(state)
    )
    return _fan_out(state, "recover_rules", requests, "finalize")


# --- finalize ---------------------------------------------------------------------


def _rule_ids(rules: Sequence[dict[str, Any]]) -> dict[str, str]:
    ids: dict[str, str] = {}
    used: set[str] = set()
    for rule in rules:
        digest = hashlib.sha256(
            json.dumps(
                [rule["document_id"], rule["condition"], rule["action"]]
            ).encode()
        ).hexdigest()[:8]
        candidate, n = f"{slug(rule['document_id'], 'rule', 24)}-{digest}", 1
        while candidate in used:
            n += 1
            candidate = f"{slug(rule['document_id'], 'rule', 24)}-{digest}-{n}"
        used.add(candidate)
        ids[rule["draft_id"]] = candidate
    return ids


def _to_rule(
    rule: dict[str, Any],
    ids: Mapping[str, str],
    spans: Mapping[str, SpanRecord],
) -> Rule:
    # Verified rules carry where their source was found; unverified ones (phase 5
    # skipped) point at the span they were extracted from.
    first_span = spans.get(rule["span_ids"][0]) if rule["span_ids"] else None
    if rule.get("source") is not None:
        begin, end = rule["source"]
        source = SourceSpan(document_id=rule["document_id"], start=begin, end=end)
    elif first_span is not None:
        source = SourceSpan(
            document_id=first_span.document_id,
            start=first_span.start,
            end=first_span.end,
        )
    else:
        source = None
    relations = tuple(
        RuleRelation(
            relationship=link["relationship"],
            other_rule_id=ids[link["other"]],
            preferred_action=link["preferred_action"],
            explanation=link["explanation"],
        )
        for link in rule.get("links", [])
        if link["other"] in ids
    )
    return Rule(
        rule_id=ids[rule["draft_id"]],
        name=rule["name"],
        condition=rule["condition"],
        action=rule["action"],
        source_text=rule["source_text"],
        tags=tuple(rule["tags"]),
        source=source,
        lineage=RuleLineage(
            span_ids=tuple(rule["span_ids"]),
            atomic_ids=tuple(rule["atomic_ids"]),
            normative_type=rule.get("normative_type"),
            merged_rule_ids=tuple(rule.get("merged", [])),
        ),
        relations=relations,
    )


def finalize(state: ExtractionState) -> dict[str, Any]:
    """Verify recovered rules, measure coverage and independence, build the rulebook."""
    settings = _settings()
    spans = _spans(state)
    by_span = {s.span_id: s for s in spans}
    tally: Counter[str] = Counter()
    recovered: list[dict[str, Any]] = []
    for section_id, batch in _recovery_batches(state):
        raw = state["raw"].get(f"recover:{section_id}", "")
        drafts = phases.read_rules(raw, batch, by_span, tally)
        recovered += [
            {
                **d.model_dump(mode="json"),
                "draft_id": f"{d.draft_id}/recovered",
                "merged": [],
                "links": [],
            }
            for d in drafts
        ]
    rules = list(state.get("verified", []))
    removed = list(state.get("removed", []))
    still_uncovered: list[SpanRecord] = []
    if VERIFICATION not in settings.skip_phases:
        kept, lost = _faithful(
            recovered, _documents_text(state), _span_sections(state), settings
        )
        rules += kept
        removed += lost
        tally["recovered_faithful"] = len(kept)
        still_uncovered = _uncovered(rules, spans, settings.min_coverage_overlap)
    ids = _rule_ids(rules)
    final = [_to_rule(rule, ids, by_span) for rule in rules]
    names = independence([r.name for r in final])
    report = _report(state, settings, final, removed, recovered, still_uncovered, tally)
    report = report.model_copy(
        update={"independence": names.ratio, "shared_names": dict(names.shared_names)}
    )
    documents = [
        SourceDocument.from_text(
            document_id, doc.page_content, source=doc.metadata.get("source")
        )
        for document_id, doc in zip(
            state["document_ids"], state["documents"], strict=True
        )
    ]
    rulebook = {
        "format_version": FORMAT_VERSION,
        "domain": _domain(state),
        "rules": [r.model_dump(mode="json") for r in final],
        "documents": [d.model_dump(mode="json") for d in documents],
        "diagnostics": report.model_dump(mode="json"),
    }
    return {"rulebook": rulebook, "report": report.model_dump(mode="json")}


def _report(
    state: ExtractionState,
    settings: ExtractionSettings,
    final: Sequence[Rule],
    removed: list[dict[str, Any]],
    recovered: Sequence[dict[str, Any]],
    still_uncovered: Sequence[SpanRecord],
    recovery_tally: Counter[str],
) -> ExtractionReport:
    tallies = {**state.get("tallies", {}), "recovery": dict(recovery_tally)}
    drafts = _drafts(state)
    calls: Counter[str] = Counter()
    stored: Counter[str] = Counter()
    tokens: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for key, (tokens_in, tokens_out, called) in state.get("usage", {}).items():
        phase = LLM_NODES_BY_PREFIX[key.split(":", 1)[0]]
        calls[phase] += called
        stored[phase] += 1 - called
        tokens[phase][0] += tokens_in
        tokens[phase][1] += tokens_out
    numbers = {name: number for number, name in PHASE_NAMES.items()}
    numbers["recovery"] = VERIFICATION
    phase_reports = {}
    for name in ("spans", "atomics", "rules", "relations", "recovery", "verify"):
        counts = dict(tallies.get(name, {}))
        items_out = counts.pop("kept", 0)
        phase_reports[name] = PhaseReport(
            calls=calls[name],
            stored_answers=stored[name],
            input_tokens=tokens[name][0],
            output_tokens=tokens[name][1],
            items_out=len(final) if name == "verify" else items_out,
            problems={k: v for k, v in counts.items() if v},
            skipped=numbers[name] in settings.skip_phases,
        )
    relation_counts = Counter(
        link["relationship"]
        for rule in state.get("verified", [])
        for link in rule["links"]
    )
    uncovered_before = len(state.get("uncovered", []))
    return ExtractionReport(
        domain=_domain(state),
        documents=len(state["documents"]),
        sections=len(state.get("sections", [])),
        phases=phase_reports,
        pairs_compared=0
        if RELATIONS in settings.skip_phases
        else shared_tag_pairs(drafts),
        pairs_possible=len(drafts) * (len(drafts) - 1) // 2,
        duplicates_merged=tallies.get("relations", {}).get("duplicates_merged", 0),
        relations={k: v // 2 for k, v in relation_counts.items()},
        faithfulness_mode=(
            "skipped"
            if VERIFICATION in settings.skip_phases
            else settings.faithfulness_mode
        ),
        faithful=len(final),
        unfaithful_removed=removed,
        coverage_spans=len(state.get("spans", [])),
        uncovered_before_recovery=uncovered_before,
        recovered_rules=len(recovered),
        uncovered_after_recovery=[s.span_id for s in still_uncovered],
        independence=1.0,
        shared_names={},
        rules=len(final),
        seconds=time.time() - state.get("started", time.time()),
    )


# --- the graph ---------------------------------------------------------------------


def build_extraction_graph(
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    retry: CallRetry | None = None,
) -> CompiledStateGraph[
    ExtractionState, ExtractionSettings, ExtractionInput, ExtractionOutput
]:
    """Compile the five-phase extraction graph.

    Args:
        checkpointer: Makes runs resumable (e.g. `SqliteSaver`); None for none.
        retry: Backoff for transient model errors on the LLM nodes.
    """
    node_retry = (retry or CallRetry()).as_node_policy()
    builder = StateGraph(
        ExtractionState,
        context_schema=ExtractionSettings,
        input_schema=ExtractionInput,
        output_schema=ExtractionOutput,
    )
    builder.add_node("prepare", prepare)
    for name in LLM_NODES:
        builder.add_node(
            name,
            RunnableLambda(_call, afunc=_acall, name=name),
            retry_policy=node_retry,
            input_schema=ModelRequest,
        )
    builder.add_node("plan_atomics", plan_atomics)
    builder.add_node("plan_rules", plan_rules)
    builder.add_node("plan_relations", plan_relations)
    builder.add_node("verify", verify)
    builder.add_node("finalize", finalize)

    builder.add_edge(START, "prepare")
    builder.add_conditional_edges("prepare", to_spans, ["detect_spans", "plan_atomics"])
    builder.add_edge("detect_spans", "plan_atomics")
    builder.add_conditional_edges(
        "plan_atomics", to_atomics, ["decompose", "plan_rules"]
    )
    builder.add_edge("decompose", "plan_rules")
    builder.add_conditional_edges(
        "plan_rules", to_rules, ["operationalise", "plan_relations"]
    )
    builder.add_edge("operationalise", "plan_relations")
    builder.add_conditional_edges(
        "plan_relations", to_relations, ["compare_rules", "verify"]
    )
    builder.add_edge("compare_rules", "verify")
    builder.add_conditional_edges("verify", to_recovery, ["recover_rules", "finalize"])
    builder.add_edge("recover_rules", "finalize")
    builder.add_edge("finalize", END)
    return builder.compile(checkpointer=checkpointer, name="tag_extraction")
