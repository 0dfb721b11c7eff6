"""Stage 2: pairwise applicability matching.

One LLM judgment per (input, rule): does the input satisfy the rule's condition? The
judge sees the rule's id, name, condition and tags (or the fields its rule-schema
profile names), never the action, and answers at temperature 0.

A judgment that fails after its retries is never silently a NO: the judge either
raises `JudgmentError` or, under `on_error="not_applicable"`, returns a verdict whose
`error` is set and warns with `UnreliableMatchWarning`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import hashlib
import itertools
import json
import math
import random
import re
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple, cast

import httpx
from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableSerializable,
    ensure_config,
)
from langchain_core.runnables.config import ContextThreadPoolExecutor
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from langchain_tag import prompts
from langchain_tag._concurrency import ConcurrencyLimiter
from langchain_tag.cache import InMemoryVerdictCache, VerdictCache
from langchain_tag.models import with_settings
from langchain_tag.rules import Rule


class Verdict(BaseModel):
    """The outcome of judging one rule against one input."""

    model_config = ConfigDict(frozen=True)

    rule_id: str
    applies: bool
    score: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="P(YES) / (P(YES) + P(NO)) from the model's logprobs, if any.",
    )
    reason: str | None = None
    error: str | None = Field(
        default=None,
        description="Why the judgment failed; `applies` is then False by policy only.",
    )
    cached: bool = False
    decided_by: str | None = Field(
        default=None,
        description="The stage of a `CascadeJudge` that decided (`cheap` or "
        "`strong`); None for a single judge.",
    )

    @property
    def failed(self) -> bool:
        """True if the judgment failed and `applies` was decided by the error policy."""
        return self.error is not None


class JudgmentError(RuntimeError):
    """A judgment failed after its retries under `on_error="raise"`.

    `transient` tells whether the last error was one worth retrying later (a rate
    limit, a timeout): an outer retry, such as a LangGraph node's, may try again.
    """

    def __init__(self, rule_id: str, error: str, *, transient: bool = False) -> None:
        """Record which rule's judgment failed and why."""
        self.rule_id = rule_id
        self.error = error
        self.transient = transient
        super().__init__(
            f"Judging rule {rule_id!r} failed: {error}. Nothing was assumed about it; "
            "retry later, or set on_error='not_applicable' to continue with such "
            "rules flagged as unjudged."
        )


class UnreliableMatchWarning(UserWarning):
    """Some judgments failed and were treated as not applicable by policy."""


# --- Retries ------------------------------------------------------------------------

_TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    asyncio.TimeoutError,
    ConnectionError,
    httpx.TimeoutException,
    httpx.NetworkError,
)
"""Errors retried by default. Also retried: any error carrying a 408/429/5xx
`status_code` (rate limits and overloads of most providers' SDKs) and the OpenAI SDK's
connection and timeout errors."""


