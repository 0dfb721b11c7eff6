"""What a `tag eval` run would spend, worked out without calling any model.

`tag eval ... --estimate` prints, per method, the LLM calls (judge, executor and
grader), the input tokens (and how many of them a provider's prompt cache would
serve), the output tokens, and the dollars at given prices, list and batch, before
a single call is paid for. The figures come from the real code, not from a formula:

- Every method is built as the run builds it (`Method.build`), its judge and
  executor models replaced by `NoCallChatModel`, a placeholder that refuses to
  answer (`EstimateModeError`): an estimate that would need a model fails loudly
  instead of spending anything.
- Whatever needs no model runs for real: prefilters (similarity and learned, so
  each input's shortlist is the one the run would judge), chunk and rule
  similarity retrieval, and the methods that select without a model (their
  executor prompts are then exact).
- Each judge call is rendered with the judge's own prompt (`messages`, or
  `batch_messages` for the rules-per-call methods, split into calls by the
  judge's own `call_units`); each decision request (`DecisionJudge`: an input's
  candidate rules not cached, `questions_per_request` a request) with the judge's
  own questions (`question`), as `OpenAIClassifier` sends them: the input once
  and each question with its criteria appended. Each LLMChainFilter call with
  LangChain's filter prompt,
  each executor call with `ActionOnlyExecutor.messages`, each grader call with
  `EvalTask.grading_prompts`; their tokens are counted (`token_counter`).

Exact, when every call succeeds at its first attempt and answers in the format
asked: the calls of every method except the cascade, and the input tokens of the
prompts rendered for them (to the tokenizer's accuracy: cl100k_base, or about 4
characters a token without tiktoken). Estimated: the cascade's strong-stage calls
(an upper bound: every pair, though it only sees those the cheap judge does not
reject), output tokens (a judge's NO, a typical answer per execution template, a
short grader verdict), and the executor's prompt for methods that select with a
model: what they select is unknown before judging, so they are assumed to select
the input's gold rules among those judged (all of them without gold labels, an
upper bound). The oracle is no model: its answers are counted as look-ups, as
the harness counts them, not as calls; the chat oracle's cost no tokens and no
dollars, while the decision oracle's requests count (and price) the input tokens
a decision model would be sent, as the harness reports them. A decision request
is billed for its input tokens only: no output tokens, and no overhead for the
request's framing (none is known).

Cached input tokens are an estimate under a model of the provider's prompt cache
(`PromptCaching`, OpenAI's automatic caching by default): each request reads the
longest prefix it shares with an earlier request to the same model, in 128-token
steps once it reaches 1,024 tokens, except from the requests still in flight (as
many as the run's `max_concurrency`), and entries last the run
(`SimulatedPromptCache`). TAG's judge prompts put the instructions and the input
before the rule, so the judgments of an input after the first wave share most of
their prompt. Decision requests are counted with none cached: they send the input
first, but how a decision API caches is not modelled. Dollars are priced by
`TokenPrices.cost`: cached input tokens at the cached-input price, and at batch
prices (every price less the batch discount).

Not counted: retries after errors, rules a batched answer left out (judged
again alone), questions a decision model refuses (the rest asked again),
structured-output schemas a provider adds to the prompt, and calls that
embedding models make.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.decisions import (
    BaseDecisionModel,
    ClassifierResponse,
    Question,
    State,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableBinding, RunnableSequence
from pydantic import BaseModel, Field, model_validator

from langchain_tag.engine import rule_document
from langchain_tag.errors import TAGError
from langchain_tag.estimate import (
    DECISION_NOTE,
    EXECUTOR_ANSWERS,
    JUDGE_NO_REASON,
    Cost,
    Meter,
    decision_cost,
    executor_answer,
    judge_cost,
)
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.matching import (
    ApplicabilityJudge,
    BaseJudge,
    CascadeJudge,
    DecisionJudge,
)
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rule
from langchain_tag.usage import (  # the counter is re-exported from here too
    APPROXIMATE_CHARS_PER_TOKEN,
    DEFAULT_CACHING,
    MESSAGE_OVERHEAD,
    OFFLINE_ENCODING,
    REPLY_OVERHEAD,
    PromptCaching,
    TokenCounter,
    TokenPrices,
    TokenUsage,
    format_usd,
    token_counter,
)
from langchain_tag_experiments.baselines import ChunkApplicabilityRetriever
from langchain_tag_experiments.evaluation.methods import Method, MethodContext
from langchain_tag_experiments.evaluation.oracle import (
    OracleChatModel,
    OracleDecisionModel,
)
from langchain_tag_experiments.evaluation.runner import method_context
from langchain_tag_experiments.evaluation.tasks import EvalItem, EvalTask, TaskName

__all__ = [
    "APPROXIMATE_CHARS_PER_TOKEN",
    "DEFAULT_CACHING",
    "EXECUTOR_ANSWERS",
    "GRADER_ANSWER",
    "JUDGE_NO_REASON",
    "MESSAGE_OVERHEAD",
    "OFFLINE_ENCODING",
    "REPLY_OVERHEAD",
    "EstimateModeError",
    "MethodEstimate",
    "NoCallChatModel",
    "NoCallDecisionModel",
    "TokenCounter",
    "estimate_methods",
    "estimate_table",
    "token_counter",
]


# --- Answers, as their tokens are estimated -------------------------------------------

GRADER_ANSWER = json.dumps(
    {
        "verdict": "PASS",
        "reason": "The rewrite removes the violation and keeps the facts.",
        "scores": {"rem": 5, "pres": 5, "tone": 4, "flu": 5},
    }
)
"""A grader's answer, as its output tokens are estimated: a verdict, a reason and
four scores."""


# --- The placeholder model ------------------------------------------------------------


class EstimateModeError(TAGError, RuntimeError):
    """A model was asked to answer while estimating, which calls no model."""


def _refusal(role: str) -> str:
    """What a placeholder says when it is asked to answer."""
    return (
        f"estimate mode calls no model: the {role} placeholder was asked to "
        "answer. The estimate walks the methods it knows without calling their "
        "models; this one calls a model in a way it does not know."
    )


class NoCallChatModel(BaseChatModel):
    """Stands in for the judge and executor models of an estimate; never answers.

    Methods are built with it where the run has a model, so they are built exactly
    as the run builds them; any call raises `EstimateModeError`. It has the
    options the judges set on their copy of the model (`temperature`, `logprobs`,
    `top_logprobs`), so the cascade's cheap judge can be built with it too.
    """

    role: str = "model"
    """Which model it stands for, for the error message."""
    temperature: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @property
    def _llm_type(self) -> str:
        return "tag-estimate-placeholder"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise EstimateModeError(_refusal(self.role))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise EstimateModeError(_refusal(self.role))


class NoCallDecisionModel(BaseDecisionModel):
    """Stands in for the decision model of an estimate; never answers.

    `tag-decision` is built with it as the run builds it with its decision model;
    any request raises `EstimateModeError`.
    """

    model: str = "tag-estimate-placeholder"

    @property
    def _provider(self) -> str:
        return "tag-estimate-placeholder"

    def _classify(
        self, state: State, questions: dict[str, Question]
    ) -> ClassifierResponse:
        msg = _refusal("decision model")
        raise EstimateModeError(msg)


# --- The estimate of one method -------------------------------------------------------


class MethodEstimate(BaseModel):
    """What one method would spend on one task: calls, tokens and dollars."""

    task: TaskName
    method: str
    status: Literal["ok", "skipped"] = "ok"
    skip_reason: str | None = None
    n: int = Field(default=0, description="Inputs estimated.")
    judge_calls: int = Field(
        default=0,
        description="Retrieval's model calls: judges (both cascade stages), the "
        "relevance reranker, LLMChainFilter; not the oracle's look-ups.",
    )
    oracle_lookups: int = Field(
        default=0,
        description="Judgments the oracle would answer from the gold labels: "
        "look-ups, not calls (no tokens, $0); a run's `EvalResult.oracle_lookups`.",
    )
    executor_calls: int = 0
    grader_calls: int = Field(
        default=0, description="LLM grading calls (`EvalTask.grading_prompts`)."
    )
    calls: int = Field(
        default=0,
        description="Every model call: judge_calls + executor_calls + grader_calls "
        "(a run's `EvalResult.llm_calls + EvalResult.grader_calls`).",
    )
    input_tokens: int = Field(
        default=0, description="Of the rendered prompts; oracle look-ups count none."
    )
    cached_input_tokens: int = Field(
        default=0,
        description="Of `input_tokens`, those a provider would read from its prompt "
        "cache: estimated by the `PromptCaching` model (see the module).",
    )
    output_tokens: int = Field(default=0, description="Estimated (see the module).")
    dollars: float | None = Field(
        default=None, description="At the list prices given; None without prices."
    )
    batch_dollars: float | None = Field(
        default=None,
        description="At the batch prices (the list prices less the batch discount).",
    )
    exact_judge_calls: bool = Field(
        default=True,
        description="Whether `judge_calls` is exact (assuming first-attempt "
        "successes); False: an upper bound or an approximation (the notes say).",
    )
    exact_calls: bool = Field(
        default=True,
        description="Whether `calls` is exact: the judge calls are, and no grader "
        "call is counted (graders may skip an answer, so theirs are a bound).",
    )
    token_counter: str = Field(default="", description="How tokens were counted.")
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _total(self) -> MethodEstimate:
        self.calls = self.judge_calls + self.executor_calls + self.grader_calls
        return self

    @property
    def usage(self) -> TokenUsage:
        """The estimate as `TokenUsage`, as `TokenPrices.cost` prices it."""
        return TokenUsage(
            calls=self.calls,
            input_tokens=self.input_tokens,
            cached_input_tokens=self.cached_input_tokens,
            output_tokens=self.output_tokens,
        )


Known = Literal["exact", "gold", "all", "failed"]
"""How the executor's units of an input are known: retrieved for real, assumed
from the gold rules, assumed to be every candidate (an upper bound), or none (the
retrieval would fail)."""


@dataclass
class _Retrieval:
    cost: Cost = field(default_factory=Cost)
    units: list[Document] = field(default_factory=list)
    known: Known = "exact"


class _CannotEstimateError(TAGError):
    """A retriever or judge the estimate does not know how to walk."""


class _Walker:
    """Walks one built method over the inputs: calls and tokens of its retrieval.

    Keeps what each judge's verdict cache would hold, so a pair judged for an
    earlier input with the same text costs nothing again (as in the run, up to
    inputs judged concurrently).
    """

    def __init__(self, task: EvalTask, meter: Meter) -> None:
        self.task = task
        self.meter = meter
        self.gold = task.gold_rules()
        self.cached: dict[int, set[str]] = {}
        self.repeats = 0

    # -- judges ----------------------------------------------------------------------

    def _first_time(
        self, judge: ApplicabilityJudge | DecisionJudge, text: str, rule: Rule
    ) -> bool:
        if judge.cache is None:
            return True
        seen = self.cached.setdefault(id(judge), set())
        key = judge.cache_key(text, rule)
        if key in seen:
            self.repeats += 1
            return False
        seen.add(key)
        return True

    def _applicability(
        self,
        judge: ApplicabilityJudge,
        text: str,
        rules: Sequence[Rule],
        *,
        bounded: bool = False,
    ) -> Cost:
        return judge_cost(
            self.meter,
            judge,
            text,
            rules,
            lambda rule: self._first_time(judge, text, rule),
            bounded=bounded,
            lookup=isinstance(judge.llm, OracleChatModel),
        )

    def judge(self, judge: BaseJudge, text: str, rules: Sequence[Rule]) -> Cost:
        """Calls and tokens of judging `rules` against `text`."""
        if isinstance(judge, ApplicabilityJudge):
            return self._applicability(judge, text, rules)
        if isinstance(judge, DecisionJudge):
            return decision_cost(
                self.meter.counter,
                judge,
                text,
                rules,
                lambda rule: self._first_time(judge, text, rule),
                lookup=isinstance(judge.model, OracleDecisionModel),
            )
        if isinstance(judge, CascadeJudge):
            cost = self._applicability(judge.cheap, text, rules)
            # Upper bound: the strong judge sees only the pairs the cheap one does
            # not reject confidently, which only its logprobs would tell.
            cost.add(self._applicability(judge.strong, text, rules, bounded=True))
            return cost
        msg = (
            f"a {type(judge).__name__} judge (only applicability, decision and "
            "cascade judges)"
        )
        raise _CannotEstimateError(msg)

    # -- retrievers ------------------------------------------------------------------

    def retrieve(self, retriever: BaseRetriever, item: EvalItem) -> _Retrieval:
        """What `retriever` costs for `item`, and the units it would give."""
        if isinstance(retriever, TAGRetriever):
            return self._tag(retriever, item)
        if isinstance(retriever, ChunkApplicabilityRetriever):
            return self._tag(retriever.tag_retriever, item, chunks=retriever.chunks)
        if (filtered := self._chain_filter(retriever, item)) is not None:
            return filtered
        # Selects without a model (the placeholder refuses any call): run it.
        return _Retrieval(units=list(retriever.invoke(item.text)))

    def _tag(
        self,
        tag: TAGRetriever,
        item: EvalItem,
        *,
        chunks: Sequence[Document] | None = None,
    ) -> _Retrieval:
        # The retriever's own steps, so the shortlist is exactly the run's.
        plan = tag.engine.plan(item.text, tag.rulebook.rules, tag.options())
        candidates = plan.candidates
        cost = self.judge(tag.judge, item.text, candidates)
        chosen, known = self._selected(tag, item, candidates, chunks=chunks is not None)
        if tag.k is not None:
            chosen = chosen[: tag.k]
        if chunks is None:
            units = [rule_document(rule) for rule in chosen]
        else:
            units = [chunks[tag.rulebook.position(rule.rule_id)] for rule in chosen]
        return _Retrieval(cost, units, known)

    def _selected(
        self, tag: TAGRetriever, item: EvalItem, candidates: list[Rule], *, chunks: bool
    ) -> tuple[list[Rule], Known]:
        """The candidates the judge would pick: known for the oracle, else assumed.

        In rulebook order, as unscored verdicts are returned.
        """
        oracle = _oracle_gold(tag.judge)
        if oracle is not None:
            gold = oracle.get(item.text, frozenset())
            return [rule for rule in candidates if rule.rule_id in gold], "exact"
        if self.gold is not None and not chunks:
            gold = self.gold.get(item.id, frozenset())
            return [rule for rule in candidates if rule.rule_id in gold], "gold"
        return candidates, "all"

    def _chain_filter(
        self, retriever: BaseRetriever, item: EvalItem
    ) -> _Retrieval | None:
        """LangChain's LLMChainFilter over a base retriever: one call per document."""
        # Imported here, as the method builder does: a slow import.
        from langchain_classic.retrievers import (  # noqa: PLC0415
            ContextualCompressionRetriever,
        )
        from langchain_classic.retrievers.document_compressors import (  # noqa: PLC0415
            LLMChainFilter,
        )

        if not isinstance(retriever, ContextualCompressionRetriever):
            return None
        compressor = retriever.base_compressor
        if not isinstance(compressor, LLMChainFilter):
            msg = f"a {type(compressor).__name__} compressor (only LLMChainFilter)"
            raise _CannotEstimateError(msg)
        prompt = _first_prompt(compressor.llm_chain)
        documents = list(retriever.base_retriever.invoke(item.text))
        cost = Cost()
        for document in documents:
            rendered = prompt.invoke(compressor.get_input(item.text, document))
            cost.add(self.meter.request("judge", rendered.to_messages(), "NO"))
        return _Retrieval(cost, documents, "all")


