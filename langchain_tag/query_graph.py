"""TAG end to end as a LangGraph graph: rulebook -> pairwise matching -> execution.

    load_rulebook -> (extract -> review?) -> plan -> match_rule* -> execute

`load_rulebook` takes the rulebook given in the input, or runs the extraction graph
when only documents are given; `review` (optional) pauses with `interrupt()` so a
person can approve, edit or reject each extracted rule (LangChain's human-in-the-loop
request, one `keep_rule` action per rule, answered with `{"decisions": [...]}`, as
LangGraph Studio and Agent Chat UI do); `plan`, `match_rule` and
`execute` are the steps of `langchain_tag.engine.MatchEngine`, the one the
retriever runs: `plan` filters and prefilters, `match_rule` is fanned out with one
`Send` per model call (one rule each by default, the action withheld), `execute`
selects (k, threshold) and answers with the input and only the matched actions.
Every matching option of `TAGRetriever` is a `QueryContext` field of the same name.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import stat
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from langchain.agents.middleware.human_in_the_loop import ActionRequest
from langchain_core.callbacks import dispatch_custom_event
from langchain_core.decisions import BaseDecisionModel
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.cache.base import BaseCache
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import get_runtime
from langgraph.types import CachePolicy, Overwrite, Send
from pydantic import ConfigDict, ValidationError
from pydantic.json_schema import SkipJsonSchema
from typing_extensions import NotRequired, TypedDict

from langchain_tag._graph import as_documents
from langchain_tag._graph import coerce_context as _coerce
from langchain_tag._names import named
from langchain_tag._review import ask, check_can_pause, read_decisions
from langchain_tag.engine import (
    MATCH_EVENT,
    MatchEngine,
    MatchOptions,
    MatchPlan,
    MatchResult,
)
from langchain_tag.errors import RulebookPathError
from langchain_tag.execution import ActionOnlyExecutor, ExecutionTemplate
from langchain_tag.execution.templates import TEMPLATES
from langchain_tag.learning.shadow import check_rate
from langchain_tag.matching import (
    CONDITION_PROFILE,
    BaseJudge,
    RuleSchemaProfile,
    Verdict,
)
from langchain_tag.matching.judge import VerdictSink
from langchain_tag.matching.profiles import PROFILES, schema_profile
from langchain_tag.models import CallRetry, default_chat_model, with_settings
from langchain_tag.rule_schemas import RuleSchema, rule_schema
from langchain_tag.rules import Rule, Rulebook
from langchain_tag.settings import (
    DECISION_MODEL_ENV_VAR,
    MatchSettings,
    decision_model,
)
from langchain_tag.usage import TokenUsage, UsageCounter

if TYPE_CHECKING:
    from langchain_tag.extraction.graph import (
        ExtractionInput,
        ExtractionOutput,
        ExtractionSettings,
        ExtractionState,
    )

__all__ = [
    "Match",
    "QueryContext",
    "QueryInput",
    "QueryOutput",
    "build_query_graph",
    "checkpoint_serializer",
]


@dataclass(frozen=True)
class QueryContext:
    """Per-run settings (the graph's `context_schema`).

    The matching options have `TAGRetriever`'s names and meaning. Model, judge,
    prefilter and log objects are for Python callers; LangGraph Studio shows the
    JSON-able fields only and its runs use the models from the environment.

    The context keeps the matching engine its runs share (the concurrency bound,
    the shadow-judging counts, the retrainer): reuse one context across runs to
    keep them, as one `TAGRetriever` would.
    """

    __pydantic_config__ = ConfigDict(arbitrary_types_allowed=True)

    judge_model: str | SkipJsonSchema[BaseChatModel | BaseDecisionModel] | None = None
    """The judge model: a chat model or a decision model (`BaseDecisionModel`), or
    a chat model's `init_chat_model` name (`"openai:gpt-4o-mini"`: what a JSON
    context over a server can carry); None uses the environment's
    (`TAG_DECISION_MODEL`, else `default_chat_model`)."""
    judge: SkipJsonSchema[BaseJudge | None] = None
    """A ready judge (e.g. a `CascadeJudge`) instead of one made from `judge_model`,
    `logprobs`, `profile`, `rules_per_call`, `verdict_log` and `on_error`. It
    retries by the graph's `retry` in place of its own."""
    executor_model: str | SkipJsonSchema[BaseChatModel] | None = None
    """The executor, or its `init_chat_model` name; None uses the judge's model when
    it is a chat model, else `default_chat_model()`."""
    k: int | None = None
    """Execute with at most this many matched rules (best scores first)."""
    score_threshold: float | None = None
    """Drop applicable rules scoring below this (a rule without a score counts 1.0)."""
    filter: dict[str, Any] | SkipJsonSchema[Callable[[Rule], bool]] | None = None
    """Judge only rules passing this filter (see `langchain_tag.engine.rule_passes`):
    field -> accepted value(s) (JSON, so it travels to a server), or a predicate."""
    prefilter: str | SkipJsonSchema[BaseRetriever] | None = None
    """Shortlists candidate rules before judging (a similarity prefilter, or a
    `LearnedPrefilter` with shadow judging); None judges every rule. By name (what
    a JSON context over a server can carry), built over the run's rules:
    `"bm25:N"`, `"dense:N"` or `"hybrid:N"` keep the N rules most similar to the
    query (`build_prefilter`; dense ones embed with the offline MiniLM of the
    `local` extra); `"learned:FILE.npz"` loads a saved `LearnedPrefilter`, its
    file opened as rulebook paths are (`build_query_graph(rulebook_dir=...)`)."""
    explore: float = 0.05
    """With a learned prefilter: the share of skipped pairs judged anyway."""
    retrain_every: int | None = None
    """With a learned prefilter and a `verdict_log`: train again from the log once
    this many new verdicts are logged, in a background thread."""
    verdict_log: SkipJsonSchema[VerdictSink | None] = None
    """Where the judge built here logs every judgment it makes."""
    rules_per_call: int = 1
    """Rules judged in one model call by the judge built here (1 is the method)."""
    questions_per_request: int = 200
    """With a decision model: rules asked in one request at most."""
    decision_threshold: float = 0.5
    """With a decision model: a rule applies when its probability reaches this."""
    max_concurrency: int | None = 8
    """Judgments in flight at most, across the runs sharing this context."""
    logprobs: bool = False
    """Score verdicts by logprobs (models with a `logprobs` option, as ChatOpenAI)."""
    rationale: bool = False
    """Ask the judge built here for one short reason before each verdict."""
    profile: str | SkipJsonSchema[RuleSchemaProfile] | None = None
    """A profile name from `PROFILES`, or a `RuleSchemaProfile`; None judges by the
    rulebook's rule schema (`profile_for`): the condition profile for a rulebook
    without one."""
    template: str | SkipJsonSchema[ExecutionTemplate] = "generic"
    """A template name from `TEMPLATES`, or an `ExecutionTemplate`."""
    review: bool = False
    """Pause after extraction for a person to approve, edit or drop rules. Needs a
    checkpointer (a LangGraph server has one): without, a run from documents is
    refused before extraction (`ReviewNeedsCheckpointerError`)."""
    domain: str = "instruction"
    """Domain string for extraction, when the input brings documents."""
    rule_schema: str | RuleSchema = "condition"
    """The rule schema extraction writes, when the input brings documents: a
    built-in's name ("condition", "nba") or a `RuleSchema`."""
    on_error: Literal["raise", "not_applicable"] = "raise"
    """A judgment that fails after its retries: stop the run, or continue with that
    rule flagged as unjudged (not applicable), for the judge built here."""

    def __post_init__(self) -> None:
        """Refuse options the engine could not honour, before any model call.

        A model given by name is made here (`init_chat_model`), once per context.
        """
        for name in ("judge_model", "executor_model"):
            if isinstance(given := getattr(self, name), str):
                object.__setattr__(self, name, _named_model(given, name))
        if isinstance(self.prefilter, str):
            PrefilterName.parse(self.prefilter)
        self.options()
        check_rate(self.explore)
        self.__setstate__({})

    # Not fields (no schema, no comparison), and not copied: a copy or an unpickled
    # context starts with engines of its own.
    def __getstate__(self) -> dict[str, Any]:
        """The fields, without the engines and their lock."""
        return {
            k: v for k, v in self.__dict__.items() if k not in {"_engines", "_lock"}
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore the fields; no engine yet."""
        for name, value in {**state, "_engines": {}, "_lock": threading.Lock()}.items():
            object.__setattr__(self, name, value)

    def options(self) -> MatchOptions:
        """The per-retrieval options: `k`, `score_threshold`, `filter` (checked)."""
        return MatchOptions(self.k, self.score_threshold, self.filter)

    def judged_by(self, schema: RuleSchema | None) -> RuleSchemaProfile:
        """The profile of a run over rules extracted in `schema` (None: condition).

        `profile` when given, else the schema's (`schema_profile`).
        """
        if self.profile is not None:
            return named(self.profile, PROFILES, "profile")
        return CONDITION_PROFILE if schema is None else schema_profile(schema)

    def settings(self, prefilter: BaseRetriever | None = None) -> MatchSettings:
        """These options as the engine takes them (`MatchSettings`, checked).

        Judgments are cached by the graph's node cache, if any: the judge built
        here keeps no cache of its own. A prefilter given by name is built over a
        run's rules and passed as `prefilter` (see `engine`).
        """
        named = isinstance(self.prefilter, str)
        judge_options: dict[str, Any] = (
            {}
            if self.judge is not None
            else {
                "llm": self.judge_model or _environment_judge_model(),
                "cache": None,
                "verdict_log": self.verdict_log,
                "rules_per_call": self.rules_per_call,
                "questions_per_request": self.questions_per_request,
                "decision_threshold": self.decision_threshold,
                "on_error": self.on_error,
                "logprobs": self.logprobs,
                "rationale": self.rationale,
            }
        )
        return MatchSettings(
            judge=self.judge,
            k=self.k,
            score_threshold=self.score_threshold,
            filter=self.filter,
            prefilter=prefilter if named else self.prefilter,
            explore=self.explore,
            # The judging tasks' engine has no prefilter when it is named.
            retrain_every=None if named and prefilter is None else self.retrain_every,
            max_concurrency=self.max_concurrency,
            **judge_options,
        )

    def engine(
        self,
        retry: CallRetry,
        profile: RuleSchemaProfile = CONDITION_PROFILE,
        prefilter: Callable[[], BaseRetriever] | None = None,
        prefilter_key: str = "",
    ) -> MatchEngine:
        """The engine of the runs with this context and profile, built on first use.

        Building a judge costs a model copy and a structured-output wrapper (about
        a millisecond with ChatOpenAI), too much to repeat for every rule. The
        judge's retries are the match nodes' only layer (they honour the
        provider's Retry-After, which LangGraph's node retry policy cannot): a
        judge passed in gets the graph's retries in place of its own.

        Args:
            retry: The judge's retries.
            profile: What the judge is shown of each rule.
            prefilter: Builds the prefilter named in `prefilter` for one set of
                rules (None: the engine without it, which judges as well); called
                once per `prefilter_key`.
            prefilter_key: Names the rules `prefilter` builds over.
        """
        key = (retry, profile, prefilter_key if prefilter is not None else "")
        engines: dict[tuple[CallRetry, RuleSchemaProfile, str], MatchEngine]
        engines = self.__dict__["_engines"]
        with self.__dict__["_lock"]:
            engine = engines.get(key)
            if engine is None:
                built = None if prefilter is None else prefilter()
                engine = engines[key] = self.settings(built).build_engine(
                    profile, retry
                )
            return engine


class QueryInput(TypedDict):
    """A query, and the rules to answer it with (or documents to extract them from).

    Checked where the graph starts (`load_rulebook`), before any model call; see
    `INPUT_SCHEMA`.
    """

    query: str
    rulebook: NotRequired[dict[str, Any] | str]
    """A rulebook as JSON (e.g. `Rulebook.model_dump(mode="json")`) or a file path."""
    documents: NotRequired[list[Document]]


INPUT_SCHEMA = (
    '{"query": "<the text to answer>", "rulebook": <a rulebook as JSON, or the '
    'path of a rulebook file>}, or {"query": ..., "documents": [<Document>, ...]} '
    "to extract the rulebook from (QueryInput)"
)
"""The graph's input, as its error messages describe it."""


class Match(TypedDict):
    """A rule the judge found applicable."""

    rule_id: str
    name: str
    score: float | None
    reason: str | None


class QueryOutput(TypedDict):
    """The answer, the rules that produced it, and what it cost."""

    answer: Any
    matches: list[Match]
    cost: dict[str, Any]
    """Counts of the run (rules, candidates, judgments, ...), its seconds, and what
    its model calls used: `judge_usage` and `executor_usage`, each a `TokenUsage`
    as JSON (calls, input tokens, cached input tokens, output tokens; tokens None
    when the model reports no usage; judgments replayed from the node cache cost
    nothing). Price them with `TokenPrices.cost`."""
    result: MatchResult
    """The engine's whole result, as `TAGRetriever.match` returns it."""


def _verdicts(left: list[Verdict], right: list[Verdict]) -> list[Verdict]:
    return left + right


class JudgingUsage(TypedDict):
    """What the model calls of one `match_rule` task cost, marked with its run."""

    run: str
    """The run that made the calls: a task replayed from the node cache carries
    an earlier run's, and cost nothing in this one."""
    usage: TokenUsage


def _judging_usage(
    left: list[JudgingUsage], right: list[JudgingUsage]
) -> list[JudgingUsage]:
    return left + right


class QueryState(TypedDict, total=False):
    """The graph's state; verdicts are cleared at the start of every run."""

    query: str | None
    rulebook: dict[str, Any] | str | None
    documents: list[Document] | None
    rules: list[Rule] | None
    rule_schema: RuleSchema | None
    """The schema the rules were extracted in (None: condition), which decides the
    judge's profile unless the context names one."""
    plan: MatchPlan | None
    verdicts: Annotated[list[Verdict], _verdicts]
    run: str
    """This run's id, which marks the usage its judgments report."""
    judging_usage: Annotated[list[JudgingUsage], _judging_usage]
    started: float
    review_requested: bool
    answer: Any
    matches: list[Match]
    cost: dict[str, Any]
    result: MatchResult


STATE_TYPES = (
    ("langchain_tag.rules", "Rule"),
    ("langchain_tag.rule_schemas", "RuleSchema"),
    ("langchain_tag.rule_schemas", "SchemaField"),
    ("langchain_tag.matching.verdicts", "Verdict"),
    ("langchain_tag.engine", "MatchPlan"),
    ("langchain_tag.engine", "MatchResult"),
    ("langchain_tag.usage", "TokenUsage"),
)
"""The classes the graph keeps in its state, as LangGraph's serializer names them."""


def checkpoint_serializer() -> JsonPlusSerializer:
    """A checkpoint serializer that allows the graph's state types by name.

    LangGraph's default serializer restores them too, but warns that unregistered
    types will be refused in a future version; pass this as a checkpointer's
    `serde=` (e.g. `SqliteSaver(conn, serde=checkpoint_serializer())`). A serializer
    that refuses them (`LANGGRAPH_STRICT_MSGPACK=true`) hands back their fields,
    which the nodes read as well.
    """
    return JsonPlusSerializer(allowed_msgpack_modules=STATE_TYPES)


def _named_model(name: str, field: str) -> BaseChatModel:
    """The chat model `init_chat_model` makes of `name`.

    Raises:
        ValueError: `name` names no model `init_chat_model` can make.
    """
    from langchain.chat_models import init_chat_model  # noqa: PLC0415

    try:
        return init_chat_model(name)
    except (ValueError, ImportError) as error:
        msg = (
            f"{field}={name!r} names no chat model init_chat_model can make "
            f"({error}); give 'provider:model', e.g. 'openai:gpt-4o-mini'."
        )
        raise ValueError(msg) from None


def check_context_keys(context: Mapping[str, Any]) -> None:
    """Refuse a JSON context with keys `QueryContext` does not have.

    A LangGraph server drops context keys missing from the graph's context schema
    before the graph sees them; the served graph's factory (`graphs/query.py`)
    calls this on the context as the client sent it, so a misspelt option is an
    error, not a silent default.

    Raises:
        ValueError: Unknown keys, named with the known ones.
    """
    known = [f.name for f in dataclasses.fields(QueryContext)]
    unknown = sorted(set(context) - set(known))
    if unknown:
        msg = (
            f"Unknown context key(s) {', '.join(map(repr, unknown))}; the query "
            f"graph's context takes {', '.join(known)}."
        )
        raise ValueError(msg)


def _context(default: QueryContext | None = None) -> QueryContext:
    """The run's context; with none given, the graph's `default` (one engine)."""
    given: object = get_runtime(QueryContext).context
    if given is None and default is not None:
        return default
    return _coerce(given, QueryContext)


def _rules(state: QueryState) -> list[Rule]:
    # model_validate returns a Rule as it is: only a checkpointer that refuses
    # unregistered types (LANGGRAPH_STRICT_MSGPACK) hands back their dicts.
    return [Rule.model_validate(rule) for rule in state.get("rules") or []]


def _engine(
    state: QueryState | MatchRequest, context: QueryContext, retry: CallRetry
) -> MatchEngine:
    """The engine judging this run's rules: by the profile of their schema."""
    return context.engine(retry, _profile(state, context))


def _profile(
    state: QueryState | MatchRequest, context: QueryContext
) -> RuleSchemaProfile:
    """The profile judging this run's rules, by their schema."""
    # A checkpointer refusing unregistered types hands back the schema's fields.
    schema: object = state.get("rule_schema")
    if schema is not None:
        schema = RuleSchema.model_validate(schema)
    return context.judged_by(schema)


def _planning_engine(
    state: QueryState,
    context: QueryContext,
    retry: CallRetry,
    files: str | os.PathLike[str] | None,
    rules: list[Rule],
) -> MatchEngine:
    """The engine that plans and selects this run (the `plan` and `execute` nodes).

    With a prefilter given by name: the engine holding it, built over the run's
    `rules`, its file opened as `files` (the graph's `rulebook_dir`) allows. The
    judging tasks take `_engine`'s, which leaves it out.
    """
    if not isinstance(context.prefilter, str):
        return _engine(state, context, retry)
    digest = hashlib.sha256()
    for rule in rules:
        digest.update(rule.content_hash().encode())
    name = PrefilterName.parse(context.prefilter)
    return context.engine(
        retry,
        _profile(state, context),
        prefilter=functools.partial(
            _built_prefilter, name, rules, files, digest.hexdigest()
        ),
        prefilter_key=digest.hexdigest(),
    )


_BUILT_PREFILTERS: OrderedDict[tuple[Any, ...], BaseRetriever] = OrderedDict()
_BUILT_PREFILTERS_KEPT = 8
_BUILT_PREFILTERS_LOCK = threading.Lock()


def _built_prefilter(
    name: PrefilterName,
    rules: list[Rule],
    files: str | os.PathLike[str] | None,
    digest: str,
) -> BaseRetriever:
    """The prefilter `name` over `rules`, built once for all runs that name it.

    Over a server every run brings its own JSON context, so the context's engines
    are new each run; kept here, a dense prefilter embeds a rulebook's rules once
    per process, not once per run (55 rules: one embedding call saved per run).
    A saved file is read again when it changes (a retrained prefilter).
    """
    stamp: tuple[str, int, int] | None = None
    if name.file is not None:
        path = _served_path(name.file, files).resolve()
        found = path.stat()
        stamp = (str(path), found.st_mtime_ns, found.st_size)
    key = (name, digest, stamp)
    with _BUILT_PREFILTERS_LOCK:
        built = _BUILT_PREFILTERS.get(key)
        if built is None:
            built = _BUILT_PREFILTERS[key] = name.build(rules, files)
            while len(_BUILT_PREFILTERS) > _BUILT_PREFILTERS_KEPT:
                _BUILT_PREFILTERS.popitem(last=False)
        else:
            _BUILT_PREFILTERS.move_to_end(key)
        return built


def _plan(state: QueryState) -> MatchPlan:
    return MatchPlan.model_validate(state["plan"])


@functools.cache
def _environment_model() -> BaseChatModel:
    return default_chat_model()


def _environment_judge_model() -> BaseChatModel | BaseDecisionModel:
    # The environment's decision model when it names one, else its chat model.
    name = os.environ.get(DECISION_MODEL_ENV_VAR) or None
    return _environment_model() if name is None else _decision_model(name)


@functools.cache
def _decision_model(name: str) -> BaseDecisionModel:
    return decision_model(name)


_DEFAULT_RETRY = CallRetry()


def _executor(context: QueryContext) -> ActionOnlyExecutor:
    judge_model = (
        context.judge_model if isinstance(context.judge_model, BaseChatModel) else None
    )
    executor = context.executor_model
    llm = (
        (executor if isinstance(executor, BaseChatModel) else None)  # named: made
        or judge_model
        or (context.judge.final_llm if context.judge is not None else None)
        or _environment_model()
    )
    # The node's retry policy is the one layer: the client's own would multiply it.
    llm, _ = with_settings(llm, max_retries=0)
    return ActionOnlyExecutor(
        llm=llm, template=named(context.template, TEMPLATES, "template")
    )


# --- nodes ---------------------------------------------------------------------------


RULEBOOK_DIR_ENV = "TAG_RULEBOOK_DIR"
"""The folder a served query graph opens rulebook paths in (`graphs/query.py`)."""

ANYWHERE = "anywhere"
"""`build_query_graph(rulebook_dir=ANYWHERE)`: a path in a run's input is opened
wherever it is: the caller's own process, its own files (the default)."""

MAX_RULEBOOK_BYTES = 64 << 20
"""The largest rulebook file a run's input may name (64 MiB; the NBA one is 60 KB)."""


def _refused() -> RulebookPathError:
    """The one refusal of a rulebook path, naming this graph's folder and limit."""
    return RulebookPathError(folder_env=RULEBOOK_DIR_ENV, max_bytes=MAX_RULEBOOK_BYTES)


def _served_path(given: str, allowed: str | os.PathLike[str] | None) -> Path:
    """The file a run's input or context names, if `allowed` lets this graph open it.

    Raises:
        RulebookPathError: Not inside `allowed` (None: no folder), missing, not a
            regular file, or over `MAX_RULEBOOK_BYTES`; checked before any read.
    """
    if allowed == ANYWHERE:
        target = Path(given)
    else:
        if allowed is None:
            raise _refused()
        root = Path(allowed).resolve()
        try:
            target = (root / given).resolve(strict=True)
        except (OSError, RuntimeError):
            raise _refused() from None
        if not target.is_relative_to(root):
            raise _refused()
    try:
        found = target.stat()
    except OSError:
        found = None
    if found is not None and not (
        stat.S_ISREG(found.st_mode) and found.st_size <= MAX_RULEBOOK_BYTES
    ):
        raise _refused()  # a device, a pipe or a huge file: never read
    if found is None and allowed != ANYWHERE:
        raise _refused()
    return target


def _rulebook_at(given: str, allowed: str | os.PathLike[str] | None) -> Rulebook:
    """The rulebook file a run's input names, if `allowed` lets this graph open it.

    Raises:
        RulebookPathError: See `_served_path`.
        RulebookError: A file that may be opened is not a valid rulebook.
    """
    return Rulebook.load(_served_path(given, allowed))


_SIMILARITY_METHODS = ("bm25", "dense", "hybrid")


@dataclass(frozen=True)
class PrefilterName:
    """A prefilter named in a JSON context: `"hybrid:40"` or `"learned:FILE.npz"`.

    `kind` is `bm25`, `dense`, `hybrid` (with `n`, the rules kept) or `learned`
    (with `file`, a saved `LearnedPrefilter`).
    """

    kind: str
    n: int | None = None
    file: str | None = None

    @classmethod
    def parse(cls, name: str) -> PrefilterName:
        """Read `name`, or say what names a prefilter.

        Raises:
            ValueError: Not `METHOD:N` (a similarity method, N at least 1) nor
                `learned:FILE`.
        """
        kind, _, arg = name.partition(":")
        if kind == "learned" and arg.strip():
            return cls(kind, file=arg.strip())
        if kind in _SIMILARITY_METHODS and arg.strip().isdigit() and int(arg) >= 1:
            return cls(kind, n=int(arg))
        msg = (
            f"Unknown prefilter name {name!r}: use 'bm25:N', 'dense:N' or "
            "'hybrid:N' (keep the N rules most similar to the query, N at least 1) "
            "or 'learned:FILE.npz' (a saved LearnedPrefilter)."
        )
        raise ValueError(msg)

    def check(self, files: str | os.PathLike[str] | None) -> None:
        """Refuse a prefilter file this graph does not open, before any model call.

        Raises:
            RulebookPathError: As for a rulebook path (`_served_path`).
        """
        if self.file is not None:
            _served_path(self.file, files)

    def build(
        self, rules: list[Rule], files: str | os.PathLike[str] | None
    ) -> BaseRetriever:
        """The prefilter over `rules`; a file is opened as `files` allows.

        Raises:
            RulebookPathError: As for a rulebook path (`_served_path`).
            ValueError: A file that is not a saved prefilter.
        """
        # Imported here: the graph loads neither (nor numpy) unless one is named.
        from langchain_tag.learning.learned_prefilter import (  # noqa: PLC0415
            LearnedPrefilter,
        )
        from langchain_tag.matching.prefilters import build_prefilter  # noqa: PLC0415

        rulebook = Rulebook(rules=rules)
        if self.file is not None:
            return LearnedPrefilter.load(_served_path(self.file, files), rulebook)
        built = build_prefilter(rulebook, cast("Any", self.kind), self.n)
        if built is None:  # n is at least 1
            raise AssertionError(self)
        return built


def load_rulebook(
    state: QueryState,
    config: RunnableConfig,
    rulebook_dir: str | os.PathLike[str] | None = ANYWHERE,
) -> dict[str, Any]:
    """Start a run: check its input, clear earlier verdicts, read the rulebook.

    A rulebook given as a path is opened only as `rulebook_dir` allows
    (`build_query_graph`).

    The run's inputs are consumed at its end (see `execute`), so on a reused thread
    a query, rulebook or documents present here were given to this run.

    Raises:
        RulebookPathError: The rulebook is a path this graph does not open.
        ValueError: The input has no query, or neither a rulebook nor documents;
            an unknown profile or template name.
        TypeError: The query is not a string.
        ReviewNeedsCheckpointerError: `review` is asked for a run that extracts
            (it would pause) without a checkpointer to resume it from.
    """
    _check_query(state)
    context = _context()
    # Unknown profile, template or schema names fail before any model call.
    context.judged_by(None)
    named(context.template, TEMPLATES, "template")
    if isinstance(context.prefilter, str):
        PrefilterName.parse(context.prefilter).check(rulebook_dir)
    rule_schema(context.rule_schema)
    update: dict[str, Any] = {
        "verdicts": Overwrite([]),
        "run": uuid.uuid4().hex,
        "judging_usage": Overwrite([]),
        "plan": None,
        "started": time.time(),
        # Decided by the run that starts, not by the one that resumes: a resume
        # (from another client or server) need not repeat the context.
        "review_requested": context.review,
    }
    given = state.get("rulebook")
    if given is None:
        if not state.get("documents"):
            msg = (
                "The query graph needs a rulebook, or documents to extract one "
                f"from: expected {INPUT_SCHEMA}."
            )
            raise ValueError(msg)
        if context.review:
            # The review would pause after the (paid) extraction, for good.
            check_can_pause(
                config,
                "QueryContext(review=True) pauses after extraction for a person, "
                "which needs a checkpointer: build_query_graph(checkpointer="
                "InMemorySaver()) (or a persistent one), and a thread_id in the "
                "run's config. Nothing was extracted.",
            )
        return {**update, "rules": None, "rule_schema": None}
    rulebook = (
        _rulebook_at(given, rulebook_dir)
        if isinstance(given, str)
        else Rulebook.from_data(given)
    )
    return {
        **update,
        "rules": list(rulebook.rules),
        "rule_schema": rulebook.rule_schema,
    }


def _check_query(state: QueryState) -> None:
    """Refuse an input without its query, naming the key and the expected input."""
    if state.get("query") is None:
        msg = f"The query graph's input has no 'query': expected {INPUT_SCHEMA}."
        raise ValueError(msg)
    if not isinstance(state["query"], str):
        msg = (
            f"The query graph's 'query' must be a string, not "
            f"{type(state['query']).__name__}: expected {INPUT_SCHEMA}."
        )
        raise TypeError(msg)


def _query(state: QueryState) -> str:
    """The run's query (checked by `load_rulebook`)."""
    return cast("str", state["query"])


def after_load(state: QueryState) -> Literal["extract", "plan"]:
    """Extract first when no rulebook was given."""
    return "extract" if state.get("rules") is None else "plan"


def _extraction(
    state: QueryState,
) -> tuple[
    CompiledStateGraph[
        ExtractionState, ExtractionSettings, ExtractionInput, ExtractionOutput
    ],
    ExtractionInput,
    ExtractionSettings,
]:
    """The extraction graph, its input and settings for this run's documents."""
    # Imported here: only a run from documents extracts, and extraction is a third
    # of the graph's import (12 of its 52 modules, 5,600 of its 18,200 lines).
    from langchain_tag.extraction.graph import (  # noqa: PLC0415
        ExtractionSettings,
        build_extraction_graph,
    )

    context = _context()
    inputs: ExtractionInput = {
        "documents": as_documents(state.get("documents") or []),
        "domain": context.domain,
    }
    # A decision model judges only: extraction writes with the executor's model.
    extractor = next(
        (
            model
            for model in (context.judge_model, context.executor_model)
            if isinstance(model, BaseChatModel)
        ),
        None,
    )
    settings = ExtractionSettings(llm=extractor, rule_schema=context.rule_schema)
    return build_extraction_graph(), inputs, settings


def _extracted(output: dict[str, Any]) -> dict[str, Any]:
    rulebook = Rulebook.from_data(output["rulebook"])
    return {
        "rulebook": output["rulebook"],
        "rules": list(rulebook.rules),
        "rule_schema": rulebook.rule_schema,
    }


def extract(state: QueryState, config: RunnableConfig) -> dict[str, Any]:
    """Run the extraction graph (as a subgraph of this run) over the documents."""
    graph, inputs, settings = _extraction(state)
    return _extracted(graph.invoke(inputs, config, context=settings))


async def aextract(state: QueryState, config: RunnableConfig) -> dict[str, Any]:
    """Async `extract`: the subgraph runs on the event loop too.

    Run in a worker thread instead, it would call the checkpointer's sync methods,
    which async-only checkpointers (a LangGraph server's custom one) do not have.
    """
    graph, inputs, settings = _extraction(state)
    return _extracted(await graph.ainvoke(inputs, config, context=settings))


_REVIEW_ACTION = "keep_rule"
"""The name of each rule's action request: approving it keeps the rule."""

REVIEW_HELP = (
    'Resume with {"decisions": [...]}, one decision per rule in the order shown: '
    '{"type": "approve"} keeps the rule, {"type": "edit", "edited_action": '
    '{"name": "keep_rule", "args": <the edited rule>}} replaces it, '
    '{"type": "reject"} drops it. Also read: true or {"approve": true} (keep every '
    'rule), {"drop": [rule ids]}, {"rules": [edited rule dicts]}.'
)

_TEXT_FIELDS = frozenset(
    name
    for name, field in Rule.model_fields.items()
    if field.annotation in (str, str | None)
)
"""The rule fields whose value is text; the others are lists, objects or numbers."""


def _summary(rule: Mapping[str, Any]) -> str:
    """One line for a person: [id] name: condition -> action."""
    text = (
        f"[{rule['rule_id']}] {rule['name']}: "
        f"{rule['condition']} \N{RIGHTWARDS ARROW} {rule['action']}"
    )
    return " ".join(text.split())


def _rule_action(rule: dict[str, Any]) -> ActionRequest:
    return {"name": _REVIEW_ACTION, "args": rule, "description": _summary(rule)}


def review(state: QueryState) -> dict[str, Any]:
    """Pause for a person to approve, edit or reject each extracted rule.

    The interrupt's value is LangChain's human-in-the-loop request (`HITLRequest`),
    as LangGraph Studio and Agent Chat UI render it: one `keep_rule` action request
    per rule (its args are the rule as JSON, its description one line: id, name,
    condition -> action), every one allowing approve, edit and reject; and
    `problem`, why the previous answer was not applied (None at first).

    Resume with `Command(resume={"decisions": [...]})`, one decision per rule in
    order: `{"type": "approve"}` keeps the rule, `{"type": "edit", "edited_action":
    {"name": "keep_rule", "args": {...}}}` replaces it with the args (a rule),
    `{"type": "reject"}` drops it and the relations pointing at it. The earlier
    answers are read too: `True` (or `{"approve": True}`) keeps every rule,
    `{"drop": [rule ids]}` removes some, `{"rules": [rule dicts]}` replaces them.
    An answer that cannot be applied is not an error that ends the run: the review
    asks again, saying why. Whether to review is up to the context of the run that
    extracted the rules.
    """
    if not state.get("review_requested"):
        return {}
    rules = [rule.model_dump(mode="json") for rule in _rules(state)]
    reviewed = ask(
        [_rule_action(rule) for rule in rules],
        lambda answer: apply_review(rules, answer),
    )
    return {"rules": [Rule.model_validate(rule) for rule in reviewed]}


def apply_review(rules: list[dict[str, Any]], decision: object) -> list[dict[str, Any]]:
    """The rules after a reviewer's answer (see `review`).

    Raises:
        ValueError: The answer is not one of the accepted forms, or leaves an
            invalid rulebook.
    """
    if isinstance(decision, Mapping) and "decisions" in decision:
        rules = _apply_decisions(rules, decision)
    elif decision is not True:
        rules = _apply_earlier_answer(rules, decision)
    try:
        Rulebook.from_rules(rules)
    except ValidationError as error:
        msg = f"The reviewed rules do not form a valid rulebook: {error}"
        raise ValueError(msg) from None
    return rules


def _apply_decisions(
    rules: list[dict[str, Any]], answer: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The rules after LangChain's `{"decisions": [...]}`, one per rule."""
    mixed = sorted(set(answer) & {"approve", "drop", "rules"})
    if mixed:
        msg = f"Answer with decisions only, not with {mixed} as well. {REVIEW_HELP}"
        raise ValueError(msg)
    decisions = read_decisions(answer, [_rule_action(rule) for rule in rules])
    kept: list[dict[str, Any]] = []
    rejected: set[str] = set()
    for i, (rule, decision) in enumerate(zip(rules, decisions, strict=True)):
        if decision["type"] == "approve":
            kept.append(rule)
        elif decision["type"] == "edit":
            kept.append(_edited_rule(i, decision["edited_action"]["args"]))
        else:
            rejected.add(rule["rule_id"])
    # An edit may give a rule a rejected rule's id: relations to it still hold.
    return _dropping(kept, rejected - {rule["rule_id"] for rule in kept})


def _edited_rule(i: int, args: Mapping[str, Any]) -> dict[str, Any]:
    # Agent Chat UI edits each arg as text: an edited list or object comes back as
    # JSON text.
    fields = {
        key: _json_or_text(value)
        if isinstance(value, str) and key not in _TEXT_FIELDS
        else value
        for key, value in args.items()
    }
    try:
        return Rule.model_validate(fields).model_dump(mode="json")
    except ValidationError as error:
        msg = f"decisions[{i}]: the edited args are not a valid rule: {error}"
        raise ValueError(msg) from None


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _apply_earlier_answer(
    rules: list[dict[str, Any]], decision: object
) -> list[dict[str, Any]]:
    """The rules after `{"approve": True}`, `{"drop": [...]}` or `{"rules": [...]}`."""
    if not isinstance(decision, Mapping) or not decision:
        msg = f"Unreadable review answer {decision!r}. {REVIEW_HELP}"
        raise ValueError(msg)
    unknown = set(decision) - {"approve", "drop", "rules"}
    if unknown or decision.get("approve", True) is not True:
        msg = f"Unreadable review answer {dict(decision)!r}. {REVIEW_HELP}"
        raise ValueError(msg)
    if "rules" in decision:
        rules = [
            Rule.model_validate(r).model_dump(mode="json") for r in decision["rules"]
        ]
    if "drop" in decision:
        dropped = set(decision["drop"])
        missing = dropped - {r["rule_id"] for r in rules}
        if missing:
            msg = f"Cannot drop unknown rule ids {sorted(missing)}. {REVIEW_HELP}"
            raise ValueError(msg)
        rules = _dropping(rules, dropped)
    return rules


def _dropping(rules: list[dict[str, Any]], dropped: set[str]) -> list[dict[str, Any]]:
    """`rules` without the `dropped` ids, and without the relations pointing at them."""
    return [
        {
            **r,
            "relations": [
                rel for rel in r["relations"] if rel["other_rule_id"] not in dropped
            ],
        }
        for r in rules
        if r["rule_id"] not in dropped
    ]


def plan(
    state: QueryState,
    config: RunnableConfig,
    retry: CallRetry,
    default: QueryContext,
    files: str | os.PathLike[str] | None = ANYWHERE,
) -> dict[str, Any]:
    """Filter and prefilter the rules (`MatchEngine.plan`): what will be judged."""
    context = _context(default)
    rules = _rules(state)
    engine = _planning_engine(state, context, retry, files, rules)
    planned = engine.plan(_query(state), rules, context.options(), config)
    # The cache is read once for the whole plan; the tasks judge only the rest.
    return {"plan": planned, "verdicts": engine.recall(planned)}


async def aplan(
    state: QueryState,
    config: RunnableConfig,
    retry: CallRetry,
    default: QueryContext,
    files: str | os.PathLike[str] | None = ANYWHERE,
) -> dict[str, Any]:
    """Async `plan`: the prefilter runs on the event loop."""
    context = _context(default)
    rules = _rules(state)
    engine = _planning_engine(state, context, retry, files, rules)
    options = context.options()
    planned = await engine.aplan(_query(state), rules, options, config)
    return {"plan": planned, "verdicts": await engine.arecall(planned)}


class MatchRequest(TypedDict):
    """The payload of one `match_rule` task: the rules of one model call."""

    plan: MatchPlan
    rules: list[Rule]
    cache_key: str
    run: str
    """The run's id, to mark the usage of the task's calls."""
    rule_schema: RuleSchema | None
    """The rules' schema, which decides the judge's profile (see `QueryState`)."""


def _request(request: MatchRequest) -> tuple[MatchPlan, list[Rule]]:
    rules = [Rule.model_validate(rule) for rule in request["rules"]]
    return MatchPlan.model_validate(request["plan"]), rules


def to_matches(
    state: QueryState, retry: CallRetry, default: QueryContext
) -> list[Send] | str:
    """One `match_rule` task per model call of the plan's rules not yet judged.

    The rules `plan` found in the cache are in the state already: a fully cached
    query goes straight to `execute`.
    """
    planned = _plan(state)
    known = {Verdict.model_validate(v).rule_id for v in state.get("verdicts", [])}
    todo = planned.model_copy(
        update={"candidates": [r for r in planned.candidates if r.rule_id not in known]}
    )
    if not todo.candidates:
        return "execute"
    engine = _engine(state, _context(default), retry)
    # The plan goes without its candidates: each task carries its own rules.
    shared = planned.model_copy(update={"candidates": []})
    return [
        Send(
            "match_rule",
            {
                "plan": shared,
                "rules": unit,
                "cache_key": "+".join(
                    engine.judge.cache_key(planned.query, rule) for rule in unit
                ),
                "run": state.get("run", ""),
                "rule_schema": state.get("rule_schema"),
            },
        )
        for unit in engine.call_units(todo)
    ]


def match_rule(
    request: MatchRequest,
    config: RunnableConfig,
    retry: CallRetry,
    default: QueryContext,
) -> dict[str, Any]:
    """Judge one call's rules against the query (the judge never sees an action).

    A judgment that still fails after the judge's retries stops the run (never a
    silent NO) unless `on_error="not_applicable"`; a checkpointed run resumes from
    there.
    """
    engine = _engine(request, _context(default), retry)
    planned, rules = _request(request)
    # `plan` read the cache for every rule: only misses come here.
    with UsageCounter().counting() as counter:
        verdicts = engine.judge_rules(planned, config, rules, recalled=True)
    return {"verdicts": verdicts, "judging_usage": [_marked(request, counter)]}


async def amatch_rule(
    request: MatchRequest,
    config: RunnableConfig,
    retry: CallRetry,
    default: QueryContext,
) -> dict[str, Any]:
    """Async `match_rule`."""
    engine = _engine(request, _context(default), retry)
    planned, rules = _request(request)
    with UsageCounter().counting() as counter:
        verdicts = await engine.ajudge_rules(planned, config, rules, recalled=True)
    return {"verdicts": verdicts, "judging_usage": [_marked(request, counter)]}


def _marked(request: MatchRequest, counter: UsageCounter) -> JudgingUsage:
    return {"run": request.get("run", ""), "usage": counter.usage}


def _judged_usage(state: QueryState) -> TokenUsage:
    """What this run's judgments cost; those replayed from the node cache, none."""
    run = state.get("run", "")
    return sum(
        (
            TokenUsage.model_validate(task["usage"])
            for task in state.get("judging_usage", [])
            if task["run"] == run
        ),
        TokenUsage(),
    )


def execute(
    state: QueryState,
    config: RunnableConfig,
    retry: CallRetry,
    default: QueryContext,
    files: str | os.PathLike[str] | None = ANYWHERE,
) -> dict[str, Any]:
    """Select (`MatchEngine.result`), then answer with only the matched actions."""
    context = _context(default)
    planned = _plan(state)
    verdicts = [Verdict.model_validate(v) for v in state.get("verdicts", [])]
    rules = _rules(state)
    engine = _planning_engine(state, context, retry, files, rules)
    result = engine.result(planned, verdicts, _judged_usage(state))
    engine.retrain_if_due(rules)
    summary = result.summary()
    dispatch_custom_event(MATCH_EVENT, summary, config=config)
    by_id = {rule.rule_id: rule for rule in planned.candidates}
    chosen = [by_id[str(doc.id)] for doc in result.documents]
    execution = UsageCounter()
    answer = _executor(context).invoke(
        {"input": _query(state), "rules": chosen}, execution.watch(config)
    )
    matches: list[Match] = [
        {
            "rule_id": str(doc.id),
            "name": doc.metadata["name"],
            "score": doc.metadata["score"],
            "reason": doc.metadata["reason"],
        }
        for doc in result.documents
    ]
    cost = {
        "rules": len(state.get("rules") or []),
        "candidates": result.candidates,
        "judgments": len(result.verdicts),
        "cached": summary["cached"],
        "applicable": summary["applicable"],
        "failed": len(result.failed_rule_ids),
        "explored": len(result.explored_rule_ids),
        "executor_calls": 1,
        "judge_usage": result.usage.model_dump() if result.usage else None,
        "executor_usage": execution.usage.model_dump(),
        "seconds": round(time.time() - state.get("started", planned.started), 3),
    }
    # The inputs are consumed, so a later run on this thread starts from its own.
    return {
        "answer": _jsonable(answer),
        "matches": matches,
        "cost": cost,
        "result": result,
        "query": None,
        "rulebook": None,
        "documents": None,
        "rule_schema": None,
    }


def _jsonable(answer: Any) -> Any:
    dump = getattr(answer, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(answer, tuple) and hasattr(answer, "_asdict"):
        return dict(answer._asdict())
    return answer


def _judgment_key(request: object) -> str:
    # get_graph() also calls this, with placeholder input, to draw the graph.
    return str(request.get("cache_key", "")) if isinstance(request, Mapping) else ""


def _node(
    function: Any, afunction: Any, name: str, **bound: Any
) -> RunnableLambda[Any, Any]:
    return RunnableLambda(
        functools.partial(function, **bound),
        afunc=None if afunction is None else functools.partial(afunction, **bound),
        name=name,
    )


def build_query_graph(
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    cache: BaseCache[Any] | None = None,
    retry: CallRetry | None = None,
    rulebook_dir: str | os.PathLike[str] | None = ANYWHERE,
) -> CompiledStateGraph[QueryState, QueryContext, QueryInput, QueryOutput]:
    """Compile the query graph.

    With `QueryContext(review=True)`, a run from documents pauses after extraction
    with LangChain's human-in-the-loop request, one `keep_rule` action per rule;
    resume with `Command(resume={"decisions": [...]})`, one approve, edit or reject
    per rule in order (the earlier answers `True`, `{"drop": [...]}` and
    `{"rules": [...]}` are read too; see `review`).

    Args:
        checkpointer: Needed for `review` (interrupts; a run that would review
            without one is refused before extraction) and to keep threads.
        cache: LangGraph node cache for judgments: a (query, rule) pair already
            judged by the same model and profile is not sent again.
        retry: Backoff for transient model errors: the judge's own retries (they
            honour `Retry-After`; a judge given in the context gets these in place
            of its own) and the extraction and executor nodes' retry policy.
        rulebook_dir: Where a rulebook path in a run's input may be: `ANYWHERE`
            (the default, for a graph run in your own process), a folder (paths
            are resolved inside it, links included, and none outside is opened),
            or None (no path is opened). A served graph takes the folder from
            `$TAG_RULEBOOK_DIR` (`graphs/query.py`): none unless its operator
            sets one. Either way a path is a regular file of at most
            `MAX_RULEBOOK_BYTES`, checked before it is read.
    """
    retry = retry or _DEFAULT_RETRY
    node_retry = retry.as_node_policy()
    builder = StateGraph(
        QueryState,
        context_schema=QueryContext,
        input_schema=QueryInput,
        output_schema=QueryOutput,
    )
    builder.add_node(
        "load_rulebook", functools.partial(load_rulebook, rulebook_dir=rulebook_dir)
    )
    builder.add_node(
        "extract",
        RunnableLambda(extract, afunc=aextract, name="extract"),
        retry_policy=node_retry,
    )
    builder.add_node("review", review)
    # A run given no context shares this one, and so one engine (its bound).
    bound: dict[str, Any] = {"retry": retry, "default": QueryContext()}
    planning = {**bound, "files": rulebook_dir}
    builder.add_node("plan", _node(plan, aplan, "plan", **planning))
    builder.add_node(
        "match_rule",
        _node(match_rule, amatch_rule, "match_rule", **bound),
        cache_policy=CachePolicy(key_func=_judgment_key),
        input_schema=MatchRequest,
    )
    builder.add_node(
        "execute",
        _node(execute, None, "execute", **planning),
        retry_policy=node_retry,
    )
    builder.add_edge(START, "load_rulebook")
    builder.add_conditional_edges("load_rulebook", after_load, ["extract", "plan"])
    builder.add_edge("extract", "review")
    builder.add_edge("review", "plan")
    builder.add_conditional_edges(
        "plan",
        functools.partial(to_matches, **bound),
        ["match_rule", "execute"],
    )
    builder.add_edge("match_rule", "execute")
    builder.add_edge("execute", END)
    return builder.compile(checkpointer=checkpointer, cache=cache, name="tag_query")