def _is_openai_connection_error(error: BaseException) -> bool:
    # Looked up only if the SDK is loaded: importing it costs ~0.8 s, and an error
    # from it implies it is.
    openai = sys.modules.get("openai")
    return openai is not None and isinstance(error, openai.APIConnectionError)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient model errors."""

    max_attempts: int = 4
    initial_delay: float = 1.0
    backoff: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.25
    retry_on: tuple[type[BaseException], ...] = field(default=TRANSIENT_ERRORS)

    def is_transient(self, error: BaseException) -> bool:
        """Whether `error` is worth retrying."""
        if isinstance(error, self.retry_on) or _is_openai_connection_error(error):
            return True
        if isinstance(error, JudgmentError):
            return error.transient
        return getattr(error, "status_code", None) in _TRANSIENT_STATUS

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.max_delay, self.initial_delay * self.backoff ** (attempt - 1))
        return base * (1 + self.jitter * random.random())  # noqa: S311 - not crypto


# --- Rule-schema profiles -----------------------------------------------------------


class YesNoOutput(BaseModel):
    """Structured output of the condition profile."""

    verdict: Literal["YES", "NO"]


class ApplicableOutput(BaseModel):
    """Structured output of the constraint profile."""

    applicable: bool
    reason: str


class RuleSchemaProfile(BaseModel):
    """What the judge sees of a rule, what it is told, and what it must answer.

    The default profile shows `rule_id, name, condition, tags` and asks for YES/NO.
    Domain profiles (like the paper's NBA matcher) show other rule fields and ask for
    a boolean with a one-sentence reason. No profile may show the action.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    system_prompt: str
    output_instruction: str
    rule_fields: tuple[str, ...]
    output_schema: type[YesNoOutput | ApplicableOutput]

    @model_validator(mode="after")
    def _never_the_action(self) -> RuleSchemaProfile:
        if "action" in self.rule_fields:
            msg = "a rule-schema profile must not show the rule's action to the judge"
            raise ValueError(msg)
        unknown = set(self.rule_fields) - set(Rule.model_fields)
        if unknown:
            msg = f"unknown rule fields in profile {self.name!r}: {sorted(unknown)}"
            raise ValueError(msg)
        return self

    def judged_fields(self, rule: Rule) -> list[tuple[str, str]]:
        """The (label, value) pairs the judge sees for `rule`, empty ones left out."""
        pairs = []
        for name in self.rule_fields:
            value = getattr(rule, name)
            if name == "applies_when" and not value:
                value = rule.condition  # rules without profile fields still judge
            if isinstance(value, tuple):
                value = ", ".join(value)
            if value:
                pairs.append((name, str(value)))
        return pairs


CONDITION_PROFILE = RuleSchemaProfile(
    name="condition",
    system_prompt=prompts.JUDGE_SYSTEM,
    output_instruction=prompts.JUDGE_OUTPUT_INSTRUCTION,
    rule_fields=("rule_id", "name", "condition", "tags"),
    output_schema=YesNoOutput,
)
"""The method's default matcher: YES/NO on the rule's observable condition."""


def constraint_profile(
    name: str = "constraint", domain_criteria: Sequence[str] = ()
) -> RuleSchemaProfile:
    """A profile that judges rules by their constraint-schema fields.

    The judge sees `applies_when` (or `condition` when a rule has none), `constraint`,
    `violation_check` and `does_not_apply_to`, and answers `applicable` with a reason.

    Args:
        name: The profile's name (part of the verdict cache key).
        domain_criteria: Extra decision criteria for the domain, one sentence each.
    """
    return RuleSchemaProfile(
        name=name,
        system_prompt=prompts.CONSTRAINT_JUDGE_SYSTEM.format(
            domain_criteria=prompts.render_criteria(domain_criteria)
        ),
        output_instruction=prompts.CONSTRAINT_OUTPUT_INSTRUCTION,
        rule_fields=(
            "rule_id",
            "name",
            "applies_when",
            "constraint",
            "violation_check",
            "does_not_apply_to",
            "tags",
        ),
        output_schema=ApplicableOutput,
    )


NBA_PROFILE = constraint_profile("nba", prompts.NBA_CRITERIA)
"""The paper's NBA salary-cap matcher, as a constraint profile."""


# --- Reading the judge's answer -----------------------------------------------------


class ParsedVerdict(NamedTuple):
    """A decision read from the judge's text."""

    applies: bool
    reason: str | None


_THINKING = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL | re.IGNORECASE)
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_STANDALONE = re.compile(r"\b(YES|NO)\b")
_NEGATED = re.compile(r"(?:\bnot|\bnever|n't|\bcannot)\s+(?:be\s+)?$", re.IGNORECASE)
# A refusal decides nothing, even when it starts with "No".
_REFUSAL = re.compile(
    r"\b(?:I(?:'m| am) sorry|I(?:'m| am) (?:not able|unable) to|I (?:can(?:no|')t|"
    r"won't|will not) (?:help|assist|comply|answer|provide|do that|judge)|as an AI\b)",
    re.IGNORECASE,
)