def _oracle_gold(judge: BaseJudge) -> Mapping[str, AbstractSet[str]] | None:
    """The gold labels an oracle judge answers from; None for another judge."""
    if isinstance(judge, ApplicabilityJudge) and isinstance(judge.llm, OracleChatModel):
        return judge.llm.gold
    if isinstance(judge, DecisionJudge) and isinstance(
        judge.model, OracleDecisionModel
    ):
        return judge.model.gold
    return None


def _retrieve(
    walker: _Walker, retriever: BaseRetriever, item: EvalItem, failed: list[str]
) -> _Retrieval:
    """`walker.retrieve`; a retrieval the run would see fail is recorded in `failed`."""
    try:
        return walker.retrieve(retriever, item)
    except (_CannotEstimateError, EstimateModeError):
        raise
    except Exception as error:  # noqa: BLE001 - the run records it the same way
        failed.append(f"{item.id}: {type(error).__name__}: {error}")
        return _Retrieval(known="failed")


def _first_prompt(chain: Runnable[Any, Any]) -> BasePromptTemplate[Any]:
    """The prompt template a `prompt | llm | parser` chain starts with."""
    while isinstance(chain, RunnableBinding):
        chain = chain.bound
    first = chain.first if isinstance(chain, RunnableSequence) else chain
    if not isinstance(first, BasePromptTemplate):
        msg = "an LLMChainFilter whose chain does not start with a prompt template"
        raise _CannotEstimateError(msg)
    return first


