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
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Annotated, Any, Literal, NamedTuple, TypeVar, get_args

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.stores import BaseStore
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import get_runtime
from langgraph.types import Overwrite, Send
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import SkipJsonSchema
from typing_extensions import NotRequired, TypedDict

from langchain_tag._graph import as_documents, coerce_context
from langchain_tag._text import batches, slug
from langchain_tag.extraction import phases, prompts
from langchain_tag.extraction._flags import flag_rules
from langchain_tag.extraction.documents import (
    document_sections,
    page_starts_of,
    pages_of,
)
from langchain_tag.extraction.pairs import (
    DEFAULT_MAX_PAIRS,
    ComparisonPlan,
    plan_comparisons,
)
from langchain_tag.extraction.phases import (
    AtomicRecord,
    DraftRule,
    RelationRecord,
    SpanRecord,
)
from langchain_tag.extraction.report import ExtractionReport, PhaseReport
from langchain_tag.extraction.sectioning import Section
from langchain_tag.extraction.verification import (
    FaithfulnessChecker,
    FaithfulnessMode,
    coverage,
    independence,
    locate_span,
)
from langchain_tag.models import (
    CallRetry,
    default_chat_model,
    model_identity,
    with_settings,
)
from langchain_tag.rule_schemas import CONDITION_SCHEMA, RuleSchema, rule_schema
from langchain_tag.rules import (
    FORMAT_VERSION,
    Rule,
    RuleLineage,
    RuleRelation,
    SourceDocument,
    SourceSpan,
)

_T = TypeVar("_T")
_R = TypeVar("_R", bound=BaseModel)

SPAN_DETECTION, DECOMPOSITION, OPERATIONALISATION, RELATIONS, VERIFICATION = range(1, 6)
REPORT_ROWS = {
    "spans": SPAN_DETECTION,
    "atomics": DECOMPOSITION,
    "rules": OPERATIONALISATION,
    "relations": RELATIONS,
    "recovery": VERIFICATION,
    "verify": VERIFICATION,
}
"""The report's rows, in order, each with the phase whose skipping it reports."""
INVOCATION_KEY = "tag_extraction_call"
"""`configurable` key naming one `extract_rules` call. LLM nodes record it with each
call, so the report of a resumed run counts the calls made before it as reused."""