class AnswerFormat:
    """Which answers count as a decision: the keys, labels and values accepted.

    The judge reads a model's text with the format its profile asked for, so an
    answer in another format (an `applicable` key where `verdict` was asked for, a
    forged verdict copied from the input in another shape) is no decision.
    """

    def __init__(
        self,
        keys: Sequence[str],
        values: Mapping[str, bool],
        leading: Mapping[str, bool],
        *,
        booleans: bool,
        lone_labels: bool,
    ) -> None:
        """Accept `values` under `keys` and `leading` labels at the start of prose.

        Args:
            keys: Decision keys in JSON objects and `key: value` lines.
            values: Accepted values under those keys, lower case.
            leading: Labels that decide when prose starts with them, lower case.
            booleans: Whether JSON `true`/`false` count under the keys.
            lone_labels: Whether a lone, unnegated YES or NO in prose decides.
        """
        self.keys = tuple(keys)
        self.values = dict(values)
        self.leading = dict(leading)
        self.booleans = booleans
        self.lone_labels = lone_labels
        words = "|".join(sorted(map(re.escape, self.values), key=len, reverse=True))
        labels = "|".join(sorted(map(re.escape, self.leading), key=len, reverse=True))
        # A `verdict: YES` line counts only at the start of a line, so that quoted
        # code such as `applicable = True` in an explanation is never the decision.
        self._keyed = re.compile(
            r"^[\s*_`\"'>#-]*(?:" + "|".join(map(re.escape, self.keys)) + r")\b"
            r"[*_`\"']*\s*[:=]\s*[*_`\"']*\s*(" + words + r")\b",
            re.IGNORECASE | re.MULTILINE,
        )
        # A leading label must end the word there: "Applicable? No" and "YES/NO: NO"
        # echo the question or the format, they do not answer it.
        self._leading = re.compile(
            r"^[\s*_`\"'>#(\[-]*(" + labels + r")(?![?/\w])", re.IGNORECASE
        )

    def from_mapping(self, obj: object) -> ParsedVerdict | None:
        """The decision a parsed JSON value carries, if it is one of ours."""
        if not isinstance(obj, dict):
            return None
        reason = obj.get("reason")
        reason = reason.strip() or None if isinstance(reason, str) else None
        for key in self.keys:
            value = obj.get(key)
            if isinstance(value, bool) and self.booleans:
                return ParsedVerdict(value, reason)
            if isinstance(value, str) and value.strip().lower() in self.values:
                return ParsedVerdict(self.values[value.strip().lower()], reason)
        return None

    def from_prose(self, text: str) -> ParsedVerdict | None:
        """The decision of text without a JSON one: a leading label, a keyed line."""
        keyed = self._keyed.search(text)
        if keyed and keyed.start() == 0:  # "applicable: false" is not "applicable"
            return ParsedVerdict(self.values[keyed.group(1).lower()], None)
        leading = self._leading.match(text)
        if leading:
            rest = text[leading.end() :].strip(" \t\n,.:;-*_`\"'")
            return ParsedVerdict(
                self.leading[leading.group(1).lower()], rest[:500] or None
            )
        if keyed:
            return ParsedVerdict(self.values[keyed.group(1).lower()], None)
        return _lone_label(text) if self.lone_labels else None


_YES_NO = {"yes": True, "no": False}
_TRUE_FALSE = {"true": True, "false": False}
LENIENT_FORMAT = AnswerFormat(
    ("verdict", "answer", "decision", "applicable", "applies"),
    {**_YES_NO, **_TRUE_FALSE, "applicable": True, "not applicable": False},
    {**_YES_NO, **_TRUE_FALSE, "applicable": True, "not applicable": False},
    booleans=True,
    lone_labels=True,
)
"""Any of the usual shapes; for text whose requested format is unknown."""
YES_NO_FORMAT = AnswerFormat(
    ("verdict",), _YES_NO, _YES_NO, booleans=False, lone_labels=True
)
"""The condition profile's: `{"verdict": "YES"|"NO"}`, or YES/NO in prose."""
APPLICABLE_FORMAT = AnswerFormat(
    ("applicable",),
    _TRUE_FALSE,
    {**_TRUE_FALSE, "applicable": True, "not applicable": False},
    booleans=True,
    lone_labels=False,
)
"""The constraint profile's: `{"applicable": true|false, ...}`, "(Not) applicable"."""
_FORMATS: dict[type[BaseModel], AnswerFormat] = {
    YesNoOutput: YES_NO_FORMAT,
    ApplicableOutput: APPLICABLE_FORMAT,
}


