"""Phases 1-4 of extraction as pure functions: the prompts and the output checks.

Each phase asks for one JSON object. Nothing the model returns is trusted: items are
validated one by one, spans must be found in the section, ids must refer to what was
sent, and every drop is counted under a reason so the report can say what was lost.
The LangGraph nodes in `graph.py` only add the model call around these functions.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
)

from langchain_tag._delimiters import escape_delimiters
from langchain_tag._text import first_json_object
from langchain_tag.extraction import prompts
from langchain_tag.extraction.sectioning import Section
from langchain_tag.extraction.verification import locate_span
from langchain_tag.rule_schemas import CONDITION_SCHEMA, RuleSchema
from langchain_tag.rules import NormativeType, PreferredAction, Relationship

_T = TypeVar("_T")
MAX_TAGS = 3


# --- what the model is asked to return (validated item by item) ---------------------


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)


class SpanItem(_Item):
    """Phase 1 output item."""

    span_id: str = ""
    text: str = Field(min_length=1)
    normative_type: NormativeType | None = None
    context_summary: str | None = None

    @field_validator("normative_type", mode="before")
    @classmethod
    def _known_type(cls, value: object) -> object:
        # An unknown label loses the label, not the span.
        label = value.strip().lower() if isinstance(value, str) else None
        return label if label in NormativeType.__args__ else None  # type: ignore[attr-defined]


class AtomicItem(_Item):
    """Phase 2 output item."""

    atomic_id: str = ""
    source_span_id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    original_text: str | None = None
    was_split: bool = False
    split_rationale: str | None = None


class _RuleItem(_Item):
    """What every phase-3 output item holds, whatever the rule schema."""

    atomic_id: str = Field(min_length=1)
    rule_name: str = Field(min_length=1)
    source_text: str | None = None
    category_tags: list[str] = Field(default_factory=list)

    @field_validator("category_tags", mode="before")
    @classmethod
    def _tags(cls, value: object) -> object:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            return []
        return [str(tag).strip().lower() for tag in value if str(tag).strip()]


class RuleItem(_RuleItem):
    """Phase 3 output item (the condition schema)."""

    condition: str = Field(min_length=1)
    action: str = Field(min_length=1)


@functools.cache
def rule_item_model(schema: RuleSchema) -> type[_RuleItem]:
    """Phase 3's output item for `schema`: `RuleItem` plus or instead of its fields.

    A required field must be non-blank text; an optional one may be null or blank.
    """
    if schema == CONDITION_SCHEMA:
        return RuleItem
    fields: dict[str, Any] = {
        f.name: (str, Field(min_length=1)) if f.required else (str | None, None)
        for f in schema.fields
    }
    model: type[_RuleItem] = create_model(
        f"RuleItem_{schema.name}", __base__=_RuleItem, **fields
    )
    return model


class RelationItem(_Item):
    """Phase 4 output item."""

    rule_i: str = Field(min_length=1)
    rule_j: str = Field(min_length=1)
    relationship: Relationship
    preferred_action: PreferredAction | None = None
    explanation: str | None = None


# --- what the pipeline carries between phases (document coordinates, global ids) ----


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpanRecord(_Record):
    """A normative span located in its document."""

    span_id: str
    section_id: str
    document_id: str
    text: str
    start: int
    end: int
    normative_type: NormativeType | None = None
    context_summary: str | None = None


class AtomicRecord(_Record):
    """An atomic unit and the span it came from."""

    atomic_id: str
    span_id: str
    section_id: str
    document_id: str
    text: str
    original_text: str
    was_split: bool = False


class DraftRule(_Record):
    """A rule before deduplication and verification."""

    draft_id: str
    document_id: str
    section_id: str
    name: str
    condition: str
    action: str
    source_text: str
    tags: tuple[str, ...]
    span_ids: tuple[str, ...]
    atomic_ids: tuple[str, ...]
    normative_type: NormativeType | None = None
    fields: dict[str, Any] = Field(default_factory=dict)
    """A rule schema's other values (`RuleSchema.rule_values`): profile fields and
    `fields`; empty for the condition schema."""


class RelationRecord(_Record):
    """A phase-4 finding about two draft rules."""

    rule_i: str
    rule_j: str
    relationship: Relationship
    preferred_action: PreferredAction | None = None
    explanation: str | None = None


# --- reading JSON out of model text ---------------------------------------------------


def readable(text: str, key: str) -> bool:
    """Whether `text` holds a JSON object with a list under `key`, as asked for.

    An answer that does not (empty, cut off, a refusal, another shape) counts as
    `malformed_json` or `missing_<key>_list`; see `unreadable_problem`.
    """
    obj = first_json_object(text)
    return obj is not None and isinstance(obj.get(key), list)


def unreadable_problem(problem: str) -> bool:
    """Whether a tallied problem is a whole answer that could not be read."""
    return problem == "malformed_json" or (
        problem.startswith("missing_") and problem.endswith("_list")
    )


def read_items(
    text: str, key: str, model: type[_Item], tally: Counter[str]
) -> list[Any]:
    """Validate the list under `key` item by item; count every problem in `tally`."""
    obj = first_json_object(text)
    if obj is None:
        tally["malformed_json"] += 1
        return []
    raw = obj.get(key)
    if not isinstance(raw, list):
        tally[f"missing_{key}_list"] += 1
        return []
    items = []
    for entry in raw:
        try:
            items.append(model.model_validate(entry))
        except ValidationError as error:  # noqa: PERF203 - each item counts on its own
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "item"
            tally[f"invalid_item:{field}"] += 1
    return items


def _messages(system: str, user: str, domain: str, **fields: str) -> list[BaseMessage]:
    return [
        SystemMessage(system.format(domain=domain)),
        HumanMessage(user.format(**fields)),
    ]


def _listing(
    system: str, user: str, domain: str, **rows: Iterable[str]
) -> list[BaseMessage]:
    """A prompt listing records one a line; their text, from documents, escaped."""
    fields = {name: escape_delimiters("\n".join(lines)) for name, lines in rows.items()}
    return _messages(system, user, domain, **fields)


def _referenced(
    local_id: str, by_local: dict[str, _T], what: str, tally: Counter[str]
) -> _T | None:
    """The record an output item refers to by its local id, counting repairs/drops.

    With a single record in the prompt there is no doubt which one a wrong id meant.
    """
    record = by_local.get(local_id)
    if record is None and len(by_local) == 1:
        tally[f"repaired_{what}"] += 1
        return next(iter(by_local.values()))
    if record is None:
        tally[f"dropped_unknown_{what}"] += 1
    return record


# --- phase 1 ----------------------------------------------------------------------


def span_messages(section: Section, domain: str) -> list[BaseMessage]:
    """Phase 1 prompt for one section."""
    heading = " > ".join(section.heading_path) or "(none)"
    return _messages(
        prompts.SPAN_DETECTION_SYSTEM,
        prompts.SPAN_DETECTION_USER,
        domain,
        heading=heading,
        section=escape_delimiters(section.text),
    )


def read_spans(text: str, section: Section, tally: Counter[str]) -> list[SpanRecord]:
    """Phase 1 output -> spans located in the document; unlocatable spans dropped."""
    records: list[SpanRecord] = []
    seen: set[tuple[int, int]] = set()
    for item in read_items(text, "spans", SpanItem, tally):
        start = section.text.find(item.text)
        if start == -1:
            found = locate_span(item.text, section.text)
            if found is None:
                tally["dropped_not_in_section"] += 1
                continue
            tally["relocated_after_normalising"] += 1
            start, end = found
        else:
            end = start + len(item.text)
        if (start, end) in seen:
            tally["dropped_duplicate_span"] += 1
            continue
        seen.add((start, end))
        records.append(
            span_record(
                section,
                len(records) + 1,
                start,
                end,
                normative_type=item.normative_type,
                context_summary=item.context_summary,
            )
        )
    return records


def span_record(
    section: Section, number: int, start: int, end: int, **labels: Any
) -> SpanRecord:
    """The span at `start:end` of the section's text, numbered in the section."""
    return SpanRecord(
        span_id=f"{section.section_id}/S-{number:03d}",
        section_id=section.section_id,
        document_id=section.document_id,
        text=section.text[start:end],
        start=section.start + start,
        end=section.start + end,
        **labels,
    )