MergePolicy = Literal["duplicates", "preferred"]
"""Which phase-4 pairs are merged into one rule (`ExtractionSettings.merge`).

- "duplicates" (the method): only pairs judged `duplicate` (same condition and
  action); duplicates of duplicates join one group, since sameness is transitive.
- "preferred": also any pair the model gave `preferred_action: "merge"`, whatever
  its relationship (subsumption, overlap, ...), joined transitively too, so a chain
  of overlapping rules can collapse into one. The behaviour before this setting.
"""


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
    max_pairs: int | None = DEFAULT_MAX_PAIRS
    """Phase 4 compares at most this many rule pairs sharing a tag; over it, the
    most similar are kept and the report counts the rest as skipped. None: every
    pair sharing a tag, which grows with the square of the rules. See
    `pairs.DEFAULT_MAX_PAIRS` for the default."""
    faithfulness_mode: FaithfulnessMode = "corrected"
    faithfulness_threshold: float = 0.85
    min_coverage_overlap: float = 0.5
    rule_schema: RuleSchema | str = CONDITION_SCHEMA
    """What phase 3 writes of each rule: a `RuleSchema`, or a built-in's name
    ("condition", the default; "nba") or a JSON Schema file (`rule_schema`)."""
    merge: MergePolicy = "duplicates"
    """Which phase-4 pairs become one rule. "duplicates" (default, the method):
    only pairs judged `duplicate`. "preferred": also pairs of any relationship
    whose `preferred_action` is "merge" (the behaviour before this setting). Pairs
    not merged keep their relation on both rules. See `MergePolicy`."""
    answers: SkipJsonSchema[BaseStore[str, str] | None] = None
    """Model answers kept by prompt. A SQLite store makes each answer durable the
    moment it arrives: a killed run resumes without asking again, and a re-run after
    an edit only sends the changed sections' prompts."""

    def __post_init__(self) -> None:
        """Accept any collection of phase numbers (JSON sends a list).

        Raises:
            ValueError: `skip_phases` holds a number outside 1-5, `merge` is not a
                `MergePolicy`, or `max_pairs` is not a positive integer or None.
            RuleSchemaError: `rule_schema` names no built-in schema or readable
                schema file.
        """
        object.__setattr__(self, "skip_phases", frozenset(self.skip_phases))
        if not self.skip_phases <= {1, 2, 3, 4, 5}:
            found = sorted(self.skip_phases)
            msg = f"skip_phases takes phase numbers 1-5, got {found}."
            raise ValueError(msg)
        object.__setattr__(self, "rule_schema", rule_schema(self.rule_schema))
        if self.merge not in get_args(MergePolicy):
            choices = ", ".join(map(repr, get_args(MergePolicy)))
            msg = f"merge must be one of {choices}, got {self.merge!r}."
            raise ValueError(msg)
        cap = self.max_pairs
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int) or cap < 1
        ):
            msg = f"max_pairs must be an integer >= 1 (None: no cap), got {cap!r}."
            raise ValueError(msg)

    @property
    def schema(self) -> RuleSchema:
        """`rule_schema` as a `RuleSchema` (names and files are read on creation)."""
        return rule_schema(self.rule_schema)

    def key(self) -> str:
        """What, besides the prompt, decides an LLM node's output (for its cache).

        Settings applied after the answers (`merge`, the phase-5 thresholds) are not
        in it, so a run with other values reuses every stored answer; `run_id_for`
        includes them, so such a run is never mistaken for a finished one.
        """
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
    usage: Annotated[dict[str, list[Any]], _merge]
    """Request key -> [input tokens, output tokens, `INVOCATION_KEY` of the call that
    made it, or None when the answer came from the answer store]."""
    tallies: Annotated[dict[str, dict[str, int]], _merge]
    removed: list[dict[str, Any]]
    spans: list[dict[str, Any]]
    atomics: list[dict[str, Any]]
    drafts: list[dict[str, Any]]
    comparisons: dict[str, Any]
    """Phase 4's `ComparisonPlan`: its groups and the pairs they compare."""
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
    # Every extraction call: temperature 0, top_p 1, at most 4096 output tokens;
    # the nodes' retry policy is the one retry layer, so the client's is off.
    model, _ = with_settings(
        settings.llm or _environment_model(),
        temperature=0.0,
        top_p=1.0,
        max_tokens=4096,
        max_retries=0,
    )
    return model


def _request(
    phase: _LLMPhase, key: str, batch: Any, state: ExtractionState
) -> ModelRequest:
    messages = phase.messages(batch, _domain(state), _settings().schema)
    system, user = (str(m.content) for m in messages)
    payload = json.dumps([state["model_key"], _settings().key(), system, user])
    return {
        "key": f"{phase.prefix}:{key}",
        "system": system,
        "user": user,
        "cache_key": hashlib.sha256(payload.encode()).hexdigest(),
    }


def _invocation(config: RunnableConfig) -> str:
    # "" when run by a LangGraph server, which sets no key: all calls count as made.
    return str(config.get("configurable", {}).get(INVOCATION_KEY, ""))


def _answered(
    request: ModelRequest, text: str, config: RunnableConfig, answer: Any = None
) -> dict[str, Any]:
    """The node's writes; `answer` is the model's message, None for a stored answer."""
    usage = getattr(answer, "usage_metadata", None) or {}
    made_by = None if answer is None else _invocation(config)
    tokens = [usage.get("input_tokens", 0), usage.get("output_tokens", 0)]
    return {
        "raw": {request["key"]: text},
        "usage": {request["key"]: [*tokens, made_by]},
    }


# --- the LLM nodes (raw text only) ----------------------------------------------------


def _storable(request: ModelRequest, text: str) -> bool:
    # An unreadable answer (empty, cut off, a refusal) is not kept, so the next run
    # asks again instead of losing the same section's rules for good.
    return phases.readable(text, _phase_of(request["key"]).answer_list)


# The answer is stored before the node returns: LangGraph saves a finished task's
# writes only when its thread pool gets to it, which can be after a crash.
def _call(request: ModelRequest, config: RunnableConfig) -> dict[str, Any]:
    settings = _settings()
    store, key = settings.answers, request["cache_key"]
    if store is not None and (stored := store.mget([key])[0]) is not None:
        return _answered(request, stored, config)
    messages = [SystemMessage(request["system"]), HumanMessage(request["user"])]
    answer = _model(settings).invoke(messages, config)
    if store is not None and _storable(request, answer.text):
        store.mset([(key, answer.text)])
    return _answered(request, answer.text, config, answer)


