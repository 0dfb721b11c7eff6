"""What an extraction would spend, worked out before any call: `estimate_extraction`.

`tag extract --estimate` prints it: per phase, the LLM calls and the input and
output tokens `extract_rules` would spend on the documents, and dollars at the
prices given. It needs no model and no API key, calls nothing and writes nothing.

The documents are loaded and sectioned as the run loads and sections them, each
prompt is rendered by the phase's own function (`phases.span_messages`, ...), and
its tokens are counted by `usage.token_counter` (tiktoken's cl100k_base, offline,
or about 4 characters a token). Per phase:

- Phase 1 (spans): exact calls and input tokens, one call a section. The answer is
  estimated as a span for each normative sentence: a sentence with a cue word
  (must, should, never, avoid, ...; `NORMATIVE_CUES`).
- Phase 2 (atomic units): estimated. A call for each section with a normative
  sentence, rendered with those sentences as its spans; a unit a sentence.
- Phase 3 (rules): estimated. A call for every `units_per_call` units of a
  section, rendered with the sentences as units; a rule a unit, answered in the
  rule schema's fields, each as long as its sentence.
- Phase 4 (relations): estimated. The rules' tags are unknown before phase 3, so
  any two of the R rules may share one: at most min(`max_pairs`, R(R-1)/2) pairs
  are chosen, in as many calls as if all R shared one tag (`pairs.one_tag_calls`),
  each priced as a call of the `rules_per_comparison` longest rules. Not a bound:
  rules spread over many small tags make more, smaller calls, at most
  `pairs.comparison_calls_bound` (3 x the pairs); the row says so with its figure.
- Recovery (phase 5's re-extraction): estimated, from the spans estimated for
  phase 1, every one left uncovered and sent back through phase 3 once, one call a
  section with spans. The run's calls are at most one a section.

Output tokens are estimated: the answer the prompt asks for, written for the
sentences found (phase 4: one relation a call). A skipped phase costs nothing and
its stand-in records are the run's own (paragraphs for spans, spans as units,
units as rules), so what follows it is worked out from those; with phase 3 skipped
the rules are known, and phase 4's calls are planned as the run plans them.

Cached input tokens are estimated for phases 1-3, under a model of the provider's
prompt cache (`usage.PromptCaching`), none for the calls priced as repeats of
one (phase 4 as if of one tag, recovery). Not counted: retries
after errors, and answers that could not be read, asked again by a re-run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field

from langchain_tag._text import batches
from langchain_tag.extraction import phases
from langchain_tag.extraction.documents import DocumentLike, document_sections
from langchain_tag.extraction.graph import (
    DECOMPOSITION,
    DEFAULT_DOMAIN,
    OPERATIONALISATION,
    RELATIONS,
    SPAN_DETECTION,
    VERIFICATION,
    ExtractionSettings,
    source_documents,
)
from langchain_tag.extraction.pairs import (
    comparison_calls_bound,
    one_tag_calls,
    plan_comparisons,
)
from langchain_tag.extraction.phases import AtomicRecord, DraftRule, SpanRecord
from langchain_tag.extraction.run import _as_documents
from langchain_tag.extraction.sectioning import Section
from langchain_tag.rule_schemas import RuleSchema
from langchain_tag.usage import (
    DEFAULT_CACHING,
    MESSAGE_OVERHEAD,
    REPLY_OVERHEAD,
    PromptCaching,
    SimulatedPromptCache,
    TokenCounter,
    TokenPrices,
    TokenUsage,
    format_usd,
    token_counter,
)

__all__ = [
    "NORMATIVE_CUES",
    "ExtractionEstimate",
    "PhaseEstimate",
    "estimate_extraction",
]

NORMATIVE_CUES = re.compile(
    r"\b(?:must|shall|should|may|ought|needs? to|required?|requires|mandatory|"
    r"prohibit(?:s|ed)?|forbid(?:s|den)?|permit(?:s|ted)?|allowed|never|always|"
    r"avoid|prefer(?:red|ably)?|recommend(?:s|ed)?|(?:en|dis)couraged|do not|"
    r"don't|cannot|can't|only if|unless|normally)\b",
    re.IGNORECASE,
)
"""Words that make a sentence normative for the estimate: phase 1's prompt asks for
what requires, prohibits, recommends, permits, excepts or conditions behaviour."""

_PARAGRAPH = re.compile(r"\S(?:.*?\S)?(?=\n\s*\n|\s*\Z)", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n(?=[ \t]*(?:[-*+\u2022]|\d{1,3}[.)])\s)")
_SUMMARY_WORDS = 12
_NAME_WORDS = 6
_KEEP_PROMPTS = 10_000
"""Prompts the simulated prompt cache remembers (the most recent)."""

Basis = Literal["exact", "estimated", "skipped"]
"""How a phase's calls and input tokens are known (output tokens are estimated)."""
_MARKS: dict[Basis, str] = {"exact": "", "estimated": "~", "skipped": ""}