# --- Estimating methods ---------------------------------------------------------------


@dataclass
class _Run:
    """What every method's estimate shares: the task, the models the run has."""

    context: MethodContext
    executor: ActionOnlyExecutor | None
    counter: TokenCounter
    prices: TokenPrices | None
    caching: PromptCaching | None
    tag_picks_unknown: bool = False
    """TAG was estimated, but what it picks is unknown (no gold labels)."""

    @property
    def task(self) -> EvalTask:
        return self.context.task

    def row(self, method: Method, **fields: Any) -> MethodEstimate:
        return MethodEstimate(
            task=self.task.name,
            method=method.name,
            token_counter=self.counter.name,
            **fields,
        )

    def estimate(self, method: Method) -> tuple[MethodEstimate, list[_Retrieval]]:
        reason = self.context.unavailable(method)
        if reason is not None:
            return self.row(method, status="skipped", skip_reason=reason), []
        try:
            retriever = method.build(self.context)
        except Exception as error:  # noqa: BLE001 - the run skips it the same way
            reason = f"could not be built: {error}"
            return self.row(method, status="skipped", skip_reason=reason), []
        # Calls in flight have not reached the provider's cache yet.
        meter = Meter(self.counter, self.caching, self.context.max_concurrency)
        walker = _Walker(self.task, meter)
        failed: list[str] = []
        try:
            retrievals = [
                _retrieve(walker, retriever, item, failed) for item in self.task.items
            ]
        except _CannotEstimateError as error:
            reason = f"cannot be estimated: it uses {error}"
            return self.row(method, status="skipped", skip_reason=reason), []
        except EstimateModeError as error:
            reason = f"cannot be estimated without calling a model ({error})"
            return self.row(method, status="skipped", skip_reason=reason), []
        tally = self._tally(method, meter, retrievals, failed, walker.repeats)
        return tally, retrievals

    def _tally(
        self,
        method: Method,
        meter: Meter,
        retrievals: Sequence[_Retrieval],
        failed: Sequence[str],
        repeats: int,
    ) -> MethodEstimate:
        retrieval, execution, grading = Cost(), Cost(), Cost()
        for item, found in zip(self.task.items, retrievals, strict=True):
            retrieval.add(found.cost)
            if self.executor is not None and found.known != "failed":
                execution.add(self._execute(meter, item, found.units))
                grading.add(self._grade(meter, item))
        notes = self._notes(method, retrievals, retrieval, failed, repeats)
        exact_judge = not (retrieval.bounded_calls or failed or repeats)
        total = Cost()
        for cost in (retrieval, execution, grading):
            total.add(cost)
        row = self.row(
            method,
            n=len(retrievals),
            judge_calls=retrieval.calls,
            oracle_lookups=retrieval.lookups,
            executor_calls=execution.calls,
            grader_calls=grading.calls,
            input_tokens=total.input_tokens,
            cached_input_tokens=total.cached_input_tokens,
            output_tokens=total.output_tokens,
            exact_judge_calls=exact_judge,
            # Graders may skip an answer (NPOV's pass-through guard): a bound.
            exact_calls=exact_judge and not grading.calls,
            notes=notes,
        )
        if self.prices is not None:
            row.dollars = self.prices.cost(row.usage)
            row.batch_dollars = self.prices.cost(row.usage, batch=True)
        return row

    def _execute(self, meter: Meter, item: EvalItem, units: Sequence[Document]) -> Cost:
        if self.executor is None:
            return Cost()
        text = item.task_input or item.text
        return meter.request(
            "executor",
            self.executor.messages(text, units),
            executor_answer(self.executor.template.name, text),
        )

    def _grade(self, meter: Meter, item: EvalItem) -> Cost:
        cost = Cost()
        for prompt in self.task.grading_prompts(item):
            # The run's grading model is its judge model.
            cost.add(meter.request("judge", prompt, GRADER_ANSWER))
        return cost

    def _notes(
        self,
        method: Method,
        retrievals: Sequence[_Retrieval],
        retrieval: Cost,
        failed: Sequence[str],
        repeats: int,
    ) -> list[str]:
        notes = []
        if method.explain is not None:
            notes.append(method.explain(self.context))
            if self.tag_picks_unknown:
                notes.append(
                    "TAG's picks are unknown before judging (no gold labels): k is "
                    "taken as if TAG had not run"
                )
        if retrieval.bounded_calls:
            notes.append(
                f"upper bound: {retrieval.bounded_calls:,} strong-judge calls counted "
                "for every pair; the cascade escalates only what its cheap judge "
                "does not reject confidently"
            )
        notes += _judging_notes(retrieval)
        if repeats:
            notes.append(
                f"{repeats:,} judgments repeat an earlier input's: counted as cached "
                "(inputs judged concurrently may pay them again)"
            )
        if failed:
            notes.append(
                f"{len(failed)} inputs' retrieval would fail (counted without calls), "
                f"e.g. {failed[0]}"
            )
        if self.executor is not None:
            known = {found.known for found in retrievals}
            if "gold" in known:
                notes.append(
                    "executor prompts estimated: the gold rules among those judged "
                    "stand for the judge's picks"
                )
            if "all" in known:
                notes.append(
                    "executor prompts an upper bound: every candidate stands for "
                    "the model's picks"
                )
        return notes