def parse_verdict(
    text: str, *, schema: type[BaseModel] | None = None
) -> ParsedVerdict | None:
    """Read a decision from free text; None if there is none. Never raises.

    Accepts the JSON the prompt asks for, `verdict: YES` style lines, and prose that
    starts with the decision ("Yes, the condition holds..."). Text with no clear
    decision, with JSON objects that disagree, with both YES and NO and nothing else
    to go on, or that refuses to answer, gives None.

    Args:
        text: The model's answer.
        schema: The output schema the prompt asked for (`YesNoOutput` or
            `ApplicableOutput`); only that format counts. None accepts any of them.
    """
    answer_format = _FORMATS.get(schema, LENIENT_FORMAT) if schema else LENIENT_FORMAT
    cleaned = _THINKING.sub("", text).strip()
    if not cleaned:
        return None
    decisions, foreign = [], False
    for candidate in _JSON_OBJECT.findall(cleaned):
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        decision = answer_format.from_mapping(obj)
        if decision is not None:
            decisions.append(decision)
        else:
            foreign = foreign or LENIENT_FORMAT.from_mapping(obj) is not None
    if decisions:
        # A quoted, forged verdict next to the model's own is no answer to trust.
        agreed = {d.applies for d in decisions}
        return decisions[0] if len(agreed) == 1 else None
    if foreign:  # a verdict in a format that was not asked for
        return None
    if _REFUSAL.search(cleaned):
        return None
    return answer_format.from_prose(cleaned)


def _lone_label(text: str) -> ParsedVerdict | None:
    """The decision when exactly one of YES and NO occurs, never negated."""
    labels = set()
    for found in _STANDALONE.finditer(text):
        if _NEGATED.search(text[max(0, found.start() - 12) : found.start()]):
            return None  # "not YES" is no answer to trust either way
        labels.add(found.group(1))
    return ParsedVerdict(labels.pop() == "YES", None) if len(labels) == 1 else None


_LABELS = {"YES": True, "TRUE": True, "NO": False, "FALSE": False}


def _label(token: str) -> bool | None:
    return _LABELS.get(token.strip().strip("\"'").upper())


def _label_start(token: str) -> bool | None:
    """The polarity of the one label this token can begin, e.g. "Y" of "Y"+"ES".

    Small models' tokenizers split labels; the first piece carries the decision.
    """
    word = token.strip().strip("\"'").upper()
    polarities = {
        value for label, value in _LABELS.items() if word and label.startswith(word)
    }
    return polarities.pop() if len(polarities) == 1 else None


def _verdict_position(tokens: Sequence[str], start: int) -> int | None:
    """Index of the first token after `start` characters that begins a whole label."""
    offset = 0
    for index, token in enumerate(tokens):
        offset += len(token)
        polarity = _label_start(token)
        if offset <= start or polarity is None:
            continue
        word = token
        for end in range(index + 1, len(tokens) + 1):
            after = tokens[end][:1] if end < len(tokens) else ""
            # A whole word: "NO" followed by "T" is "NOT", not a verdict.
            if _label(word) == polarity and not after.isalpha():
                return index
            if not after.isalpha():
                break
            word += tokens[end]
    return None


def score_from_logprobs(message: BaseMessage) -> float | None:
    """P(YES) / (P(YES) + P(NO)) at the verdict token, from OpenAI-style logprobs.

    Reads `response_metadata["logprobs"]["content"]`: the first verdict label after
    any `<think>` block (its first token when the tokenizer splits it, as "Y" + "ES"),
    and that token's `top_logprobs` alternatives. Returns None when the model
    returned no usable logprobs or no verdict token; never raises.
    """
    logprobs = message.response_metadata.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else logprobs
    if not isinstance(content, list):
        return None
    entries = [e for e in content if isinstance(e, Mapping)]
    tokens = [str(e.get("token", "")) for e in entries]
    # The decision follows a reasoning model's thinking; labels inside it are not it.
    position = _verdict_position(tokens, _end_of_thinking("".join(tokens)))
    if position is None:
        return None
    entry = entries[position]
    mass = {True: 0.0, False: 0.0}
    alternatives = entry.get("top_logprobs") or [entry]
    for alternative in alternatives if isinstance(alternatives, list) else []:
        if not isinstance(alternative, Mapping):
            continue
        label = _label_start(str(alternative.get("token", "")))
        logprob = alternative.get("logprob")
        if label is not None and isinstance(logprob, int | float):
            mass[label] += math.exp(logprob)
    total = mass[True] + mass[False]
    return None if total == 0 else mass[True] / total


def _end_of_thinking(text: str) -> int:
    closing = list(re.finditer(r"</think(?:ing)?>", text, re.IGNORECASE))
    return closing[-1].end() if closing else 0


# --- The judge ----------------------------------------------------------------------

JudgeInput = tuple[str, Rule] | Mapping[str, Any]
"""`(input, rule)` or `{"input": ..., "rule": ...}`."""