class PhaseEstimate(BaseModel):
    """What one phase would spend."""

    calls: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = Field(
        default=0, description="Of `input_tokens`, those a prompt cache would serve."
    )
    output_tokens: int = 0
    basis: Basis = Field(
        description="Calls and input tokens: exact (rendered prompts), or "
        "estimated (from the sentences found; `how` says from what)."
    )
    how: str = Field(description="How the figures were worked out, in a sentence.")

    @property
    def usage(self) -> TokenUsage:
        """The calls and tokens, to price with `TokenPrices.cost`."""
        return TokenUsage(
            calls=self.calls,
            input_tokens=self.input_tokens,
            cached_input_tokens=self.cached_input_tokens,
            output_tokens=self.output_tokens,
        )


class ExtractionEstimate(BaseModel):
    """What `extract_rules` would spend on some documents, before any call."""

    domain: str
    documents: int
    sections: int
    normative_sentences: int = Field(
        description="Sentences with a cue word (`NORMATIVE_CUES`): the spans, and "
        "the rules, the estimate assumes (paragraphs when phase 1 is skipped)."
    )
    rules: int = Field(description="Rules entering phase 4, as estimated.")
    rule_pairs: int = Field(description="R(R-1)/2: the most pairs sharing a tag.")
    max_pairs: int | None = Field(description="The cap on phase 4's pairs.")
    pairs: int = Field(
        description="Pairs chosen for phase 4 if any two rules shared a tag: "
        "min(max_pairs, rule_pairs), the most there can be."
    )
    phases: dict[str, PhaseEstimate] = Field(
        description="By the report's rows: spans, atomics, rules, relations, recovery."
    )
    token_counter: str = Field(description="How tokens were counted.")
    caching: PromptCaching | None = None
    prices: TokenPrices | None = None

    @property
    def usage(self) -> TokenUsage:
        """All phases together."""
        return sum((p.usage for p in self.phases.values()), TokenUsage())

    def dollars(self, *, batch: bool = False) -> float | None:
        """The total at `prices` (None without), at list or batch prices."""
        if self.prices is None:
            return None
        return self.prices.cost(self.usage, batch=batch)

    def format(self) -> str:
        """A plain-text table, one row a phase, then how each was worked out."""
        heading = (
            f"Extraction estimate ({self.domain}): {self.documents} document(s), "
            f"{self.sections} section(s), {self.normative_sentences:,} normative "
            f"sentence(s), {self.rules:,} rule(s) assumed; no model was called."
        )
        columns = (
            f"{'phase':<11}{'calls':>9}{'in tok':>13}{'cached':>11}{'out tok':>12}"
            f"{'USD':>10}"
        )
        rows = [
            self._row(name, phase.usage, _MARKS[phase.basis])
            for name, phase in self.phases.items()
        ]
        rows.append(self._row("total", self.usage, self._total_mark()))
        hows = [f"{name}: {phase.how}" for name, phase in self.phases.items()]
        return "\n".join([heading, "", columns, *rows, "", *hows, "", *self._notes()])

    def _total_mark(self) -> str:
        bases = {p.basis for p in self.phases.values() if p.calls}
        return "~" if "estimated" in bases else ""

    def _row(self, name: str, usage: TokenUsage, mark: str) -> str:
        out = "~" if usage.output_tokens else ""  # always estimated
        price = None if self.prices is None else self.prices.cost(usage)
        return (
            f"{name:<11}{mark + f'{usage.calls:,}':>9}"
            f"{mark + f'{usage.input_tokens or 0:,}':>13}"
            f"{usage.cached_input_tokens or 0:>11,}"
            f"{out + f'{usage.output_tokens or 0:,}':>12}{format_usd(price):>10}"
        )

    def _notes(self) -> list[str]:
        counted = (
            "~ an estimate, no mark exact (every call succeeding "
            f"at its first attempt). Tokens: {self.token_counter}, plus "
            f"{MESSAGE_OVERHEAD} a message and {REPLY_OVERHEAD} a request."
        )
        cached = (
            "Cached input: none assumed."
            if self.caching is None
            else "Cached input: rendered prompts sharing a prefix of "
            f"{self.caching.min_tokens:,}+ tokens with an earlier one (in "
            f"{self.caching.block_tokens}-token steps, as OpenAI caches them); none "
            "for calls priced as repeats of one."
        )
        if self.prices is None:
            price = (
                "Price: no prices given (tag extract: --price-in and --price-out, "
                "USD per million tokens)."
            )
        else:
            mark = self._total_mark()
            price = (
                f"Price: {mark}{format_usd(self.dollars())} at list prices, "
                f"{mark}{format_usd(self.dollars(batch=True))} at "
                f"{self.prices.batch_discount:.0%} off (flex processing), with "
                "the phases' estimates as above."
            )
        return [counted, cached, price]