def _judging_notes(retrieval: Cost) -> list[str]:
    """What the oracle's look-ups and a decision model's requests count."""
    notes = []
    if retrieval.lookups and retrieval.decision_requests:
        notes.append(
            f"{retrieval.lookups:,} oracle look-ups: decision requests answered "
            "from the gold labels, not LLM calls; their input tokens are what a "
            "decision model would be sent, priced as such"
        )
    elif retrieval.lookups:
        notes.append(
            f"{retrieval.lookups:,} oracle look-ups: answered from the gold "
            "labels, not LLM calls: no tokens, $0"
        )
    if retrieval.decision_requests:
        notes.append(DECISION_NOTE)
    return notes


def _tag_mean_picks(retrievals: Sequence[_Retrieval]) -> float | None:
    """TAG's mean picks as estimated; None unless known or assumed from gold."""
    counted = [found for found in retrievals if found.known != "failed"]
    if not counted or any(found.known == "all" for found in counted):
        return None  # every candidate is a bound, not TAG's picks
    return sum(len(found.units) for found in counted) / len(counted)


def estimate_methods(
    task: EvalTask,
    methods: Sequence[Method],
    *,
    judge: bool,
    cheap_judge: bool,
    executor: bool,
    embeddings: Embeddings | None,
    decision: bool = False,
    max_concurrency: int = 8,
    rules_sim_k: int | None = None,
    prices: TokenPrices | None = None,
    caching: PromptCaching | None = DEFAULT_CACHING,
) -> list[MethodEstimate]:
    """What running `methods` on `task` would spend, calling no model.

    Args:
        task: The task, limited as the run would be (`task.limited(limit)`).
            Its grading model, as in the run, is the judge model.
        methods: The methods to estimate, in run order (e.g. `select_methods(
            standard_methods(task.name), patterns)`).
        judge: Whether the run has a judge model (else its methods are skipped).
        cheap_judge: Whether it has the cascade's cheap judge model.
        executor: Whether it has an executor model (executor calls and, with
            them, grader calls are counted only then; a retrieval-only task has
            none either way).
        embeddings: The run's embeddings (default the offline MiniLM): similarity
            methods and prefilters run for real.
        decision: Whether it has a decision model (`tag-decision`).
        max_concurrency: The run's `max_concurrency` (methods are built with it;
            as many calls are taken to be in flight at once, unable to read what
            the others put in the provider's prompt cache).
        rules_sim_k: The run's `rules_sim_k`; None: TAG's mean picks, here the
            estimated ones (the gold rules judged) when `tag` is estimated first.
        prices: The models' prices: each row's dollars at list and batch prices.
        caching: What the provider's prompt cache serves (default OpenAI's);
            None estimates no cached tokens.

    Returns:
        One row per method, skipped ones with the reason, as the run would skip
        them.
    """
    placeholder = NoCallChatModel(role="judge") if judge else None
    # The run's own context: the task's grading model is the judge model there.
    context = method_context(
        task,
        embeddings=embeddings,
        judge_model=placeholder,
        cheap_judge_model=NoCallChatModel(role="cheap judge") if cheap_judge else None,
        decision_model=NoCallDecisionModel() if decision else None,
        max_concurrency=max_concurrency,
        rules_sim_k=rules_sim_k,
    )
    run = _Run(
        context,
        ActionOnlyExecutor(llm=NoCallChatModel(role="executor"), template=task.template)
        if executor and task.template is not None
        else None,
        token_counter(),
        prices,
        caching,
    )
    estimates = []
    for method in methods:
        estimate, retrievals = run.estimate(method)
        estimates.append(estimate)
        if method.name == "tag" and estimate.status == "ok":
            # As the run does: rules+similarity's k is TAG's mean picks, here the
            # estimated ones (the gold rules judged); unknown without gold labels.
            picks = _tag_mean_picks(retrievals)
            run.context = dataclasses.replace(
                run.context,
                tag_picks=None
                if picks is None
                else (picks, len(retrievals), estimate.n),
            )
            run.tag_picks_unknown = picks is None
    return estimates


