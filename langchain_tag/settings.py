"""`MatchSettings`: the matching engine's options, declared once, for every face.

`TAGRetriever`, the query graph's `QueryContext`, `TAGMiddleware` and `tag run` all
take these options under these names and build their engine here
(`MatchSettings.build_engine`), so an option means the same in each, and a
misspelt one is refused with the list of known ones instead of being ignored.

The judge model may be a chat model (one judgment per call, or `rules_per_call` per
call), a decision model (`langchain_core.decisions.BaseDecisionModel`: every
candidate rule of an input as one question in one request), or a model string that
`langchain.chat_models.init_chat_model` takes (`"openai:gpt-5-mini"`), as
LangChain's middleware takes them.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Literal

from langchain_core.decisions import BaseDecisionModel
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.stores import BaseStore
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.engine import MatchEngine, MatchOptions, RuleFilter
from langchain_tag.errors import ModelNotConfiguredError
from langchain_tag.learning.shadow import check_rate
from langchain_tag.matching import ApplicabilityJudge, BaseJudge, VerdictSink
from langchain_tag.matching.decision import DecisionJudge
from langchain_tag.matching.profiles import CONDITION_PROFILE, RuleSchemaProfile
from langchain_tag.models import CallRetry, default_chat_model

__all__ = [
    "DECISION_MODEL_ENV_VAR",
    "JudgeModel",
    "MatchSettings",
    "build_judge",
    "decision_model",
]

JudgeModel = BaseChatModel | BaseDecisionModel | str
"""What judges: a chat model, a decision model, or an `init_chat_model` string."""

DECISION_MODEL_ENV_VAR = "TAG_DECISION_MODEL"
"""Names an OpenAI decision model (`gpt-6-luna`) to judge with, where the judge
comes from the environment (the Studio graphs, `tag` commands without a model)."""


def default_judge_model() -> BaseChatModel | BaseDecisionModel:
    """The judge model the environment configures.

    `OpenAIClassifier(model=$TAG_DECISION_MODEL)` when that is set (it reads
    `OPENAI_API_KEY` and `OPENAI_BASE_URL`), else `default_chat_model()`.

    Raises:
        ModelNotConfiguredError: Neither is configured.
    """
    name = os.environ.get(DECISION_MODEL_ENV_VAR) or None
    if name is None:
        return default_chat_model()
    return decision_model(name)


def decision_model(name: str) -> BaseDecisionModel:
    """`OpenAIClassifier(model=name)`, configured from the environment.

    `OPENAI_BASE_URL` (a compatible server) is honoured; a server that ignores the
    key still needs one, so a placeholder is sent when only the address is set.
    """
    from langchain_openai.decisions import OpenAIClassifier  # noqa: PLC0415

    base_url = os.environ.get("OPENAI_BASE_URL") or None
    key = os.environ.get("OPENAI_API_KEY") or ("not-needed" if base_url else None)
    if key is None:
        msg = (
            f"The decision model {name!r} needs OPENAI_API_KEY (or OPENAI_BASE_URL "
            "for a compatible server)."
        )
        raise ModelNotConfiguredError(msg)
    return OpenAIClassifier(model=name, api_key=key, base_url=base_url)


def build_judge(
    model: JudgeModel | None = None,
    *,
    profile: RuleSchemaProfile = CONDITION_PROFILE,
    retry: CallRetry | None = None,
    on_error: Literal["raise", "not_applicable"] = "raise",
    cache: BaseStore[str, str] | None = None,
    verdict_log: VerdictSink | None = None,
    rules_per_call: int = 1,
    questions_per_request: int = 200,
    decision_threshold: float = 0.5,
    logprobs: bool = False,
    rationale: bool = False,
) -> BaseJudge:
    """The judge of `model`: the one place a face turns a model into a judge.

    A decision model gets a `DecisionJudge` (`questions_per_request`,
    `decision_threshold`); a chat model, or a model string for `init_chat_model`,
    an `ApplicabilityJudge` (`rules_per_call`, `logprobs`, `rationale`); None, the
    environment's (`default_judge_model`).

    Raises:
        ValueError: A chat-only option (`rules_per_call > 1`, `logprobs`,
            `rationale`) with a decision model, which answers each rule with a
            probability and no text.
    """
    if model is None:
        model = default_judge_model()
    elif isinstance(model, str):
        from langchain.chat_models import init_chat_model  # noqa: PLC0415

        model = init_chat_model(model)
    retry = CallRetry() if retry is None else retry
    if isinstance(model, BaseDecisionModel):
        chat_only = [
            name
            for name, given in (
                ("rules_per_call", rules_per_call != 1),
                ("logprobs", logprobs),
                ("rationale", rationale),
            )
            if given
        ]
        if chat_only:
            msg = (
                f"{', '.join(chat_only)} apply to chat judges only: a decision model "
                "answers every rule of a request with a probability (the verdict's "
                "score) and no text. Use questions_per_request and "
                "decision_threshold instead."
            )
            raise ValueError(msg)
        return DecisionJudge(
            model=model,
            profile=profile,
            questions_per_request=questions_per_request,
            decision_threshold=decision_threshold,
            retry=retry,
            on_error=on_error,
            cache=cache,
            verdict_log=verdict_log,
        )
    return ApplicabilityJudge(
        llm=model,
        profile=profile,
        retry=retry,
        on_error=on_error,
        cache=cache,
        verdict_log=verdict_log,
        rules_per_call=rules_per_call,
        logprobs=logprobs,
        rationale=rationale,
    )


def refuse_unknown(given: object, known: set[str], owner: str) -> None:
    """Refuse option names not in `known`, naming the closest and listing all.

    Raises:
        ValueError: An unknown name.
    """
    if not isinstance(given, dict):
        return
    unknown = sorted(str(name) for name in given if name not in known)
    if not unknown:
        return
    hints = [
        f"{name!r} (did you mean {close[0]!r}?)"
        if (close := difflib.get_close_matches(name, known, n=1))
        else repr(name)
        for name in unknown
    ]
    msg = (
        f"{owner} takes no option {', '.join(hints)}. Known options: "
        f"{', '.join(sorted(known))}."
    )
    raise ValueError(msg)


_JUDGE_OPTIONS = frozenset(
    {
        "cache",
        "verdict_log",
        "rules_per_call",
        "questions_per_request",
        "decision_threshold",
        "on_error",
        "logprobs",
        "rationale",
    }
)
"""The options that build a judge from `llm`; a ready `judge` has its own."""


class MatchSettings(BaseModel):
    """The matching engine's options, under the same names in every face.

    Example:
        ```python
        settings = MatchSettings(llm=OpenAIClassifier(model="gpt-6-luna"), k=5)
        engine = settings.build_engine(profile_for(rulebook))
        engine.match(text, rulebook.rules, settings.options())
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    llm: SkipJsonSchema[BaseChatModel | BaseDecisionModel | None] | str = Field(
        default=None, exclude=True
    )
    """The judge model: a chat model, a decision model (`BaseDecisionModel`), or a
    model string for `init_chat_model` (`"openai:gpt-5-mini"`); None: from the
    environment (`TAG_DECISION_MODEL`, else `default_chat_model`)."""
    judge: SkipJsonSchema[BaseJudge | None] = None
    """A ready judge (a `CascadeJudge`, say) instead of one built from `llm`; its
    own cache, log and options apply."""
    k: int | None = Field(default=None, ge=0)
    """Return at most this many rules; None returns every applicable rule."""
    score_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """Drop applicable rules scoring below this (a rule without a score counts
    1.0; a decision model's verdicts are scored by their probability)."""
    filter: SkipJsonSchema[RuleFilter | None] = None
    """Judge only rules passing this filter (see `langchain_tag.engine.rule_passes`);
    a key that is no Rule field and in no rule's metadata is refused."""
    prefilter: SkipJsonSchema[BaseRetriever | None] = None
    """Shortlists candidate rules before judging (a similarity retriever, or a
    `LearnedPrefilter` with shadow judging); None judges every rule."""
    explore: float = Field(default=0.05, ge=0.0, le=1.0)
    """With a learned prefilter: the share of skipped pairs judged anyway."""
    retrain_every: int | None = Field(default=None, ge=1)
    """With a `LearnedPrefilter` and a `verdict_log`: train again from the log once
    this many new verdicts are logged, in a background thread."""
    cache: SkipJsonSchema[BaseStore[str, str] | None] = Field(
        default_factory=InMemoryVerdictCache
    )
    """Where verdicts are remembered (any `BaseStore[str, str]`); None: nowhere.
    A fully cached query is one lookup and no model call."""
    verdict_log: SkipJsonSchema[VerdictSink | None] = None
    """Where every judgment made is appended (`VerdictLog`), to learn from."""
    rules_per_call: int = Field(default=1, ge=1)
    """Chat judges: rules judged in one call (1 is the method)."""
    questions_per_request: int = Field(default=200, ge=1)
    """Decision models: questions (rules) in one request at most."""
    decision_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    """Decision models: a rule applies when its probability reaches this."""
    max_concurrency: int | None = Field(default=8, ge=1)
    """Calls in flight at most, across the retrievals sharing the engine."""
    on_error: Literal["raise", "not_applicable"] = "raise"
    """A judgment that fails after its retries: raise `JudgmentError`, or go on
    with the rule flagged as unjudged (`failed_rule_ids`)."""
    logprobs: bool = False
    """Chat judges: score verdicts by logprobs (models with a `logprobs` option)."""
    rationale: bool = False
    """Chat judges: one short reason before each verdict."""

    @model_validator(mode="before")
    @classmethod
    def _known_options(cls, data: Any) -> Any:
        # On what the caller gave: a face may fill `judge` in after validation.
        refuse_unknown(data, set(cls.model_fields), cls.__name__)
        if isinstance(data, dict) and data.get("judge") is not None:
            if data.get("llm") is not None:
                msg = (
                    "Pass either llm= or judge=, not both (the judge has its own "
                    "model)."
                )
                raise ValueError(msg)
            mine = sorted(data.keys() & _JUDGE_OPTIONS)
            if mine:
                msg = (
                    f"{', '.join(mine)} build the judge from llm=; with judge= set "
                    "them on that judge (it keeps its own cache, log and options)."
                )
                raise ValueError(msg)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> MatchSettings:
        check_rate(self.explore)
        return self

    def options(self) -> MatchOptions:
        """The per-retrieval options: `k`, `score_threshold`, `filter`."""
        return MatchOptions(self.k, self.score_threshold, self.filter)

    def build_judge(
        self,
        profile: RuleSchemaProfile = CONDITION_PROFILE,
        retry: CallRetry | None = None,
    ) -> BaseJudge:
        """The judge: `judge` (retrying by `retry`, if given), or one from `llm`."""
        if self.judge is not None:
            return self.judge if retry is None else self.judge.with_call_retry(retry)
        return build_judge(
            self.llm,
            profile=profile,
            retry=retry,
            on_error=self.on_error,
            cache=self.cache,
            verdict_log=self.verdict_log,
            rules_per_call=self.rules_per_call,
            questions_per_request=self.questions_per_request,
            decision_threshold=self.decision_threshold,
            logprobs=self.logprobs,
            rationale=self.rationale,
        )

    def build_engine(
        self,
        profile: RuleSchemaProfile = CONDITION_PROFILE,
        retry: CallRetry | None = None,
        judge: BaseJudge | None = None,
    ) -> MatchEngine:
        """A matching engine with these options (the one place engines are built).

        Args:
            profile: What the judge built from `llm` sees of each rule.
            retry: The judge's retries (a graph's), in place of its own.
            judge: A judge already built from these settings, to reuse.
        """
        return MatchEngine(
            judge or self.build_judge(profile, retry),
            prefilter=self.prefilter,
            explore=self.explore,
            retrain_every=self.retrain_every,
            max_concurrency=self.max_concurrency,
        )