# --- the sentences a model would find -------------------------------------------------


def _sentences(text: str) -> list[tuple[int, int]]:
    """Offsets of the sentences and list items of `text`, paragraph by paragraph."""
    found = []
    for paragraph in _PARAGRAPH.finditer(text):
        start = paragraph.start()
        for end in _SENTENCE_END.finditer(paragraph.group()):
            found.append((start, paragraph.start() + end.start()))
            start = paragraph.start() + end.end()
        found.append((start, paragraph.end()))
    return [(a, b) for a, b in found if b > a]


def _normative_spans(section: Section) -> list[SpanRecord]:
    """The section's sentences with a cue word, as phase 1 would return them."""
    found = [
        (a, b)
        for a, b in _sentences(section.text)
        if NORMATIVE_CUES.search(section.text, a, b)
    ]
    return [phases.span_record(section, n, a, b) for n, (a, b) in enumerate(found, 1)]


# --- the answers, as the prompts ask for them -----------------------------------------


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _words(text: str, count: int) -> str:
    return " ".join(text.split()[:count])


def _local(record_id: str) -> str:
    return record_id.rsplit("/", 1)[-1]


def _spans_answer(spans: Sequence[SpanRecord]) -> str:
    return _json(
        {
            "spans": [
                {
                    "span_id": _local(s.span_id),
                    "text": s.text,
                    "normative_type": "requirement",
                    "context_summary": _words(s.text, _SUMMARY_WORDS),
                }
                for s in spans
            ]
        }
    )


def _units_answer(units: Sequence[AtomicRecord]) -> str:
    return _json(
        {
            "atomic_units": [
                {
                    "atomic_id": _local(u.atomic_id),
                    "source_span_id": _local(u.span_id),
                    "text": u.text,
                    "original_text": u.original_text,
                    "was_split": False,
                    "split_rationale": None,
                }
                for u in units
            ]
        }
    )