def _unpack(request: JudgeInput) -> tuple[str, Rule]:
    text: object
    rule: object
    if isinstance(request, tuple) and len(request) == 2:  # noqa: PLR2004
        text, rule = request
    elif isinstance(request, Mapping) and {"input", "rule"} <= request.keys():
        text, rule = request["input"], request["rule"]
    else:
        msg = "The judge takes (input, rule) or {'input': str, 'rule': Rule}."
        raise TypeError(msg)
    if not isinstance(text, str) or not isinstance(rule, Rule):
        msg = (
            "The judge takes a str input and a langchain_tag.Rule, got "
            f"{type(text).__name__} and {type(rule).__name__}."
        )
        raise TypeError(msg)
    return text, rule


_ENDPOINT_FIELDS = ("openai_api_base", "base_url", "api_base", "endpoint_url", "host")


def model_identity(llm: BaseChatModel) -> str:
    """A string naming the model, its settings and its endpoint, for cache keys.

    The endpoint matters: two OpenAI-compatible servers may serve different models
    under one name, and `_identifying_params` leaves the address out.
    """
    params = dict(llm._identifying_params)  # noqa: SLF001 - the public-facing identity
    for name in _ENDPOINT_FIELDS:
        value = getattr(llm, name, None)
        if isinstance(value, str) and value:
            params[f"endpoint:{name}"] = value
    return f"{type(llm).__module__}.{type(llm).__qualname__}:" + json.dumps(
        params, sort_keys=True, default=str
    )


def _supports_structured_output(llm: BaseChatModel) -> bool:
    cls = type(llm)
    return (
        cls.with_structured_output is not BaseChatModel.with_structured_output
        or cls.bind_tools is not BaseChatModel.bind_tools
    )


_MAX_THREADS = 64

_FAN_OUT_FAILED: contextvars.ContextVar[threading.Event | None] = (
    contextvars.ContextVar("tag_fan_out_failed", default=None)
)
"""In `judge_rules`' workers: set once a judgment of the fan-out failed for good."""


class _Abandoned(Exception):  # noqa: N818 - never raised to callers
    """A judgment given up because another one of its fan-out failed for good."""


def _give_up_if_abandoned() -> None:
    failed = _FAN_OUT_FAILED.get()
    if failed is not None and failed.is_set():
        raise _Abandoned