async def _acall(request: ModelRequest, config: RunnableConfig) -> dict[str, Any]:
    settings = _settings()
    store, key = settings.answers, request["cache_key"]
    if store is not None and (stored := (await store.amget([key]))[0]) is not None:
        return _answered(request, stored, config)
    messages = [SystemMessage(request["system"]), HumanMessage(request["user"])]
    answer = await _model(settings).ainvoke(messages, config)
    if store is not None and _storable(request, answer.text):
        await store.amset([(key, answer.text)])
    return _answered(request, answer.text, config, answer)


# --- prepare -----------------------------------------------------------------------


def _unique(base: str, taken: Container[str]) -> str:
    """`base`, or else the first of `base-2`, `base-3`, ... not taken."""
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _document_ids(documents: Sequence[Document]) -> list[str]:
    ids: list[str] = []
    for position, doc in enumerate(documents, 1):
        source = doc.metadata.get("source")
        name = str(source).rsplit("/", 1)[-1] if source else ""
        stem = re.sub(r"\.[^./]+$", "", name)
        ids.append(_unique(doc.id or stem or f"document-{position}", ids))
    return ids


def source_documents(documents: Sequence[Document]) -> list[SourceDocument]:
    """The documents as a rulebook extracted from them records them.

    A document's id is its `Document.id`, else its source's file name without the
    suffix, else `document-<position>`; a repeated id gets `-2`, `-3`, ...
    """
    return [
        SourceDocument.from_text(
            document_id, doc.page_content, source=doc.metadata.get("source")
        )
        for document_id, doc in zip(_document_ids(documents), documents, strict=True)
    ]


def prepare(state: ExtractionState) -> dict[str, Any]:
    """Split every document into sections and fix the run's model identity."""
    settings = _settings()
    documents = as_documents(state["documents"])
    ids = _document_ids(documents)
    sections: list[Section] = []
    for doc, document_id in zip(documents, ids, strict=True):
        sections += document_sections(
            doc, document_id, max_tokens=settings.max_section_tokens
        )
    return {
        "documents": documents,  # as Documents, also when a server sent JSON
        "started": time.time(),
        "model_key": model_identity(_model(settings)),
        "document_ids": ids,
        "sections": _dump(sections),
        # A thread may be reused for new documents: start the merged channels empty.
        "raw": Overwrite({}),
        "usage": Overwrite({}),
        "tallies": Overwrite({}),
        "removed": [],
    }


def _sections(state: ExtractionState) -> list[Section]:
    return [Section.model_validate(s) for s in state.get("sections", [])]


def _spans(state: ExtractionState) -> list[SpanRecord]:
    return [SpanRecord.model_validate(s) for s in state.get("spans", [])]


def _atomics(state: ExtractionState) -> list[AtomicRecord]:
    return [AtomicRecord.model_validate(a) for a in state.get("atomics", [])]


def _drafts(state: ExtractionState) -> list[DraftRule]:
    return [DraftRule.model_validate(d) for d in state.get("drafts", [])]


def _domain(state: ExtractionState) -> str:
    return state.get("domain") or DEFAULT_DOMAIN


def _by(field: str, records: Iterable[_T]) -> dict[str, list[_T]]:
    """Records grouped by the value of one of their fields, in order."""
    grouped: dict[str, list[_T]] = defaultdict(list)
    for record in records:
        grouped[getattr(record, field)].append(record)
    return grouped


def _as_units(spans: Sequence[SpanRecord]) -> list[AtomicRecord]:
    return [phases.atomic_from_span(s, n) for n, s in enumerate(spans, 1)]


# --- the LLM phases: their batches, and the edges that fan them out -------------------


def _unit_batches(
    state: ExtractionState, settings: ExtractionSettings
) -> list[tuple[str, Sequence[AtomicRecord]]]:
    return [
        (f"{section_id}:{n}", batch)
        for section_id, units in _by("section_id", _atomics(state)).items()
        for n, batch in enumerate(batches(units, settings.units_per_call))
    ]


def _comparisons(state: ExtractionState) -> ComparisonPlan:
    return ComparisonPlan.model_validate(state.get("comparisons", {}))