def whole_section_spans(section: Section) -> list[SpanRecord]:
    """Phase 1 skipped (ablation): every paragraph of the section is a span."""
    paragraphs = re.finditer(r"\S(?:.*?\S)?(?=\n\s*\n|\s*\Z)", section.text, re.DOTALL)
    return [span_record(section, n, *m.span()) for n, m in enumerate(paragraphs, 1)]


# --- phase 2 ----------------------------------------------------------------------


def _local(record_id: str) -> str:
    return record_id.rsplit("/", 1)[-1]


def atomic_messages(spans: Sequence[SpanRecord], domain: str) -> list[BaseMessage]:
    """Phase 2 prompt for the spans of one section."""
    return _listing(
        prompts.DECOMPOSITION_SYSTEM,
        prompts.DECOMPOSITION_USER,
        domain,
        spans=(f"{_local(s.span_id)}: {s.text}" for s in spans),
    )


def read_atomics(
    text: str, spans: Sequence[SpanRecord], tally: Counter[str]
) -> list[AtomicRecord]:
    """Phase 2 output -> atomic units tied to the spans they came from."""
    by_local = {_local(s.span_id): s for s in spans}
    records: list[AtomicRecord] = []
    covered: set[str] = set()
    for item in read_items(text, "atomic_units", AtomicItem, tally):
        span = _referenced(item.source_span_id, by_local, "span_id", tally)
        if span is None:
            continue
        covered.add(span.span_id)
        unit = atomic_from_span(span, len(records) + 1)
        records.append(
            unit.model_copy(update={"text": item.text, "was_split": item.was_split})
        )
    # A span the model skipped still yields a unit: losing it would lose a rule.
    for span in spans:
        if span.span_id not in covered:
            tally["span_kept_whole"] += 1
            records.append(atomic_from_span(span, len(records) + 1))
    return records