def _rules_answer(units: Sequence[AtomicRecord], schema: RuleSchema) -> str:
    return _json(
        {
            "rules": [
                {
                    "atomic_id": _local(u.atomic_id),
                    "rule_name": _words(u.text, _NAME_WORDS),
                    **{f.name: u.text for f in schema.fields},
                    "source_text": u.original_text,
                    "category_tags": ["general"],
                }
                for u in units
            ]
        }
    )


def _relations_answer(rules: Sequence[DraftRule]) -> str:
    first, second = rules[0], rules[-1]
    return _json(
        {
            "relations": [
                {
                    "rule_i": first.draft_id,
                    "rule_j": second.draft_id,
                    "relationship": "overlap",
                    "preferred_action": "keep_both",
                    "explanation": "Both rules can apply to one input, and neither "
                    "contains the other.",
                }
            ]
        }
    )


# --- counting -------------------------------------------------------------------------


@dataclass
class _Meter:
    """Counts requests: their tokens, and those a prompt cache would serve."""

    counter: TokenCounter
    cache: SimulatedPromptCache | None
    usage: TokenUsage = field(default_factory=TokenUsage)

    def request(self, messages: Sequence[BaseMessage], answer: str) -> None:
        self.usage += self.counter.request(messages, answer, self.cache)

    def repeated(
        self, calls: int, messages: Sequence[BaseMessage], answer: str
    ) -> None:
        """`calls` requests, each priced as `messages` and `answer` (none cached)."""
        self.usage += TokenUsage(
            calls=calls,
            input_tokens=calls * self.counter.messages(messages),
            cached_input_tokens=0,
            output_tokens=calls * self.counter.count(answer),
        )

    def phase(self, basis: Basis, how: str) -> PhaseEstimate:
        """The phase's figures so far; the meter starts again from zero."""
        usage, self.usage = self.usage, TokenUsage()
        return PhaseEstimate(
            calls=usage.calls,
            input_tokens=usage.input_tokens or 0,
            cached_input_tokens=usage.cached_input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            basis=basis,
            how=how,
        )


def _skipped(number: int) -> PhaseEstimate:
    return PhaseEstimate(basis="skipped", how=f"skipped (phase {number}): no call.")