def _relation_batches(
    state: ExtractionState, _: ExtractionSettings
) -> list[tuple[str, list[DraftRule]]]:
    """Phase 4's groups, as `plan_relations` planned them (`plan_comparisons`)."""
    by_id = {d.draft_id: d for d in _drafts(state)}
    return [(key, [by_id[i] for i in ids]) for key, ids in _comparisons(state).groups]


def _recovery_batches(
    state: ExtractionState, _: ExtractionSettings
) -> list[tuple[str, list[AtomicRecord]]]:
    uncovered = [SpanRecord.model_validate(s) for s in state.get("uncovered", [])]
    return [
        (key, _as_units(spans)) for key, spans in _by("section_id", uncovered).items()
    ]


class _LLMPhase(NamedTuple):
    """An LLM phase: its node, its batches and their prompt, how it is reported."""

    prefix: str  # request keys are "<prefix>:<batch key>"
    node: str
    row: str  # the report row its calls count under
    answer_list: str  # what its answer must hold to be kept in the answer store
    skipped_with: tuple[int, ...]
    batches: Callable[[ExtractionState, ExtractionSettings], Iterable[tuple[str, Any]]]
    messages: Callable[[Any, str, RuleSchema], list[BaseMessage]]

    def skipped(self, settings: ExtractionSettings) -> bool:
        return not settings.skip_phases.isdisjoint(self.skipped_with)


# In graph order: each phase runs between two of `_STEPS` (see the graph below).
_SPANS, _ATOMICS, _RULES, _RELATIONS, _RECOVER = _LLM_PHASES = (
    _LLMPhase(
        prefix="spans",  # one call per section
        node="detect_spans",
        row="spans",
        answer_list="spans",
        skipped_with=(SPAN_DETECTION,),
        batches=lambda state, _: [(s.section_id, s) for s in _sections(state)],
        messages=lambda section, domain, _: phases.span_messages(section, domain),
    ),
    _LLMPhase(
        prefix="atomics",  # one call per section with spans
        node="decompose",
        row="atomics",
        answer_list="atomic_units",
        skipped_with=(DECOMPOSITION,),
        batches=lambda state, _: _by("section_id", _spans(state)).items(),
        messages=lambda spans, domain, _: phases.atomic_messages(spans, domain),
    ),
    _LLMPhase(
        prefix="rules",  # calls per batch of units of one section
        node="operationalise",
        row="rules",
        answer_list="rules",
        skipped_with=(OPERATIONALISATION,),
        batches=_unit_batches,
        messages=phases.rule_messages,
    ),
    _LLMPhase(
        prefix="relations",  # calls per group sharing a tag, max_pairs pairs at most
        node="compare_rules",
        row="relations",
        answer_list="relations",
        skipped_with=(RELATIONS,),
        batches=_relation_batches,
        messages=lambda rules, domain, _: phases.relation_messages(rules, domain),
    ),
    _LLMPhase(
        prefix="recover",  # uncovered spans go back through phase 3 once
        node="recover_rules",
        row="recovery",
        answer_list="rules",
        skipped_with=(OPERATIONALISATION, VERIFICATION),
        batches=_recovery_batches,
        messages=phases.rule_messages,
    ),
)


def _phase_of(request_key: str) -> _LLMPhase:
    prefix = request_key.split(":", 1)[0]
    return next(phase for phase in _LLM_PHASES if phase.prefix == prefix)


def _router(
    phase: _LLMPhase, then: str
) -> Callable[[ExtractionState], list[Send] | str]:
    """The edge into a phase: a `Send` per batch, else (or if skipped) on to `then`."""

    def route(state: ExtractionState) -> list[Send] | str:
        settings = _settings()
        if phase.skipped(settings):
            return then
        sends = [
            Send(phase.node, _request(phase, key, batch, state))
            for key, batch in phase.batches(state, settings)
        ]
        return sends or then

    route.__name__ = f"to_{phase.row}"  # how traces name the edge
    return route


# --- the plan nodes: validate raw outputs, fan out the next phase ---------------------