class ApplicabilityJudge(RunnableSerializable[JudgeInput, Verdict]):
    """A Runnable that judges whether an input satisfies one rule's condition.

    Works with any `BaseChatModel`: structured output where the model supports it,
    otherwise a lenient text parser. Each call is one model call (never several rules
    in one prompt), at temperature 0 unless told otherwise.

    Example:
        ```python
        from langchain_openai import ChatOpenAI
        from langchain_tag import ApplicabilityJudge, Rule

        judge = ApplicabilityJudge(llm=ChatOpenAI(model="gpt-4o-mini"))
        rule = Rule(
            rule_id="R-1",
            name="No wildcard imports",
            condition="A wildcard import (from <module> import *) is used",
            action="Replace the wildcard import with explicit imports",
        )
        judge.invoke(("from os import *", rule))
        # Verdict(rule_id='R-1', applies=True, ...)
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: BaseChatModel
    """The chat model that judges."""
    profile: RuleSchemaProfile = CONDITION_PROFILE
    """What the judge sees of each rule and how it answers."""
    structured_output: Literal["auto", "always", "never"] = "auto"
    """`auto`: structured output when the model implements it, else text parsing."""
    temperature: float | None = 0.0
    """Set on a copy of the model when it has a `temperature` field; None leaves it."""
    logprobs: bool = False
    """Ask for logprobs (models with a `logprobs` field, e.g. ChatOpenAI) and score."""
    top_logprobs: int = 5
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    on_error: Literal["raise", "not_applicable"] = "raise"
    """After retries: raise `JudgmentError`, or flag the verdict and treat it as NO."""
    cache: VerdictCache | None = Field(default_factory=InMemoryVerdictCache)
    """Where verdicts are remembered; None disables caching."""

    _model: Runnable[Any, Any] = PrivateAttr()
    _structured: bool = PrivateAttr(default=False)
    _key_prefix: str = PrivateAttr(default="")

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        model = self._configured_model()
        self._key_prefix = json.dumps(
            [
                prompts.PROMPT_VERSION,
                self.profile.name,
                hashlib.sha256(
                    json.dumps(
                        [
                            self.profile.system_prompt,
                            self.profile.output_instruction,
                            self.profile.output_schema.__name__,
                        ]
                    ).encode()
                ).hexdigest(),
                model_identity(model),
            ]
        )
        self._model, self._structured = self._output_runnable(model)

    def _configured_model(self) -> BaseChatModel:
        logprobs = (
            {"logprobs": True, "top_logprobs": self.top_logprobs}
            if self.logprobs
            else {}
        )
        model, unsupported = with_settings(
            self.llm, temperature=self.temperature, **logprobs
        )
        if "logprobs" in unsupported:
            msg = (
                f"logprobs=True needs a model with a 'logprobs' option; "
                f"{type(self.llm).__name__} has none. Use logprobs=False (verdicts "
                "then carry no score)."
            )
            raise ValueError(msg)
        return model

    def _output_runnable(self, model: BaseChatModel) -> tuple[Runnable[Any, Any], bool]:
        wanted = self.structured_output == "always" or (
            self.structured_output == "auto" and _supports_structured_output(model)
        )
        if wanted:
            try:
                schema = self.profile.output_schema
                return model.with_structured_output(schema, include_raw=True), True
            except NotImplementedError:
                if self.structured_output == "always":
                    msg = (
                        f"{type(model).__name__} does not support structured output; "
                        "use structured_output='auto' or 'never'."
                    )
                    raise ValueError(msg) from None
        return model, False

    # -- prompt -----------------------------------------------------------------------

    question: ClassVar[str] = prompts.JUDGE_QUESTION
    """The user message's opening line: what to decide about the rule."""

    def judged_fields(self, rule: Rule) -> list[tuple[str, str]]:
        """The (label, value) pairs of `rule` in the prompt: the profile's, no action.

        Prompt, cache key and prefix share all follow this; only the relevance
        baseline (`langchain_tag.baselines.RelevanceJudge`) adds the action.
        """
        return self.profile.judged_fields(rule)

    def messages(self, text: str, rule: Rule) -> list[BaseMessage]:
        """The exact messages that judge `rule` against `text` (no action in them)."""
        return [
            SystemMessage(self.profile.system_prompt),
            HumanMessage(
                prompts.render_judge_user_message(
                    text,
                    self.judged_fields(rule),
                    self.profile.output_instruction,
                    self.question,
                )
            ),
        ]

    def prefix_share(self, text: str, rules: Sequence[Rule]) -> float:
        """Share of prompt characters that all judgments of `text` have in common.

        The system prompt and the input come before the rule, so this prefix is what a
        provider's prefix cache can reuse across the M judgments of one input. It is
        counted up to the end of the input block, a lower bound.
        """
        if not rules:
            return 0.0
        shared = len(self.profile.system_prompt) + len(
            prompts.render_judge_input(text, self.question)
        )
        rule_parts = sum(
            len(
                prompts.render_judge_rule(
                    self.judged_fields(rule), self.profile.output_instruction
                )
            )
            for rule in rules
        )
        return shared / (shared + rule_parts / len(rules))

    def cache_key(self, text: str, rule: Rule) -> str:
        """Key of a verdict: input, judged rule fields, profile, prompt and model."""
        payload = json.dumps(
            [self._key_prefix, _digest(text), self.judged_fields(rule)]
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    # -- one judgment -----------------------------------------------------------------

    def _from_output(self, rule: Rule, output: Any) -> Verdict:
        raw: BaseMessage = output["raw"] if self._structured else output
        parsed = output.get("parsed") if self._structured else None
        if isinstance(parsed, YesNoOutput):
            decision = ParsedVerdict(applies=parsed.verdict == "YES", reason=None)
        elif isinstance(parsed, ApplicableOutput):
            decision = ParsedVerdict(parsed.applicable, parsed.reason or None)
        else:
            calls = _tool_calls(raw)
            answer = raw.text or (
                json.dumps([c.get("args") for c in calls]) if calls else ""
            )
            parsed_text = parse_verdict(answer, schema=self.profile.output_schema)
            if parsed_text is None:
                # Deterministic at temperature 0, so not retried.
                return self._failed(rule, _unreadable(answer))
            decision = parsed_text
        score = score_from_logprobs(raw) if self.logprobs else None
        return Verdict(
            rule_id=rule.rule_id,
            applies=decision.applies,
            score=score,
            reason=decision.reason,
        )

    def _read(self, rule: Rule, output: Any) -> Verdict:
        # Whatever shape the output has, a failure to read it is a failed judgment.
        try:
            return self._from_output(rule, output)
        except JudgmentError:
            raise
        except Exception as error:  # noqa: BLE001 - reported through the policy
            return self._failed(rule, f"unreadable judge output ({error!r})")

    def _failed(self, rule: Rule, error: str, *, transient: bool = False) -> Verdict:
        if self.on_error == "raise":
            raise JudgmentError(rule.rule_id, error, transient=transient)
        return Verdict(rule_id=rule.rule_id, applies=False, error=error)

    def _after_error(
        self, rule: Rule, error: Exception, attempt: int
    ) -> float | Verdict:
        """Seconds to wait before retrying, or the final failed verdict."""
        if self.retry.is_transient(error) and attempt < self.retry.max_attempts:
            return self.retry.delay(attempt)
        described = (
            f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        )
        return self._failed(
            rule,
            f"{described} (after {attempt} attempt(s))",
            transient=self.retry.is_transient(error),
        )

    # The judgment bodies take (input, run_manager, config) so that `invoke` can run
    # them inside a run of the judge's own; the fan-outs call them directly and let
    # each model call be the rule's run, which costs a layer of callbacks less.
    def _judge(
        self,
        request: JudgeInput,
        run_manager: CallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        text, rule = _unpack(request)
        key = self.cache_key(text, rule) if self.cache is not None else ""
        if self.cache is not None and (hit := self.cache.lookup(key)) is not None:
            return Verdict.model_validate_json(hit).model_copy(
                update={"cached": True, "rule_id": rule.rule_id}
            )
        messages = self.messages(text, rule)
        for attempt in itertools.count(1):
            # Under on_error="raise" a sibling's failure ends the fan-out: no retry.
            _give_up_if_abandoned()
            try:
                output = self._model.invoke(messages, config)
            except Exception as error:  # noqa: BLE001 - every failure is reported
                outcome = self._after_error(rule, error, attempt)
                if isinstance(outcome, Verdict):
                    return outcome
                time.sleep(outcome)
                continue
            verdict = self._read(rule, output)
            if self.cache is not None and not verdict.failed:
                self.cache.update(key, verdict.model_dump_json())
            return verdict
        raise AssertionError  # pragma: no cover - the loop always returns

    async def _ajudge(
        self,
        request: JudgeInput,
        run_manager: AsyncCallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        text, rule = _unpack(request)
        key = self.cache_key(text, rule) if self.cache is not None else ""
        if (
            self.cache is not None
            and (hit := await self.cache.alookup(key)) is not None
        ):
            return Verdict.model_validate_json(hit).model_copy(
                update={"cached": True, "rule_id": rule.rule_id}
            )
        messages = self.messages(text, rule)
        for attempt in itertools.count(1):
            try:
                output = await self._model.ainvoke(messages, config)
            except Exception as error:  # noqa: BLE001 - every failure is reported
                outcome = self._after_error(rule, error, attempt)
                if isinstance(outcome, Verdict):
                    return outcome
                await asyncio.sleep(outcome)
                continue
            verdict = self._read(rule, output)
            if self.cache is not None and not verdict.failed:
                await self.cache.aupdate(key, verdict.model_dump_json())
            return verdict
        raise AssertionError  # pragma: no cover - the loop always returns

    def invoke(
        self, input: JudgeInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Verdict:
        """Judge one (input, rule) pair."""
        verdict = self._call_with_config(self._judge, input, config, **kwargs)
        _warn_failures([verdict], 1)
        return verdict

    async def ainvoke(
        self, input: JudgeInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Verdict:
        """Judge one (input, rule) pair, asynchronously."""
        verdict = await self._acall_with_config(self._ajudge, input, config, **kwargs)
        _warn_failures([verdict], 1)
        return verdict

    # -- one input against many rules -------------------------------------------------

    def judge_rules(
        self,
        text: str,
        rules: Sequence[Rule],
        config: RunnableConfig | None = None,
        *,
        limiter: ConcurrencyLimiter | None = None,
    ) -> list[Verdict]:
        """Judge every rule against `text` in worker threads, in rule order.

        Under `on_error="raise"` the first failure stops the fan-out: judgments not
        started are dropped, running ones make no further attempt, and the error
        propagates.

        Args:
            text: The input.
            rules: The rules to judge, one model call each.
            config: Callbacks, tags and metadata for the judgments' runs.
            limiter: Caps judgments in progress; a shared limiter caps them across
                concurrent calls. Defaults to `config["max_concurrency"]`. A judgment
                holds its slot through its retries, so backing off also slows the
                pace against a rate-limited API.
        """
        config = ensure_config(config)
        limiter = limiter or ConcurrencyLimiter(config.get("max_concurrency"))
        if not rules:
            return []

        failed = threading.Event()

        def judge_one(rule: Rule) -> Verdict:
            with limiter.hold():
                _FAN_OUT_FAILED.set(failed)  # in this task's own copy of the context
                _give_up_if_abandoned()
                try:
                    return self._judge(
                        (text, rule), None, _judgment_config(config, rule)
                    )
                except _Abandoned:
                    raise
                except BaseException:
                    # Set here, before this worker takes the next queued rule.
                    failed.set()
                    raise

        workers = min(len(rules), limiter.limit or _MAX_THREADS)
        with ContextThreadPoolExecutor(max_workers=workers) as executor:
            futures = [executor.submit(judge_one, rule) for rule in rules]
            try:
                # The first failure is raised when it happens, not when the
                # judgments before it in rule order are done.
                concurrent.futures.wait(
                    futures, return_when=concurrent.futures.FIRST_EXCEPTION
                )
                for future in futures:
                    if future.done() and future.exception() is not None:
                        future.result()
                verdicts = [future.result() for future in futures]
            except BaseException:
                # Queued judgments are dropped; running ones stop before their
                # next attempt, so leaving the pool waits for at most one call or
                # backoff pause each.
                failed.set()
                for future in futures:
                    future.cancel()
                raise
        _warn_failures(verdicts, len(rules))
        return verdicts

    async def ajudge_rules(
        self,
        text: str,
        rules: Sequence[Rule],
        config: RunnableConfig | None = None,
        *,
        limiter: ConcurrencyLimiter | None = None,
    ) -> list[Verdict]:
        """Judge every rule against `text` concurrently, in rule order.

        See `judge_rules`. Under `on_error="raise"` the first failure cancels the
        judgments still waiting and propagates.
        """
        config = ensure_config(config)
        limiter = limiter or ConcurrencyLimiter(config.get("max_concurrency"))

        async def judge_one(rule: Rule) -> Verdict:
            # The slot is taken before any work, so queued judgments cost nothing.
            async with limiter.ahold():
                return await self._ajudge(
                    (text, rule), None, _judgment_config(config, rule)
                )

        tasks = [asyncio.ensure_future(judge_one(rule)) for rule in rules]
        try:
            verdicts = list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        _warn_failures(verdicts, len(rules))
        return verdicts


def _judgment_config(config: RunnableConfig, rule: Rule) -> RunnableConfig:
    # One model run per rule, named after it, so a trace reads like the fan-out.
    child = cast(
        "RunnableConfig",
        {
            **config,
            "run_name": f"judge:{rule.rule_id}",
            "metadata": {**config.get("metadata", {}), "tag_rule_id": rule.rule_id},
        },
    )
    child.pop("run_id", None)
    return child


@functools.lru_cache(maxsize=64)
def _digest(text: str) -> str:
    # One input is keyed against every rule; hash a long input once, not M times.
    return hashlib.sha256(text.encode()).hexdigest()


def _unreadable(answer: str) -> str:
    """Why an answer gave no verdict, for the failed verdict's `error`."""
    kind = (
        " (empty)"
        if not answer.strip()
        else " (a refusal)"
        if _REFUSAL.search(answer)
        else ""
    )
    return f"unparseable judge output{kind} {answer[:200]!r}"


def _tool_calls(message: BaseMessage) -> list[dict[str, Any]]:
    calls = getattr(message, "tool_calls", None)
    return list(calls) if isinstance(calls, list) else []


def _warn_failures(verdicts: Sequence[Verdict], total: int) -> None:
    failed = [v.rule_id for v in verdicts if v.failed]
    if failed:
        shown = ", ".join(failed[:10]) + (" ..." if len(failed) > 10 else "")  # noqa: PLR2004
        warnings.warn(
            f"{len(failed)} of {total} judgments failed and were treated as not "
            f"applicable (on_error='not_applicable'): {shown}. Their verdicts carry "
            "the error.",
            UnreliableMatchWarning,
            stacklevel=3,
        )