# --- The table ------------------------------------------------------------------------

_COLUMNS = 9
"""Cells of a row between the method and the notes."""


def _number(value: int, *, exact: bool = True) -> str:
    return f"{value:,}" if exact else f"≤ {value:,}"


def _cells(estimate: MethodEstimate, *, with_task: bool) -> list[str]:
    first = [estimate.task] if with_task else []
    if estimate.status == "skipped":
        return [
            *first,
            estimate.method,
            *("-" * _COLUMNS),
            f"skipped: {estimate.skip_reason}",
        ]
    return [
        *first,
        estimate.method,
        _number(estimate.calls, exact=estimate.exact_calls),
        _number(estimate.judge_calls, exact=estimate.exact_judge_calls),
        _number(estimate.executor_calls),
        _number(estimate.grader_calls, exact=not estimate.grader_calls),
        _number(estimate.input_tokens),
        _number(estimate.cached_input_tokens),
        _number(estimate.output_tokens),
        format_usd(estimate.dollars),
        format_usd(estimate.batch_dollars),
        "; ".join(estimate.notes),
    ]


def _sum_usd(values: Iterable[float | None]) -> float | None:
    priced = [value for value in values if value is not None]
    return sum(priced) if priced else None


def _caching_note(caching: PromptCaching | None) -> str:
    """How the table's cached input tokens were estimated, in a sentence or two."""
    if caching is None:
        return "No prompt caching assumed: no input token counted as cached."
    return (
        "Cached input tokens are an estimate of the provider's prompt cache: a "
        "request reads the longest prefix it shares with an earlier request to the "
        f"same model, in {caching.block_tokens}-token steps once that prefix reaches "
        f"{caching.min_tokens:,} tokens (OpenAI's automatic caching by default), "
        "except from requests still in flight (as many as the run's "
        "max_concurrency, --max-concurrency); "
        "entries are taken to last the run. TAG's prompts put the instructions and "
        "the input before the rule, so an input's judgments share most of theirs."
    )


