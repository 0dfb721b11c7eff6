"""What an extraction would spend, worked out before any call: `estimate_extraction`.

`tag extract --estimate` prints it: per phase, the LLM calls and the input and
output tokens `extract_rules` would spend on the documents, and dollars at the
prices given. It needs no model and no API key, calls nothing and writes nothing.

It is a dry run: `aextract_rules` itself runs on the documents with a
`metering.MeteringChatModel` in place of the model, so the sectioning, batching,
prompts and phase 4's plan are the run's own, and each request is billed as a
provider would bill it (tokens by `usage.token_counter`: tiktoken's cl100k_base,
offline, or about 4 characters a token; cached input under `usage.PromptCaching`).
The stand-in answers each phase from its prompt (`extraction_answers`):

- Phase 1 (spans): a span for each normative sentence, one with a cue word (must,
  should, never, avoid, ...; `NORMATIVE_CUES`). Calls and input tokens are exact:
  one call a section, whatever the model answers.
- Phase 2 (atomic units): a unit a span; its calls and prompts follow from phase
  1's answers, so they are estimated.
- Phase 3 (rules): a rule a unit, in the rule schema's fields, each as long as its
  unit, every rule tagged `general`.
- Phase 4 (relations): one relation a call. The tags are unknown before phase 3,
  and one tag shared by all the rules makes the most pairs: the calls are the
  run's plan (`pairs.plan_comparisons`) for that case. Not a bound: rules spread
  over many small tags make more, smaller calls, at most
  `pairs.comparison_calls_bound` (3 x the pairs); the row says so with its figure.
- Recovery (phase 5's re-extraction): the stand-in's rules cover every span, so
  the dry run makes none; the row prices a stated case instead, every span left
  uncovered and sent back through phase 3 once, one call a section with spans
  (none of it cached). The run's calls are at most one a section.

A skipped phase costs nothing and the run puts its own stand-in records in its
place (paragraphs for spans, spans as units, units as rules); with phase 3 skipped
the rules and their tags are known, and phase 4's calls are exactly the run's. Not
counted: retries after errors, and answers that could not be read, asked again by
a re-run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult
from pydantic import BaseModel, Field

from langchain_tag._delimiters import escape_delimiters
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
from langchain_tag.extraction.pairs import comparison_calls_bound
from langchain_tag.extraction.phases import SpanRecord
from langchain_tag.extraction.report import ExtractionReport
from langchain_tag.extraction.run import _as_documents, aextract_rules
from langchain_tag.extraction.sectioning import Section
from langchain_tag.metering import Answer, MeteringChatModel, run_to_end
from langchain_tag.rule_schemas import RuleSchema
from langchain_tag.usage import (
    DEFAULT_CACHING,
    MESSAGE_OVERHEAD,
    REPLY_OVERHEAD,
    PromptCaching,
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
    "extraction_answers",
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


# --- the stand-in's answers, as the prompts ask for them ------------------------------

_SECTION = re.compile(r"<section>\n(.*)\n</section>", re.DOTALL)
_LISTED = re.compile(r"^([A-Z]-\d{3}): ", re.MULTILINE)
_PHASES = {
    "You find the normative statements": "spans",
    "You split normative statements": "atomics",
    "You turn atomic normative units": "rules",
    "You compare operational rules": "relations",
}
"""Each LLM phase's system prompt opens with one of these: the prompt's phase."""


def _phase(messages: Sequence[BaseMessage]) -> str | None:
    system = messages[0].text if messages else ""
    return next((row for start, row in _PHASES.items() if start in system), None)


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _words(text: str, count: int) -> str:
    return " ".join(text.split()[:count])


def _listed(prompt: str) -> list[tuple[str, str]]:
    """(local id, text) of a prompt's `X-001: text` lines; a text may span lines."""
    parts = _LISTED.split(prompt)  # before, id, text, id, text, ...
    return [
        (local, text.removesuffix("\n"))
        for local, text in zip(parts[1::2], parts[2::2], strict=True)
    ]


def _spans_answer(spans: Sequence[SpanRecord]) -> str:
    return _json(
        {
            "spans": [
                {
                    "span_id": f"S-{n:03d}",
                    "text": s.text,
                    "normative_type": "requirement",
                    "context_summary": _words(s.text, _SUMMARY_WORDS),
                }
                for n, s in enumerate(spans, 1)
            ]
        }
    )


def _units_answer(spans: Sequence[tuple[str, str]]) -> str:
    return _json(
        {
            "atomic_units": [
                {
                    "atomic_id": f"A-{n:03d}",
                    "source_span_id": span_id,
                    "text": text,
                    "original_text": text,
                    "was_split": False,
                    "split_rationale": None,
                }
                for n, (span_id, text) in enumerate(spans, 1)
            ]
        }
    )