@dataclass
class _Walk:
    """The run's records as the estimate assumes them, phase by phase."""

    settings: ExtractionSettings
    domain: str
    meter: _Meter
    sections: list[Section]
    spans: list[list[SpanRecord]] = field(default_factory=list)
    """Per section with spans."""
    units: list[list[AtomicRecord]] = field(default_factory=list)
    """Per section with spans."""
    found: dict[str, PhaseEstimate] = field(default_factory=dict)

    def skips(self, *numbers: int) -> bool:
        return not self.settings.skip_phases.isdisjoint(numbers)

    def detect_spans(self) -> None:
        if self.skips(SPAN_DETECTION):
            spans = [phases.whole_section_spans(s) for s in self.sections]
            self.found["spans"] = _skipped(SPAN_DETECTION)
        else:
            spans = [_normative_spans(s) for s in self.sections]
            for section, found in zip(self.sections, spans, strict=True):
                self.meter.request(
                    phases.span_messages(section, self.domain), _spans_answer(found)
                )
            sentences = sum(map(len, spans))
            self.found["spans"] = self.meter.phase(
                "exact",
                "one call a section, its prompt rendered; answered with the "
                f"{sentences:,} sentences holding a cue word (must, should, never, "
                "avoid, ...) as spans.",
            )
        self.spans = [found for found in spans if found]

    def decompose(self) -> None:
        self.units = [
            [phases.atomic_from_span(s, n) for n, s in enumerate(spans, 1)]
            for spans in self.spans
        ]
        if self.skips(DECOMPOSITION):
            self.found["atomics"] = _skipped(DECOMPOSITION)
            return
        for spans, units in zip(self.spans, self.units, strict=True):
            self.meter.request(
                phases.atomic_messages(spans, self.domain), _units_answer(units)
            )
        self.found["atomics"] = self.meter.phase(
            "exact" if self.skips(SPAN_DETECTION) else "estimated",
            "one call a section with spans, rendered with them; a unit a span.",
        )

    def operationalise(self) -> list[DraftRule]:
        schema = self.settings.schema
        spans = {s.span_id: s for found in self.spans for s in found}
        drafts = [
            phases.draft_from_atomic(u, spans.get(u.span_id))
            for units in self.units
            for u in units
        ]
        if self.skips(OPERATIONALISATION):
            self.found["rules"] = _skipped(OPERATIONALISATION)
            return drafts
        for units in self.units:
            for batch in batches(units, self.settings.units_per_call):
                self.meter.request(
                    phases.rule_messages(batch, self.domain, schema),
                    _rules_answer(batch, schema),
                )
        exact = self.skips(SPAN_DETECTION) and self.skips(DECOMPOSITION)
        self.found["rules"] = self.meter.phase(
            "exact" if exact else "estimated",
            f"a call for every {self.settings.units_per_call} units of a section "
            f"(units_per_call), rendered with them; a rule a unit in the "
            f"{schema.name!r} schema's fields.",
        )
        return drafts

    def compare(self, drafts: Sequence[DraftRule]) -> tuple[int, int]:
        """Phase 4; returns the most pairs sharing a tag, and the most chosen."""
        settings = self.settings
        limit, cap = settings.rules_per_comparison, settings.max_pairs
        rules = len(drafts)
        possible = rules * (rules - 1) // 2
        chosen = possible if cap is None else min(cap, possible)
        if self.skips(RELATIONS):
            self.found["relations"] = _skipped(RELATIONS)
            return possible, 0
        if self.skips(OPERATIONALISATION):  # the rules are known: the run's plan
            plan = plan_comparisons(drafts, limit, cap)
            by_id = {d.draft_id: d for d in drafts}
            for _, ids in plan.groups:
                group = [by_id[i] for i in ids]
                self.meter.request(
                    phases.relation_messages(group, self.domain),
                    _relations_answer(group),
                )
            known = self.skips(SPAN_DETECTION) and self.skips(DECOMPOSITION)
            self.found["relations"] = self.meter.phase(
                "exact" if known else "estimated",
                f"the run's plan for the {rules:,} rules phase 3's stand-in makes "
                f"(one tag): {plan.candidate_pairs:,} pairs, "
                f"{plan.pairs_compared:,} compared; one relation a call.",
            )
            return possible, chosen
        calls = one_tag_calls(rules, limit, cap)
        if calls:
            # The longest rules make the costliest call.
            longest = sorted(drafts, key=_listed_length, reverse=True)[:limit]
            self.meter.repeated(
                calls,
                phases.relation_messages(longest, self.domain),
                _relations_answer(longest),
            )
        capped = cap is not None and possible > cap
        pairs = f"up to {possible:,} pairs"
        if capped:
            pairs = (
                f"the {cap:,} most similar (max_pairs={cap}, --max-pairs) of {pairs}"
            )
        over_cap = (
            f"; over the cap, at most {cap:,}/{math.ceil((max(limit, 2) - 1) / 2)} "
            "plus one per tag holding a chosen pair"
            if capped
            else ""
        )
        self.found["relations"] = self.meter.phase(
            "estimated",
            f"{pairs}, those of the {rules:,} rules assumed. Tags are unknown before "
            "phase 3: the calls are those if all the rules shared one tag, each with "
            f"the {min(limit, rules)} longest rules (rules_per_comparison); one "
            "relation a call. Rules spread over many small tags make more, smaller "
            f"calls: at most {comparison_calls_bound(possible, cap):,} calls "
            f"({phases.MAX_TAGS} x {chosen:,} pairs: one call at most per pair per "
            f"tag it shares, and a rule has {phases.MAX_TAGS} tags at most"
            f"{over_cap}), none of more "
            "rules than the call priced here.",
        )
        return possible, chosen

    def recover(self) -> None:
        if self.skips(OPERATIONALISATION, VERIFICATION):
            skipped = OPERATIONALISATION, VERIFICATION
            number = next(n for n in skipped if self.skips(n))
            self.found["recovery"] = _skipped(number)
            return
        schema = self.settings.schema
        for spans in self.spans:
            units = [phases.atomic_from_span(s, n) for n, s in enumerate(spans, 1)]
            self.meter.repeated(
                1,
                phases.rule_messages(units, self.domain, schema),
                _rules_answer(units, schema),
            )
        self.found["recovery"] = self.meter.phase(
            "estimated",
            f"as if all {sum(map(len, self.spans)):,} spans estimated for phase 1 "
            "were left uncovered and sent back through phase 3 once, one call a "
            f"section with spans ({len(self.spans):,}); the run's depend on the "
            "spans its phase 1 finds: at most one call a section "
            f"({len(self.sections):,}).",
        )