def _prices_note(prices: TokenPrices | None) -> str:
    """The prices the table's dollars are at."""
    if prices is None:
        return (
            "No prices given, so no dollars (tag eval: --price-in, --price-out and "
            "--price-cached-input, USD per million tokens)."
        )
    cached = prices.input if prices.cached_input is None else prices.cached_input
    return (
        f"USD at ${prices.input:g} per million input tokens, ${cached:g} per million "
        f"cached input tokens and ${prices.output:g} per million output tokens, one "
        "price for every model; batch: every price less "
        f"{prices.batch_discount:.0%} (Batch API or flex processing, results within "
        "hours)."
    )


def estimate_table(
    estimates: Iterable[MethodEstimate],
    *,
    prices: TokenPrices | None = None,
    caching: PromptCaching | None = None,
) -> str:
    """The estimates as a Markdown table, with a totals line and a footnote.

    Args:
        estimates: The rows (`estimate_methods`).
        prices: The prices the rows were priced at, for the footnote.
        caching: The prompt-caching model the rows were estimated with, for the
            footnote; None when none was (or to leave it out).
    """
    rows = list(estimates)
    with_task = len({row.task for row in rows}) > 1
    heading = [
        *(["task"] if with_task else []),
        "method",
        "calls",
        "judge calls",
        "executor calls",
        "grader calls",
        "input tokens",
        "cached input",
        "output tokens",
        "USD",
        "USD batch",
        "notes",
    ]
    lines = [
        "| " + " | ".join(heading) + " |",
        "|" + "|".join("---" for _ in heading) + "|",
        *("| " + " | ".join(_cells(row, with_task=with_task)) + " |" for row in rows),
    ]
    done = [row for row in rows if row.status == "ok"]
    graded = sum(row.grader_calls for row in done)
    totals = [
        *([""] if with_task else []),
        "**total**",
        _number(
            sum(row.calls for row in done),
            exact=all(row.exact_calls for row in done),
        ),
        _number(
            sum(row.judge_calls for row in done),
            exact=all(row.exact_judge_calls for row in done),
        ),
        _number(sum(row.executor_calls for row in done)),
        _number(graded, exact=not graded),
        _number(sum(row.input_tokens for row in done)),
        _number(sum(row.cached_input_tokens for row in done)),
        _number(sum(row.output_tokens for row in done)),
        format_usd(_sum_usd(row.dollars for row in done)),
        format_usd(_sum_usd(row.batch_dollars for row in done)),
        f"{len(done)} of {len(rows)} methods estimated",
    ]
    lines.append("| " + " | ".join(totals) + " |")
    counters = sorted({row.token_counter for row in done if row.token_counter})
    lines += [
        "",
        "Estimated without calling any model. Calls are exact when every call "
        "succeeds at its first attempt (no retries, no batched answer missing a "
        "rule); ≤ marks an upper bound (the cascade's strong judge counted for "
        "every pair; a grader call for every answer, though a grader may skip one, "
        "as the VFR judge skips a copied sentence). Input tokens are the rendered "
        "prompts' ("
        + (" and ".join(counters) or "no prompts")
        + f", plus {MESSAGE_OVERHEAD} per message and {REPLY_OVERHEAD} per "
        "request); output tokens are estimated (a judge's NO, a typical answer per "
        "execution template, a short grader verdict). The executor's prompt is "
        "estimated for methods that select with a model (the gold rules judged "
        "stand for their picks). A decision request's input tokens are its input "
        "once and each question with its criteria, as OpenAIClassifier sends them, "
        "with no overhead and no output tokens; a decision model's requests are its "
        "judge calls. Oracle look-ups are not calls: the chat oracle's cost "
        "nothing, the decision oracle's count the input tokens a decision model "
        "would be sent.",
        "",
        _caching_note(caching),
        "",
        _prices_note(prices),
    ]
    return "\n".join(lines)
