"""TAG end to end as a LangGraph graph: rulebook -> pairwise matching -> execution.

    load_rulebook -> (extract -> review?) -> match_rule* -> execute

`load_rulebook` takes the rulebook given in the input, or runs the extraction graph
when only documents are given; `review` (optional) pauses with `interrupt()` so a
person can approve, edit or drop the extracted rules; `match_rule` is fanned out with
one `Send` per candidate rule (one judgment each, the action withheld); `execute`
sees the input and only the matched actions.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.cache.base import BaseCache
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import get_runtime
from langgraph.types import CachePolicy, Overwrite, Send, interrupt
from pydantic import ConfigDict, ValidationError
from pydantic.json_schema import SkipJsonSchema
from typing_extensions import NotRequired, TypedDict

from langchain_tag._graph import as_documents
from langchain_tag._graph import coerce_context as _coerce
from langchain_tag.execution import (
    CODE_TEMPLATE,
    GENERIC_TEMPLATE,
    NBA_TEMPLATE,
    NPOV_TEMPLATE,
    ActionOnlyExecutor,
    ExecutionTemplate,
)
from langchain_tag.extraction.graph import (
    ExtractionInput,
    ExtractionSettings,
    build_extraction_graph,
)
from langchain_tag.matching import (
    CONDITION_PROFILE,
    NBA_PROFILE,
    ApplicabilityJudge,
    BaseJudge,
    RuleSchemaProfile,
    Verdict,
)
from langchain_tag.matching.judge import check_selection, select_applicable
from langchain_tag.models import CallRetry, default_chat_model, with_settings
from langchain_tag.rules import Rule, Rulebook

__all__ = [
    "Match",
    "QueryContext",
    "QueryInput",
    "QueryOutput",
    "build_query_graph",
]

PROFILES: dict[str, RuleSchemaProfile] = {
    "condition": CONDITION_PROFILE,
    "nba": NBA_PROFILE,
}
"""Rule-schema profiles selectable by name in `QueryContext.profile`."""

TEMPLATES: dict[str, ExecutionTemplate] = {
    "generic": GENERIC_TEMPLATE,
    "npov": NPOV_TEMPLATE,
    "code": CODE_TEMPLATE,
    "nba": NBA_TEMPLATE,
}
"""Executor templates selectable by name in `QueryContext.template`."""


@dataclass(frozen=True)
class QueryContext:
    """Per-run settings (the graph's `context_schema`).

    Model and profile objects are for Python callers; LangGraph Studio shows the
    JSON-able fields only and its runs use the models from the environment.
    """

    __pydantic_config__ = ConfigDict(arbitrary_types_allowed=True)

    judge_model: SkipJsonSchema[BaseChatModel | None] = None
    """The applicability judge; None uses `default_chat_model()`."""
    judge: SkipJsonSchema[BaseJudge | None] = None
    """A ready judge (e.g. a `CascadeJudge`) instead of one made from `judge_model`,
    `logprobs` and `profile`. Its own retries and cache then run inside the
    node's."""
    executor_model: SkipJsonSchema[BaseChatModel | None] = None
    """The executor; None uses the judge's model."""
    k: int | None = None
    """Execute with at most this many matched rules (best scores first)."""
    score_threshold: float | None = None
    logprobs: bool = False
    """Score verdicts by logprobs (models with a `logprobs` option, as ChatOpenAI)."""
    profile: str | SkipJsonSchema[RuleSchemaProfile] = "condition"
    """A profile name from `PROFILES`, or a `RuleSchemaProfile`."""
    template: str | SkipJsonSchema[ExecutionTemplate] = "generic"
    """A template name from `TEMPLATES`, or an `ExecutionTemplate`."""
    review: bool = False
    """Pause after extraction for a person to approve, edit or drop rules."""
    domain: str = "instruction"
    """Domain string for extraction, when the input brings documents."""
    on_error: Literal["raise", "not_applicable"] = "raise"
    """A judgment that fails after its retries: stop the run, or continue with that
    rule flagged as unjudged (not applicable), for the judge built here."""

    def __post_init__(self) -> None:
        """Refuse a `k` or `score_threshold` the executor step could not honour."""
        check_selection(self.k, self.score_threshold)


class QueryInput(TypedDict):
    """A query, and the rules to answer it with (or documents to extract them from)."""

    query: str
    rulebook: NotRequired[dict[str, Any] | str]
    """A rulebook as JSON (e.g. `Rulebook.model_dump(mode="json")`) or a file path."""
    documents: NotRequired[list[Document]]


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


Records = list[dict[str, Any]]


def _verdicts(left: Records, right: Records) -> Records:
    return left + right


class QueryState(TypedDict, total=False):
    """The graph's state; verdicts are cleared at the start of every run."""

    query: str
    rulebook: dict[str, Any] | str | None
    documents: list[Document] | None
    rules: list[dict[str, Any]] | None
    verdicts: Annotated[list[dict[str, Any]], _verdicts]
    started: float
    review_requested: bool
    answer: Any
    matches: list[Match]
    cost: dict[str, Any]


def _context() -> QueryContext:
    return _coerce(get_runtime(QueryContext).context, QueryContext)


@functools.cache
def _environment_model() -> BaseChatModel:
    return default_chat_model()


_DEFAULT_RETRY = CallRetry()

_judges: dict[tuple[int, CallRetry], tuple[QueryContext, BaseJudge]] = {}
_judges_lock = threading.Lock()
_MAX_JUDGES = 64


def _judge(context: QueryContext, retry: CallRetry) -> BaseJudge:
    """The run's judge, built once per context and shared by its M `match_rule` tasks.

    Building one costs a model copy and a structured-output wrapper (about a
    millisecond with ChatOpenAI), too much to repeat for every rule.
    """
    key = (id(context), retry)
    with _judges_lock:
        cached = _judges.get(key)
        # The entry keeps its context alive, so the id cannot name another one.
        if cached is not None and cached[0] is context:
            return cached[1]
    judge = _build_judge(context, retry)
    with _judges_lock:
        if len(_judges) >= _MAX_JUDGES:
            _judges.clear()
        _judges[key] = (context, judge)
    return judge


def _build_judge(context: QueryContext, retry: CallRetry) -> BaseJudge:
    # The judge's retries are the match nodes' only layer (they honour the
    # provider's Retry-After, which LangGraph's node retry policy cannot): a judge
    # passed in gets the graph's retries in place of its own.
    if context.judge is not None:
        return context.judge.with_call_retry(retry)
    return ApplicabilityJudge(
        llm=context.judge_model or _environment_model(),
        profile=_profile(context),
        logprobs=context.logprobs,
        retry=retry,
        on_error=context.on_error,
        cache=None,  # judgments are cached by the graph's node cache, if any
    )


_NamedT = TypeVar("_NamedT")


def _named(value: str | _NamedT, table: Mapping[str, _NamedT], kind: str) -> _NamedT:
    """`value` itself, or the entry of `table` it names."""
    if not isinstance(value, str):
        return value
    if value not in table:
        msg = f"Unknown {kind} {value!r}; choose from {sorted(table)}."
        raise ValueError(msg)
    return table[value]


def _profile(context: QueryContext) -> RuleSchemaProfile:
    return _named(context.profile, PROFILES, "profile")


def _template(context: QueryContext) -> ExecutionTemplate:
    return _named(context.template, TEMPLATES, "template")


def _executor(context: QueryContext) -> ActionOnlyExecutor:
    llm = (
        context.executor_model
        or context.judge_model
        or (context.judge.final_llm if context.judge is not None else None)
        or _environment_model()
    )
    # The node's retry policy is the one layer: the client's own would multiply it.
    llm, _ = with_settings(llm, max_retries=0)
    return ActionOnlyExecutor(llm=llm, template=_template(context))


# --- nodes ---------------------------------------------------------------------------


def load_rulebook(state: QueryState) -> dict[str, Any]:
    """Start a run: clear earlier verdicts, read the rulebook if one was given.

    The run's inputs are consumed at its end (see `execute`), so on a reused thread
    a rulebook or documents present here were given to this run.
    """
    context = _context()
    _profile(context)  # unknown profile or template names fail before any model call
    _template(context)
    update: dict[str, Any] = {
        "verdicts": Overwrite([]),
        "started": time.time(),
        # Decided by the run that starts, not by the one that resumes: a resume
        # (from another client or server) need not repeat the context.
        "review_requested": context.review,
    }
    given = state.get("rulebook")
    if given is None:
        if not state.get("documents"):
            msg = "The query graph needs a rulebook, or documents to extract one from."
            raise ValueError(msg)
        return {**update, "rules": None}
    rulebook = (
        Rulebook.load(given) if isinstance(given, str) else Rulebook.from_data(given)
    )
    return {**update, "rules": [r.model_dump(mode="json") for r in rulebook.rules]}


def after_load(state: QueryState) -> Literal["extract", "plan"]:
    """Extract first when no rulebook was given."""
    return "extract" if state.get("rules") is None else "plan"


def _extraction(state: QueryState) -> tuple[ExtractionInput, ExtractionSettings]:
    """The extraction graph's input and settings for this run's documents."""
    context = _context()
    inputs: ExtractionInput = {
        "documents": as_documents(state.get("documents") or []),
        "domain": context.domain,
    }
    return inputs, ExtractionSettings(llm=context.judge_model)


def _extracted(output: dict[str, Any]) -> dict[str, Any]:
    return {"rulebook": output["rulebook"], "rules": output["rulebook"]["rules"]}


def extract(state: QueryState, config: RunnableConfig) -> dict[str, Any]:
    """Run the extraction graph (as a subgraph of this run) over the documents."""
    inputs, settings = _extraction(state)
    graph = build_extraction_graph()
    return _extracted(graph.invoke(inputs, config, context=settings))


async def aextract(state: QueryState, config: RunnableConfig) -> dict[str, Any]:
    """Async `extract`: the subgraph runs on the event loop too.

    Run in a worker thread instead, it would call the checkpointer's sync methods,
    which async-only checkpointers (a LangGraph server's custom one) do not have.
    """
    inputs, settings = _extraction(state)
    graph = build_extraction_graph()
    return _extracted(await graph.ainvoke(inputs, config, context=settings))


REVIEW_HELP = (
    "Resume with True or {'approve': True} to keep the rules, {'drop': [rule ids]} "
    "to remove some, or {'rules': [edited rule dicts]} to replace them."
)


def review(state: QueryState) -> dict[str, Any]:
    """Pause for a person to approve, edit or drop the extracted rules.

    Resume with `Command(resume=...)`: `True` (or `{"approve": True}`) keeps the
    rules; `{"drop": [rule ids]}` removes some (and the relations pointing at them);
    `{"rules": [rule dicts]}` replaces them with edited ones. An answer that cannot
    be applied is not an error that ends the run: the review asks again, saying why.
    Whether to review is up to the context of the run that extracted the rules.
    """
    if not state.get("review_requested"):
        return {}
    rules = state.get("rules") or []
    problem = None
    while True:
        # Each retry is a new interrupt: LangGraph replays earlier answers to the
        # earlier interrupts, so a bad answer never sticks to the thread.
        decision = interrupt(
            {
                "message": "Approve, edit or drop the extracted rules.",
                "how": REVIEW_HELP,
                "problem": problem,
                "rules": rules,
            }
        )
        try:
            return {"rules": apply_review(rules, decision)}
        except (ValueError, TypeError) as error:
            problem = str(error)


def apply_review(rules: list[dict[str, Any]], decision: object) -> list[dict[str, Any]]:
    """The rules after a reviewer's decision (see `review`).

    Raises:
        ValueError: The decision is not one of the accepted forms, or leaves an
            invalid rulebook.
    """
    if decision is True:
        return rules
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
        rules = [
            {
                **r,
                "relations": [
                    rel for rel in r["relations"] if rel["other_rule_id"] not in dropped
                ],
            }
            for r in rules
            if r["rule_id"] not in dropped
        ]
    try:
        Rulebook.from_rules(rules)
    except ValidationError as error:
        msg = f"The reviewed rules do not form a valid rulebook: {error}"
        raise ValueError(msg) from None
    return rules


def to_matches(
    state: QueryState, retry: CallRetry = _DEFAULT_RETRY
) -> list[Send] | str:
    """One `match_rule` task per candidate rule."""
    judge = _judge(_context(), retry)
    sends = []
    for rule_data in state.get("rules") or []:
        rule = Rule.model_validate(rule_data)
        sends.append(
            Send(
                "match_rule",
                {
                    "query": state["query"],
                    "rule": rule_data,
                    "cache_key": judge.cache_key(state["query"], rule),
                },
            )
        )
    return sends or "execute"


class MatchRequest(TypedDict):
    """The payload of one `match_rule` task."""

    query: str
    rule: dict[str, Any]
    cache_key: str


def match_rule(
    request: MatchRequest, config: RunnableConfig, retry: CallRetry = _DEFAULT_RETRY
) -> dict[str, Any]:
    """Judge one rule against the query (the judge never sees the action).

    A judgment that still fails after the judge's retries stops the run (never a
    silent NO); a checkpointed run resumes from there.
    """
    rule = Rule.model_validate(request["rule"])
    verdict = _judge(_context(), retry).invoke((request["query"], rule), config)
    return {"verdicts": [verdict.model_dump(mode="json")]}


async def amatch_rule(
    request: MatchRequest, config: RunnableConfig, retry: CallRetry = _DEFAULT_RETRY
) -> dict[str, Any]:
    """Async `match_rule`."""
    rule = Rule.model_validate(request["rule"])
    verdict = await _judge(_context(), retry).ainvoke((request["query"], rule), config)
    return {"verdicts": [verdict.model_dump(mode="json")]}


def execute(state: QueryState, config: RunnableConfig) -> dict[str, Any]:
    """Answer with the input and only the matched rules' actions."""
    context = _context()
    verdicts = [Verdict.model_validate(v) for v in state.get("verdicts", [])]
    by_id = {rule["rule_id"]: rule for rule in state.get("rules") or []}
    chosen = [
        (by_id[v.rule_id], v)
        for v in select_applicable(
            verdicts, list(by_id), k=context.k, threshold=context.score_threshold
        )
    ]
    rules = [Rule.model_validate(rule) for rule, _ in chosen]
    answer = _executor(context).invoke(
        {"input": state["query"], "rules": rules}, config
    )
    matches: list[Match] = [
        {
            "rule_id": v.rule_id,
            "name": rule["name"],
            "score": v.score,
            "reason": v.reason,
        }
        for rule, v in chosen
    ]
    cost = {
        "rules": len(state.get("rules") or []),
        "judgments": len(verdicts),
        "applicable": sum(v.applies for v in verdicts),
        "failed": sum(v.failed for v in verdicts),
        "executor_calls": 1,
        "seconds": round(time.time() - state.get("started", time.time()), 3),
    }
    # The inputs are consumed, so a later run on this thread starts from its own.
    return {
        "answer": _jsonable(answer),
        "matches": matches,
        "cost": cost,
        "rulebook": None,
        "documents": None,
    }


def _jsonable(answer: Any) -> Any:
    dump = getattr(answer, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(answer, tuple) and hasattr(answer, "_asdict"):
        return dict(answer._asdict())
    return answer


def _join(state: QueryState) -> dict[str, Any]:
    """Where the rules are final (after extraction and review); fans out next."""
    del state
    return {}


def _judgment_key(request: object) -> str:
    # get_graph() also calls this, with placeholder input, to draw the graph.
    return str(request.get("cache_key", "")) if isinstance(request, Mapping) else ""


def build_query_graph(
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    cache: BaseCache[Any] | None = None,
    retry: CallRetry | None = None,
) -> CompiledStateGraph[QueryState, QueryContext, QueryInput, QueryOutput]:
    """Compile the query graph.

    Args:
        checkpointer: Needed for `review` (interrupts) and to keep threads.
        cache: LangGraph node cache for judgments: a (query, rule) pair already
            judged by the same model and profile is not sent again.
        retry: Backoff for transient model errors: the judge's own retries (they
            honour `Retry-After`; a judge given in the context gets these in place
            of its own) and the extraction and executor nodes' retry policy.
    """
    retry = retry or _DEFAULT_RETRY
    node_retry = retry.as_node_policy()
    builder = StateGraph(
        QueryState,
        context_schema=QueryContext,
        input_schema=QueryInput,
        output_schema=QueryOutput,
    )
    builder.add_node("load_rulebook", load_rulebook)
    builder.add_node(
        "extract",
        RunnableLambda(extract, afunc=aextract, name="extract"),
        retry_policy=node_retry,
    )
    builder.add_node("review", review)
    builder.add_node("plan", _join)
    builder.add_node(
        "match_rule",
        RunnableLambda(
            functools.partial(match_rule, retry=retry),
            afunc=functools.partial(amatch_rule, retry=retry),
            name="match_rule",
        ),
        cache_policy=CachePolicy(key_func=_judgment_key),
        input_schema=MatchRequest,
    )
    builder.add_node("execute", execute, retry_policy=node_retry)
    builder.add_edge(START, "load_rulebook")
    builder.add_conditional_edges("load_rulebook", after_load, ["extract", "plan"])
    builder.add_edge("extract", "review")
    builder.add_edge("review", "plan")
    builder.add_conditional_edges(
        "plan", functools.partial(to_matches, retry=retry), ["match_rule", "execute"]
    )
    builder.add_edge("match_rule", "execute")
    builder.add_edge("execute", END)
    return builder.compile(checkpointer=checkpointer, cache=cache, name="tag_query")
