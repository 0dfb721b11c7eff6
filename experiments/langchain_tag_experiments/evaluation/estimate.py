"""What a `tag eval` run would spend, worked out without calling any model.

`tag eval ... --estimate` prints, per method, the LLM calls (judge, executor and
grader), the input tokens (and how many of them a provider's prompt cache would
serve), the output tokens, and the dollars at given prices, list and batch, before
a single call is paid for. The figures come from the run's own code: every method
is built as the run builds it (`Method.build`) and run over the task's inputs as
the run runs it (retrieval, then the executor), its models replaced by stand-ins
(`langchain_tag.metering`) that call nothing and report the usage a provider
would bill for the messages the code really sends: the judge's and the cascade's
cheap judge's (`MeteringChatModel`), the decision model's (`MeteringDecisionModel`:
the input once and each question with its criteria, as `OpenAIClassifier` sends
them, no output tokens), the executor's. The evaluation's counters
(`CallCounter`) count them as they count a run's, the oracle's look-ups apart.
Each grader call sends `EvalTask.grading_prompts` to the judge model's stand-in.

The stand-in judge answers YES for an input's gold rules and NO for the others,
so the executor sees what a judge agreeing with the gold labels would pick; where
the labels cannot tell (a task without them, judgments of chunks, LangChain's
LLMChainFilter) it answers YES: every candidate stands for the picks, an upper
bound. It reports no logprobs, so the cascade escalates every pair to its strong
judge: an upper bound too.

Exact, when every call succeeds at its first attempt and answers in the format
asked: the calls of every method except the cascade, and the input tokens of the
prompts sent (to the tokenizer's accuracy: cl100k_base, or about 4 characters a
token without tiktoken). Estimated: output tokens (a judge's verdict, a typical
answer per execution template, a short grader verdict), and the executor's prompt
for methods that select with a model (see above). The oracle is no model: its
answers are look-ups, as the harness counts them; the chat oracle's cost no
tokens, the decision oracle's count (and price) the input tokens a decision model
would be sent.

Cached input tokens are an estimate under a model of the provider's prompt cache
(`PromptCaching`, OpenAI's automatic caching by default): each request reads the
longest prefix it shares with an earlier request to the same model, in 128-token
steps once it reaches 1,024 tokens, except from the requests still in flight (as
many as the run's `max_concurrency`), and entries last the method's run
(`SimulatedPromptCache`). Decision requests are counted with none cached. Dollars
are priced by `TokenPrices.cost`: cached input tokens at the cached-input price,
and at batch prices (every price less the batch discount).

Not counted: retries after errors, rules a batched answer left out (judged
again alone), questions a decision model refuses (the rest asked again),
structured-output schemas a provider adds to the prompt, and calls that
embedding models make.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from pydantic import BaseModel, Field, model_validator

from langchain_tag._delimiters import escape_delimiters
from langchain_tag.estimate import DECISION_MODEL, DECISION_NOTE
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.metering import (
    EXECUTOR_ANSWERS,
    JUDGE_NO_REASON,
    Answer,
    Decide,
    MeteringChatModel,
    MeteringDecisionModel,
    executor_answers,
    judge_answers,
    run_to_end,
)
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
from langchain_tag_experiments.evaluation.methods import Method, MethodContext
from langchain_tag_experiments.evaluation.runner import method_context
from langchain_tag_experiments.evaluation.tasks import EvalTask, TaskName
from langchain_tag_experiments.evaluation.usage import CallCounter

__all__ = [
    "APPROXIMATE_CHARS_PER_TOKEN",
    "DEFAULT_CACHING",
    "EXECUTOR_ANSWERS",
    "GRADER_ANSWER",
    "JUDGE_NO_REASON",
    "MESSAGE_OVERHEAD",
    "OFFLINE_ENCODING",
    "REPLY_OVERHEAD",
    "MethodEstimate",
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


Picks = Literal["exact", "gold", "all"]
"""How the executor's units are known: retrieved with no model choosing (or the
oracle), a judge agreeing with the gold labels, or every candidate (an upper
bound: the labels cannot tell)."""


@dataclass
class _Measured:
    """One method run on stand-ins: its counters and what the notes need."""

    retrieval: CallCounter
    execution: CallCounter
    grading: CallCounter
    n: int
    failed: list[str]
    repeats: int
    picks: Picks
    mean_units: float | None


@dataclass
class _Run:
    """What every method's estimate shares: the task, the models the run has."""

    context: MethodContext
    executor: bool
    decision: bool
    cheap_judge: bool
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

    def decide(self) -> tuple[Decide, Picks]:
        """The stand-in judges' policy: YES for an input's gold rules, as judged.

        Rules the labels do not name (chunks judged as rules), inputs they do not
        hold, and a task without labels get YES: an upper bound.
        """
        gold = self.task.gold_rules()
        if gold is None:
            return (lambda _text, _rule: True), "all"
        by_text: dict[str, AbstractSet[str]] = {}
        for item in self.task.items:
            ids = gold.get(item.id, frozenset())
            by_text[item.text] = by_text[escape_delimiters(item.text)] = ids
        named = (
            {r.rule_id for r in self.task.rulebook.rules}
            if self.task.rulebook
            else set()
        )

        def applies(text: str, rule_id: str) -> bool:
            ids = by_text.get(text)
            return ids is None or rule_id not in named or rule_id in ids

        return applies, "gold"

    def models(self) -> MethodContext:
        """The context with fresh stand-ins: each method's prompt caches start empty."""
        decide, _ = self.decide()

        def chat(answer: Answer) -> MeteringChatModel:
            return MeteringChatModel(
                answer=answer,
                counter=self.counter,
                caching=self.caching,
                in_flight=self.context.max_concurrency,
            )

        judge = chat(judge_answers(decide)) if self.context.judge_model else None
        return dataclasses.replace(
            self.context,
            judge_model=judge,
            cheap_judge_model=chat(judge_answers(decide)) if self.cheap_judge else None,
            decision_model=MeteringDecisionModel(
                model=DECISION_MODEL, decide=decide, counter=self.counter
            )
            if self.decision
            else None,
        )

    async def measure(
        self, method: Method, retriever: BaseRetriever, context: MethodContext
    ) -> _Measured:
        """Run `method` over the task's inputs as the run does, on the stand-ins."""
        task = self.task
        judge = context.judge_model
        executor = (
            ActionOnlyExecutor(
                llm=MeteringChatModel(
                    answer=executor_answers(task.template),
                    counter=self.counter,
                    caching=self.caching,
                    in_flight=context.max_concurrency,
                ),
                template=task.template,
            )
            if self.executor and task.template is not None
            else None
        )
        # The run's grading model is its judge model: its prompt cache too.
        grader = (
            judge.answering(lambda _messages: GRADER_ANSWER)
            if isinstance(judge, MeteringChatModel)
            else None
        )
        retrieval, execution, grading = CallCounter(), CallCounter(), CallCounter()
        failed: list[str] = []
        units: list[int] = []
        seen: set[str] = set()
        repeats = 0
        # One input at a time: a repeated input finds its verdicts cached.
        for item in task.items:
            repeats += item.text in seen
            seen.add(item.text)
            try:
                found = await retriever.ainvoke(
                    item.text, {"callbacks": [retrieval], "run_name": method.name}
                )
            except Exception as error:  # noqa: BLE001 - the run records it so
                failed.append(f"{item.id}: {type(error).__name__}: {error}")
                continue
            units.append(len(found))
            if executor is None:
                continue
            await executor.ainvoke(
                {"input": item.task_input or item.text, "rules": found},
                {"callbacks": [execution]},
            )
            if grader is not None:
                for prompt in task.grading_prompts(item):
                    await grader.ainvoke(prompt, {"callbacks": [grading]})
        _, labelled = self.decide()
        picks: Picks = labelled
        if retrieval.model_calls == 0 or method.family == "oracle":
            picks = "exact"
        elif method.units == "chunks":  # no labels for chunks: every one kept
            picks = "all"
        return _Measured(
            retrieval,
            execution,
            grading,
            len(task.items),
            failed,
            repeats,
            picks,
            sum(units) / len(units) if units else None,
        )

    def estimate(self, method: Method) -> tuple[MethodEstimate, _Measured | None]:
        context = self.models()
        reason = context.unavailable(method)
        if reason is not None:
            return self.row(method, status="skipped", skip_reason=reason), None
        try:
            retriever = method.build(context)
        except Exception as error:  # noqa: BLE001 - the run skips it the same way
            reason = f"could not be built: {error}"
            return self.row(method, status="skipped", skip_reason=reason), None
        measured = run_to_end(self.measure(method, retriever, context))
        return self._tally(method, measured), measured

    def _tally(self, method: Method, measured: _Measured) -> MethodEstimate:
        retrieval, execution = measured.retrieval, measured.execution
        usage = retrieval.usage + execution.usage + measured.grading.usage
        bounded = retrieval.model_calls if method.family == "cascade" else 0
        exact_judge = not (bounded or measured.failed or measured.repeats)
        notes = self._notes(method, measured, bounded)
        row = self.row(
            method,
            n=measured.n,
            judge_calls=retrieval.model_calls,
            oracle_lookups=retrieval.oracle_calls,
            executor_calls=execution.model_calls,
            grader_calls=measured.grading.calls,
            input_tokens=usage.input_tokens or 0,
            cached_input_tokens=usage.cached_input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            exact_judge_calls=exact_judge,
            # Graders may skip an answer (NPOV's pass-through guard): a bound.
            exact_calls=exact_judge and not measured.grading.calls,
            notes=notes,
        )
        if self.prices is not None:
            row.dollars = self.prices.cost(row.usage)
            row.batch_dollars = self.prices.cost(row.usage, batch=True)
        return row

    def _notes(self, method: Method, measured: _Measured, bounded: int) -> list[str]:
        notes = []
        if method.explain is not None:
            notes.append(method.explain(self.context))
            if self.tag_picks_unknown:
                notes.append(
                    "TAG's picks are unknown before judging (no gold labels): k is "
                    "taken as if TAG had not run"
                )
        if bounded:
            notes.append(
                f"upper bound: {bounded:,} calls, the cascade's strong judge counted "
                "for every pair; it escalates only what its cheap judge does not "
                "reject confidently"
            )
        notes += _judging_notes(measured.retrieval)
        if measured.repeats:
            notes.append(
                f"{measured.repeats:,} inputs repeat an earlier one: their judgments "
                "counted as cached (inputs judged concurrently may pay them again)"
            )
        if measured.failed:
            notes.append(
                f"{len(measured.failed)} inputs' retrieval would fail (counted "
                f"without calls), e.g. {measured.failed[0]}"
            )
        if self.executor and measured.execution.calls:
            if measured.picks == "gold":
                notes.append(
                    "executor prompts estimated: the gold rules among those judged "
                    "stand for the judge's picks"
                )
            elif measured.picks == "all":
                notes.append(
                    "executor prompts an upper bound: every candidate stands for "
                    "the model's picks"
                )
        return notes