def _rules_answer(units: Sequence[tuple[str, str, str]], schema: RuleSchema) -> str:
    return _json(
        {
            "rules": [
                {
                    "atomic_id": atomic_id,
                    "rule_name": _words(text, _NAME_WORDS),
                    **{f.name: text for f in schema.fields},
                    "source_text": original,
                    "category_tags": ["general"],
                }
                for atomic_id, text, original in units
            ]
        }
    )


def _relations_answer(rule_ids: Sequence[str]) -> str:
    return _json(
        {
            "relations": [
                {
                    "rule_i": rule_ids[0],
                    "rule_j": rule_ids[-1],
                    "relationship": "overlap",
                    "preferred_action": "keep_both",
                    "explanation": "Both rules can apply to one input, and neither "
                    "contains the other.",
                }
            ]
            if len(rule_ids) > 1
            else []
        }
    )


def extraction_answers(sections: Iterable[Section], schema: RuleSchema) -> Answer:
    """The dry run's model: each extraction phase answered from its prompt.

    Spans are the normative sentences of the section in the prompt (found among
    `sections` by its text, as the prompt escapes it); a unit a listed span, a
    rule a listed unit (tagged `general`), one relation a group of rules. A text
    the prompt escaped is answered as the document has it, so the run reads the
    answers back as it reads a faithful model's.
    """
    # Each section's spans are found once: phase 1's answer is them.
    spans_of: dict[str, list[SpanRecord]] = {}
    originals: dict[str, str] = {}
    for section in sections:
        spans = spans_of.setdefault(
            escape_delimiters(section.text), _normative_spans(section)
        )
        for span in (*spans, *phases.whole_section_spans(section)):
            originals.setdefault(escape_delimiters(span.text), span.text)

    def answer(messages: Sequence[BaseMessage]) -> str:
        prompt = messages[-1].text if messages else ""
        phase = _phase(messages)
        if phase == "spans":
            found = _SECTION.search(prompt)
            return _spans_answer(spans_of.get(found.group(1), []) if found else [])
        listed = [(local, originals.get(t, t)) for local, t in _listed(prompt)]
        if phase == "atomics":
            return _units_answer(listed)
        if phase == "rules":
            units = []
            for local, row in listed:
                text, _, original = row.partition(" | ")
                units.append((local, originals.get(text, text), original))
            return _rules_answer(units, schema)
        rule_ids = [line.split(" | ", 1)[0] for line in prompt.splitlines()]
        return _relations_answer([i for i in rule_ids if "/R-" in i])

    return answer


# --- metering -------------------------------------------------------------------------


class _PhaseUsage(BaseCallbackHandler):
    """The usage each phase's calls report, told apart by their system prompt."""

    run_inline = True

    def __init__(self) -> None:
        self.phase_of: dict[UUID, str] = {}
        self.usage: dict[str, TokenUsage] = {}

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        phase = _phase(messages[0]) if messages else None
        if phase is not None:
            self.phase_of[run_id] = phase

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        phase = self.phase_of.pop(run_id, None)
        if phase is None:
            return
        message = getattr(response.generations[0][0], "message", None)
        usage = getattr(message, "usage_metadata", None) or {}
        details = usage.get("input_token_details") or {}
        self.usage[phase] = self.usage.get(phase, TokenUsage()) + TokenUsage(
            calls=1,
            input_tokens=usage.get("input_tokens", 0),
            cached_input_tokens=details.get("cache_read", 0),
            output_tokens=usage.get("output_tokens", 0),
        )

    def phase(self, row: str, basis: Basis, how: str) -> PhaseEstimate:
        usage = self.usage.get(row, TokenUsage())
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


def _recovery(
    spans: Sequence[Sequence[SpanRecord]],
    sections: int,
    domain: str,
    schema: RuleSchema,
    counter: TokenCounter,
) -> PhaseEstimate:
    """Every span sent back through phase 3 once, one call a section with spans.

    A prompt is asked once, as the run asks it (sections of the same text).
    """
    usage = TokenUsage()
    asked: set[tuple[str, ...]] = set()
    for found in spans:
        units = [phases.atomic_from_span(s, n) for n, s in enumerate(found, 1)]
        messages = phases.rule_messages(units, domain, schema)
        if (key := tuple(m.text for m in messages)) in asked:
            continue
        asked.add(key)
        answer = _rules_answer(
            [(f"A-{n:03d}", u.text, u.original_text) for n, u in enumerate(units, 1)],
            schema,
        )
        usage += TokenUsage(
            calls=1,
            input_tokens=counter.messages(messages),
            cached_input_tokens=0,
            output_tokens=counter.count(answer),
        )
    return PhaseEstimate(
        calls=usage.calls,
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        basis="estimated",
        how=f"as if all {sum(map(len, spans)):,} spans estimated for phase 1 were "
        "left uncovered and sent back through phase 3 once, one call a section with "
        f"spans ({len(spans):,}, each distinct prompt asked once); the run's depend "
        "on the spans its phase 1 finds: at most one call a section "
        f"({sections:,}).",
    )