def atomic_from_span(span: SpanRecord, number: int) -> AtomicRecord:
    """The span itself as one atomic unit (phase 2 skipped, or nothing returned)."""
    return AtomicRecord(
        atomic_id=f"{span.section_id}/A-{number:03d}",
        span_id=span.span_id,
        section_id=span.section_id,
        document_id=span.document_id,
        text=span.text,
        original_text=span.text,
    )


# --- phase 3 ----------------------------------------------------------------------


def rule_messages(
    atomics: Sequence[AtomicRecord],
    domain: str,
    schema: RuleSchema = CONDITION_SCHEMA,
) -> list[BaseMessage]:
    """Phase 3 prompt for a batch of atomic units, asking for `schema`'s fields."""
    return _listing(
        prompts.operationalisation_system(schema),
        prompts.OPERATIONALISATION_USER,
        domain,
        units=(f"{_local(a.atomic_id)}: {a.text} | {a.original_text}" for a in atomics),
    )


def read_rules(
    text: str,
    atomics: Sequence[AtomicRecord],
    spans: dict[str, SpanRecord],
    tally: Counter[str],
    schema: RuleSchema = CONDITION_SCHEMA,
) -> list[DraftRule]:
    """Phase 3 output -> draft rules tied to their atomic units and spans."""
    by_local = {_local(a.atomic_id): a for a in atomics}
    drafts: list[DraftRule] = []
    for item in read_items(text, "rules", rule_item_model(schema), tally):
        atomic = _referenced(item.atomic_id, by_local, "atomic_id", tally)
        if atomic is None:
            continue
        tags = tuple(dict.fromkeys(item.category_tags))
        if len(tags) > MAX_TAGS:
            tally["tags_truncated"] += 1
            tags = tags[:MAX_TAGS]
        draft = draft_from_atomic(atomic, spans.get(atomic.span_id))
        values = schema.rule_values(item.model_dump())
        update = {
            "draft_id": f"{atomic.atomic_id}/R-{len(drafts) + 1}",
            "name": item.rule_name,
            "condition": values.pop("condition"),
            "action": values.pop("action"),
            "source_text": item.source_text or atomic.original_text,
            "tags": tags or ("general",),
            "fields": {} if schema == CONDITION_SCHEMA else values,
        }
        drafts.append(draft.model_copy(update=update))
    return drafts


def draft_from_atomic(atomic: AtomicRecord, span: SpanRecord | None) -> DraftRule:
    """Phase 3 skipped (ablation): the unit's text is both condition and action."""
    words = atomic.text.split()
    return DraftRule(
        draft_id=f"{atomic.atomic_id}/R-1",
        document_id=atomic.document_id,
        section_id=atomic.section_id,
        name=" ".join(words[:8]) or atomic.atomic_id,
        condition=atomic.text,
        action=atomic.text,
        source_text=atomic.original_text,
        tags=("general",),
        span_ids=(atomic.span_id,),
        atomic_ids=(atomic.atomic_id,),
        normative_type=span.normative_type if span else None,
    )


# --- phase 4 ----------------------------------------------------------------------


def relation_messages(rules: Sequence[DraftRule], domain: str) -> list[BaseMessage]:
    """Phase 4 prompt for a group of rules that share a tag."""
    return _listing(
        prompts.RELATIONS_SYSTEM,
        prompts.RELATIONS_USER,
        domain,
        rules=(f"{r.draft_id} | {r.name} | {r.condition} | {r.action}" for r in rules),
    )


def read_relations(
    text: str, rules: Sequence[DraftRule], tally: Counter[str]
) -> list[RelationRecord]:
    """Phase 4 output -> relations between rules of the group; others dropped."""
    known = {r.draft_id for r in rules}
    records: list[RelationRecord] = []
    for item in read_items(text, "relations", RelationItem, tally):
        if item.rule_i not in known or item.rule_j not in known:
            tally["dropped_unknown_rule_id"] += 1
            continue
        if item.rule_i == item.rule_j:
            tally["dropped_self_pair"] += 1
            continue
        records.append(RelationRecord(**item.model_dump()))
    return records