def _listed_length(draft: DraftRule) -> int:
    return len(draft.name) + len(draft.condition) + len(draft.action)


def estimate_extraction(
    documents: Iterable[DocumentLike],
    *,
    domain: str = DEFAULT_DOMAIN,
    skip_phases: Iterable[int] = (),
    prices: TokenPrices | None = None,
    caching: PromptCaching | None = DEFAULT_CACHING,
    max_concurrency: int = 8,
    **settings: Any,
) -> ExtractionEstimate:
    """What `extract_rules` would spend on `documents`, calling no model.

    Takes `extract_rules`' arguments: the documents are loaded and sectioned as it
    loads and sections them, and its settings decide the batches. See the module's
    docstring for how each phase is worked out.

    Args:
        documents: As `extract_rules` takes them (Documents, texts, file paths).
        domain: What the documents govern; it is in every prompt.
        skip_phases: Phases 1-5 the run would skip: they cost nothing.
        prices: USD per million tokens, for dollars; None for none.
        caching: The provider's prompt cache, to estimate cached input tokens
            (default OpenAI's); None for none.
        max_concurrency: Calls in flight: a prompt is not cached before the calls
            sent before it finish.
        **settings: Other `ExtractionSettings` fields, as `extract_rules` takes
            them (`max_section_tokens`, `units_per_call`, `rules_per_comparison`,
            `max_pairs`, `rule_schema`, ...).

    Raises:
        ValueError: No document, an empty one, or a bad setting.
    """
    docs = _as_documents(documents)
    run = ExtractionSettings(skip_phases=frozenset(skip_phases), **settings)
    counter = token_counter()
    cache = (
        None
        if caching is None
        else SimulatedPromptCache(
            caching, counter.count, in_flight=max_concurrency, keep=_KEEP_PROMPTS
        )
    )
    ids = [d.document_id for d in source_documents(docs)]
    sections = [
        section
        for doc, document_id in zip(docs, ids, strict=True)
        for section in document_sections(
            doc, document_id, max_tokens=run.max_section_tokens
        )
    ]
    walk = _Walk(run, domain, _Meter(counter, cache), sections)
    walk.detect_spans()
    walk.decompose()
    drafts = walk.operationalise()
    rule_pairs, pairs = walk.compare(drafts)
    walk.recover()
    return ExtractionEstimate(
        domain=domain,
        documents=len(docs),
        sections=len(sections),
        normative_sentences=sum(map(len, walk.spans)),
        rules=len(drafts),
        rule_pairs=rule_pairs,
        max_pairs=run.max_pairs,
        pairs=pairs,
        phases=walk.found,
        token_counter=counter.name,
        caching=caching,
        prices=prices,
    )