def _relations_how(
    report: ExtractionReport,
    rules: int,
    settings: ExtractionSettings,
    *,
    known: bool,
) -> str:
    cap, limit = settings.max_pairs, settings.rules_per_comparison
    plan = (
        f"{report.candidate_pairs:,} candidate pairs, {report.pairs_compared:,} "
        f"compared in calls of at most {limit} rules (rules_per_comparison); one "
        "relation a call"
    )
    if known:
        return (
            f"the run's plan for the {rules:,} rules phase 3's stand-in makes: {plan}."
        )
    possible = report.pairs_possible
    capped = cap is not None and possible > cap
    pairs = f"up to {possible:,} pairs"
    if capped:
        pairs = f"the {cap:,} most similar (max_pairs={cap}, --max-pairs) of {pairs}"
    over_cap = (
        f"; over the cap, at most {cap:,}/{math.ceil((max(limit, 2) - 1) / 2)} "
        "plus one per tag holding a chosen pair"
        if capped
        else ""
    )
    chosen = possible if cap is None else min(cap, possible)
    return (
        f"{pairs}, those of the {rules:,} rules assumed. Tags are unknown before "
        "phase 3: the calls are the run's plan if all the rules shared one tag, "
        f"{plan}. Rules spread over many small tags make more, smaller calls: at "
        f"most {comparison_calls_bound(possible, cap):,} calls ({phases.MAX_TAGS} "
        f"x {chosen:,} pairs: one call at most per pair per tag it shares, and a "
        f"rule has {phases.MAX_TAGS} tags at most{over_cap})."
    )


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
    skips = run.skip_phases
    counter = token_counter()
    ids = [d.document_id for d in source_documents(docs)]
    sections = [
        section
        for doc, document_id in zip(docs, ids, strict=True)
        for section in document_sections(
            doc, document_id, max_tokens=run.max_section_tokens
        )
    ]
    model = MeteringChatModel(
        answer=extraction_answers(sections, run.schema),
        counter=counter,
        caching=caching,
        in_flight=max_concurrency,
        keep=_KEEP_PROMPTS,
    )
    metered = _PhaseUsage()
    rulebook = run_to_end(
        aextract_rules(
            docs,
            llm=model,
            domain=domain,
            skip_phases=skips,
            checkpoint=None,
            max_concurrency=max_concurrency,
            callbacks=[metered],
            **settings,
        )
    )
    report = ExtractionReport.model_validate(rulebook.diagnostics)
    spans = [
        found
        for section in sections
        if (
            found := phases.whole_section_spans(section)
            if SPAN_DETECTION in skips
            else _normative_spans(section)
        )
    ]
    possible = report.pairs_possible
    rules = (1 + math.isqrt(1 + 8 * possible)) // 2 if possible else report.rules
    hows = {
        "spans": (
            SPAN_DETECTION,
            (
                "one call a section, its prompt rendered; answered with the "
                f"{sum(map(len, spans)):,} sentences holding a cue word (must, should, "
                "never, avoid, ...) as spans."
            ),
        ),
        "atomics": (
            DECOMPOSITION,
            "one call a section with spans, rendered with them; a unit a span.",
        ),
        "rules": (
            OPERATIONALISATION,
            (
                f"a call for every {run.units_per_call} units of a section "
                "(units_per_call), rendered with them; a rule a unit in the "
                f"{run.schema.name!r} schema's fields."
            ),
        ),
        "relations": (
            RELATIONS,
            _relations_how(report, rules, run, known=OPERATIONALISATION in skips),
        ),
    }
    rows: dict[str, PhaseEstimate] = {}
    for row, (number, how) in hows.items():
        # A phase's prompts are known when every LLM phase before it was skipped.
        known = set(range(SPAN_DETECTION, number)) <= skips
        rows[row] = (
            _skipped(number)
            if number in skips
            else metered.phase(row, "exact" if known else "estimated", how)
        )
    if skipped := sorted(skips & {OPERATIONALISATION, VERIFICATION}):
        rows["recovery"] = _skipped(skipped[0])
    else:
        rows["recovery"] = _recovery(spans, len(sections), domain, run.schema, counter)
    cap = run.max_pairs
    chosen = possible if cap is None else min(cap, possible)
    return ExtractionEstimate(
        domain=domain,
        documents=len(docs),
        sections=len(sections),
        normative_sentences=sum(map(len, spans)),
        rules=rules,
        rule_pairs=possible,
        max_pairs=cap,
        pairs=0 if RELATIONS in skips else chosen,
        phases=rows,
        token_counter=counter.name,
        caching=caching,
        prices=prices,
    )