def _read(
    state: ExtractionState,
    phase: _LLMPhase,
    read: Callable[[str, Any, Counter[str]], Sequence[_R]],
    stand_in: Callable[[Any], Sequence[_R]] = lambda _: (),
) -> tuple[list[_R], Counter[str]]:
    """Each batch's answer read, and the tally of kept items and problems.

    A skipped phase has no answers: `stand_in` makes each batch's records instead.
    """
    settings = _settings()
    tally: Counter[str] = Counter()
    records: list[_R] = []
    for key, batch in phase.batches(state, settings):
        if phase.skipped(settings):
            records += stand_in(batch)
            continue
        found = read(state["raw"].get(f"{phase.prefix}:{key}", ""), batch, tally)
        tally["kept"] += len(found)
        records += found
    return records, tally


def _dump(records: Iterable[BaseModel]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in records]


def plan_atomics(state: ExtractionState) -> dict[str, Any]:
    """Phase-1 outputs -> located spans (whole paragraphs when phase 1 is skipped)."""
    spans, tally = _read(state, _SPANS, phases.read_spans, phases.whole_section_spans)
    return {"spans": _dump(spans), "tallies": {"spans": dict(tally)}}


def plan_rules(state: ExtractionState) -> dict[str, Any]:
    """Phase-2 outputs -> atomic units (spans as units when phase 2 is skipped)."""
    atomics, tally = _read(state, _ATOMICS, phases.read_atomics, _as_units)
    return {"atomics": _dump(atomics), "tallies": {"atomics": dict(tally)}}


def plan_relations(state: ExtractionState) -> dict[str, Any]:
    """Phase-3 outputs -> draft rules (units verbatim when phase 3 is skipped).

    And phase 4's groups, planned once here (`plan_comparisons`), checkpointed with
    the drafts: choosing pairs over the cap scores every candidate pair.
    """
    settings = _settings()
    spans = {s.span_id: s for s in _spans(state)}
    drafts, tally = _read(
        state,
        _RULES,
        lambda raw, units, tally: phases.read_rules(
            raw, units, spans, tally, settings.schema
        ),
        lambda units: [
            phases.draft_from_atomic(a, spans.get(a.span_id)) for a in units
        ],
    )
    comparisons = (
        ComparisonPlan()
        if _RELATIONS.skipped(settings)
        else plan_comparisons(drafts, settings.rules_per_comparison, settings.max_pairs)
    )
    return {
        "drafts": _dump(drafts),
        "comparisons": comparisons.model_dump(mode="json"),
        "tallies": {"rules": dict(tally)},
    }


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


def _joined(group: Sequence[DraftRule], field: str) -> list[str]:
    """A tuple field of the drafts, joined: each value once, in order."""
    return list(dict.fromkeys(x for d in group for x in getattr(d, field)))


def _merges(rel: RelationRecord, policy: MergePolicy) -> bool:
    """Whether the pair `rel` describes is merged under `policy`."""
    if rel.relationship == "duplicate":
        return True
    return policy == "preferred" and rel.preferred_action == "merge"


def _merge_duplicates(
    drafts: list[DraftRule],
    relations: list[RelationRecord],
    policy: MergePolicy = "duplicates",
) -> tuple[list[dict[str, Any]], int]:
    """Merge the groups `policy` joins; keep other relations between the survivors.

    Merged pairs are joined transitively (a union of groups); the group's first
    draft in document order represents it. Every relation between two rules that
    stay apart is recorded on both of them.

    Returns:
        The rules (as dicts with `merged` and `links`), and the number of merges.
    """
    forest = _UnionFind([d.draft_id for d in drafts])
    merges = 0
    for rel in relations:
        if _merges(rel, policy):
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
            link = rel.model_dump(exclude={"rule_i", "rule_j"}) | {"other": there}
            links[here].setdefault((rel.relationship, there), link)
    merged = []
    for root, group in members.items():
        merged.append(
            {
                **group[0].model_dump(mode="json"),
                "tags": _joined(group, "tags")[: phases.MAX_TAGS],
                "span_ids": _joined(group, "span_ids"),
                "atomic_ids": _joined(group, "atomic_ids"),
                "merged": [d.draft_id for d in group[1:]],
                "links": list(links[root].values()),
            }
        )
    return merged, merges


@functools.lru_cache(maxsize=256)
def _checker(
    document: str, mode: FaithfulnessMode, threshold: float
) -> FaithfulnessChecker:
    return FaithfulnessChecker(document, mode=mode, threshold=threshold)