def _judging_notes(retrieval: CallCounter) -> list[str]:
    """What the oracle's look-ups and a decision model's requests count."""
    notes = []
    decided = DECISION_MODEL in retrieval.usage_metadata
    oracle_decisions = retrieval.oracle_calls and retrieval.reported
    if retrieval.oracle_calls and oracle_decisions and not retrieval.model_calls:
        notes.append(
            f"{retrieval.oracle_calls:,} oracle look-ups: decision requests answered "
            "from the gold labels, not LLM calls; their input tokens are what a "
            "decision model would be sent, priced as such"
        )
    elif retrieval.oracle_calls:
        notes.append(
            f"{retrieval.oracle_calls:,} oracle look-ups: answered from the gold "
            "labels, not LLM calls: no tokens, $0"
        )
    if decided or oracle_decisions:
        notes.append(DECISION_NOTE)
    return notes


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
    counter = token_counter()
    # The run's own context: the task's grading model is the judge model there.
    context = method_context(
        task,
        embeddings=embeddings,
        judge_model=MeteringChatModel(
            answer=judge_answers(lambda _text, _rule: False), counter=counter
        )
        if judge
        else None,
        max_concurrency=max_concurrency,
        rules_sim_k=rules_sim_k,
    )
    run = _Run(
        context,
        executor=executor,
        decision=decision,
        cheap_judge=cheap_judge,
        counter=counter,
        prices=prices,
        caching=caching,
    )
    estimates = []
    for method in methods:
        estimate, measured = run.estimate(method)
        estimates.append(estimate)
        if method.name == "tag" and measured is not None:
            # As the run does: rules+similarity's k is TAG's mean picks, here the
            # estimated ones (the gold rules judged); unknown without gold labels.
            known = measured.picks != "all" and measured.mean_units is not None
            run.context = dataclasses.replace(
                run.context,
                tag_picks=(
                    measured.mean_units,
                    measured.n - len(measured.failed),
                    estimate.n,
                )
                if known
                else None,
            )
            run.tag_picks_unknown = not known
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