def _own_regions(
    rule: Mapping[str, Any], span_sections: Mapping[str, Section]
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
    state: ExtractionState,
    settings: ExtractionSettings,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Keep the rules whose source text is in (or close to) their own sections.

    Searching only the rule's sections, not the whole document, gives a repeated
    sentence its own offsets and rejects a source quoted from somewhere else. A
    source found once whitespace and quote marks are normalised (a wrapped line
    quoted with a space) becomes the document's text there, so it stays verbatim.
    """
    contents = (d.page_content for d in state["documents"])
    texts = dict(zip(state["document_ids"], contents, strict=True))
    sections = {s.section_id: s for s in _sections(state)}
    span_sections = {span.span_id: sections[span.section_id] for span in _spans(state)}
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
                best = (document_id, result, start, checker.document)
            if result.faithful:
                break
        if best is not None and best[1].faithful:
            document_id, result, offset, region = best
            found = None if result.exact else locate_span(rule["source_text"], region)
            if found is None:  # exact, or only close: the quote as the model wrote it
                quote, begin = rule["source_text"], offset + (result.start or 0)
            else:
                quote, begin = region[found[0] : found[1]], offset + found[0]
            end = min(begin + len(quote), len(texts[document_id]))
            kept.append(
                {
                    **rule,
                    "source_text": quote,
                    "document_id": document_id,
                    "source": [begin, end],
                }
            )
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
        for span in (by_id[s] for s in rule["span_ids"] if s in by_id):
            located[span.document_id].append((span.start, span.end))
    missing = []
    for document_id, doc_spans in _by("document_id", spans).items():
        indices = coverage(
            [(s.start, s.end) for s in doc_spans],
            located.get(document_id, []),
            min_overlap=min_overlap,
        )
        missing += [doc_spans[i] for i in indices]
    return missing


def verify(state: ExtractionState) -> dict[str, Any]:
    """Apply phase 4 (merge duplicates, record relations), then phase-5 checks."""
    settings = _settings()
    relations, tally = _read(state, _RELATIONS, phases.read_relations)
    merged, merges = _merge_duplicates(_drafts(state), relations, settings.merge)
    tallies = {"relations": {**tally, "duplicates_merged": merges}}
    if VERIFICATION in settings.skip_phases:
        return {"verified": merged, "uncovered": [], "tallies": tallies}
    kept, removed = _faithful(merged, state, settings)
    uncovered = _uncovered(kept, _spans(state), settings.min_coverage_overlap)
    tallies["verify"] = {"unfaithful_removed": len(removed)}
    return {
        "removed": removed,
        "verified": kept,
        "uncovered": _dump(uncovered),
        "tallies": tallies,
    }


# --- finalize ---------------------------------------------------------------------


def _rule_ids(rules: Sequence[dict[str, Any]]) -> dict[str, str]:
    ids: dict[str, str] = {}
    used: set[str] = set()
    for rule in rules:
        key = [rule["document_id"], rule["condition"], rule["action"]]
        if rule.get("fields"):  # a schema's other fields tell rules apart too
            key.append(rule["fields"])
        payload = json.dumps(key, sort_keys=True).encode()
        digest = hashlib.sha256(payload).hexdigest()[:8]
        rule_id = _unique(f"{slug(rule['document_id'], 'rule', 24)}-{digest}", used)
        ids[rule["draft_id"]] = rule_id
        used.add(rule_id)
    return ids


def _to_rule(
    rule: dict[str, Any],
    ids: Mapping[str, str],
    spans: Mapping[str, SpanRecord],
    page_starts: Mapping[str, Sequence[int]],
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
    pages: tuple[int, ...] = ()
    if source is not None and (starts := page_starts.get(source.document_id)):
        pages = pages_of(starts, source.start, source.end)
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
            pages=pages,
        ),
        relations=relations,
        **rule.get("fields", {}),
    )


def finalize(state: ExtractionState, config: RunnableConfig) -> dict[str, Any]:
    """Verify recovered rules, measure coverage and independence, build the rulebook."""
    settings = _settings()
    spans = _spans(state)
    by_span = {s.span_id: s for s in spans}
    drafts, tally = _read(
        state,
        _RECOVER,
        lambda raw, units, tally: phases.read_rules(
            raw, units, by_span, tally, settings.schema
        ),
    )
    recovered = [
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
        kept, lost = _faithful(recovered, state, settings)
        rules += kept
        removed += lost
        tally["recovered_faithful"] = len(kept)
        still_uncovered = _uncovered(rules, spans, settings.min_coverage_overlap)
    ids = _rule_ids(rules)
    page_starts = {
        document_id: starts
        for document_id, doc in zip(
            state["document_ids"], state["documents"], strict=True
        )
        if (starts := page_starts_of(doc))
    }
    final, flagged = flag_rules(
        [_to_rule(rule, ids, by_span, page_starts) for rule in rules]
    )
    report = _report(
        state, config, settings, final, removed, recovered, still_uncovered, tally
    ).model_copy(update={"flagged": flagged})
    rulebook = {
        "format_version": FORMAT_VERSION,
        "domain": _domain(state),
        "rules": _dump(final),
        "documents": _dump(source_documents(state["documents"])),
        "diagnostics": report.model_dump(mode="json"),
        "rule_schema": None
        if settings.schema == CONDITION_SCHEMA
        else settings.schema.model_dump(mode="json"),
    }
    return {"rulebook": rulebook, "report": report.model_dump(mode="json")}


def _report(
    state: ExtractionState,
    config: RunnableConfig,
    settings: ExtractionSettings,
    final: Sequence[Rule],
    removed: list[dict[str, Any]],
    recovered: Sequence[dict[str, Any]],
    still_uncovered: Sequence[SpanRecord],
    recovery_tally: Counter[str],
) -> ExtractionReport:
    tallies = {**state.get("tallies", {}), "recovery": dict(recovery_tally)}
    drafts = _drafts(state)
    invocation = _invocation(config)
    made: Counter[str] = Counter()
    reused: Counter[str] = Counter()
    tokens: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for key, (tokens_in, tokens_out, made_by) in state.get("usage", {}).items():
        row = _phase_of(key).row
        # Answers from the store, and calls made before the run was resumed.
        if made_by != invocation:
            reused[row] += 1
            continue
        made[row] += 1
        tokens[row][0] += tokens_in
        tokens[row][1] += tokens_out
    phase_reports = {}
    for name, number in REPORT_ROWS.items():
        problems = dict(tallies.get(name, {}))
        items_out = problems.pop("kept", 0)
        phase_reports[name] = PhaseReport(
            calls=made[name],
            stored_answers=reused[name],
            input_tokens=tokens[name][0],
            output_tokens=tokens[name][1],
            items_out=len(final) if name == "verify" else items_out,
            problems={k: v for k, v in problems.items() if v},
            skipped=number in settings.skip_phases,
        )
    relation_counts = Counter(
        link["relationship"]
        for rule in state.get("verified", [])
        for link in rule["links"]
    )
    names = independence([r.name for r in final])
    comparisons = _comparisons(state)
    return ExtractionReport(
        domain=_domain(state),
        documents=len(state["documents"]),
        sections=len(state.get("sections", [])),
        phases=phase_reports,
        candidate_pairs=comparisons.candidate_pairs,
        pairs_compared=comparisons.pairs_compared,
        pairs_skipped=comparisons.pairs_skipped,
        max_pairs=settings.max_pairs,
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
        uncovered_before_recovery=len(state.get("uncovered", [])),
        recovered_rules=len(recovered),
        uncovered_after_recovery=[s.span_id for s in still_uncovered],
        independence=names.ratio,
        shared_names=dict(names.shared_names),
        rules=len(final),
        seconds=time.time() - state.get("started", time.time()),
    )


# --- the graph ---------------------------------------------------------------------

_STEPS = (prepare, plan_atomics, plan_rules, plan_relations, verify, finalize)
"""The nodes between the LLM phases: each of `_LLM_PHASES` runs between two."""


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
    builder.add_node(prepare)
    for phase in _LLM_PHASES:
        builder.add_node(
            phase.node,
            RunnableLambda(_call, afunc=_acall, name=phase.node),
            retry_policy=node_retry,
            input_schema=ModelRequest,
        )
    for step in _STEPS[1:]:
        builder.add_node(step)
    builder.add_edge(START, prepare.__name__)
    for (before, after), phase in zip(pairwise(_STEPS), _LLM_PHASES, strict=True):
        then = after.__name__
        builder.add_conditional_edges(
            before.__name__, _router(phase, then), [phase.node, then]
        )
        builder.add_edge(phase.node, then)
    builder.add_edge(finalize.__name__, END)
    return builder.compile(checkpointer=checkpointer, name="tag_extraction")
