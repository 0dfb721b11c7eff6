"""Running methods over a task: every method as a retriever, scored with its cost.

`aevaluate` runs the standard methods of a task (or those selected) on its inputs
and returns one `EvalResult` per method: the task's quality metrics (`METRICS`) and
the cost columns (LLM calls, input tokens with the cached ones among them, output
tokens, wall time, units given to the executor; the oracle's answers are counted as
look-ups, not as model calls).
Methods that need a judge (or decision) model run only when one is given; otherwise
they come
back as skipped rows with the reason, so an offline run covers the methods without
an LLM and the oracle. `run_nba`, `run_obliqa` and `run_humaneval` do the same on a
task's development data.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal, TypedDict

from langchain_core.decisions import BaseDecisionModel
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from typing_extensions import Self, Unpack

from langchain_tag.embeddings import EmbeddingsSpec
from langchain_tag.errors import JudgmentError, advice
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.matching.verdicts import failure_kind, failure_reason
from langchain_tag.rules import Rulebook
from langchain_tag_experiments.evaluation.embedding_cache import shared_embeddings
from langchain_tag_experiments.evaluation.methods import (
    Family,
    Method,
    MethodContext,
    methods_for,
    select_methods,
)
from langchain_tag_experiments.evaluation.metrics import mean
from langchain_tag_experiments.evaluation.tasks import (
    METRICS,
    EvalItem,
    EvalTask,
    FailedInputs,
    ItemOutcome,
    TaskName,
    UnitKind,
    load_task,
)
from langchain_tag_experiments.evaluation.usage import CallCounter

__all__ = [
    "EvalResult",
    "RunOptions",
    "aevaluate",
    "method_context",
    "run_humaneval",
    "run_nba",
    "run_obliqa",
]

logger = logging.getLogger(__name__)

_Step = Literal["retrieval", "execution", "grading"]

_METRIC_KEYS = [metric.key for task in METRICS.values() for metric in task]


class EvalResult(BaseModel):
    """One method on one task: quality metrics and cost columns.

    Serialised flat, as the report files hold it: one key per metric of every
    task, in `METRICS` order after `n`, None where not measured; read back from
    that form too.
    """

    task: TaskName
    method: str
    family: Family
    units: UnitKind
    status: Literal["ok", "skipped"] = "ok"
    skip_reason: str | None = None
    n: int = Field(default=0, description="Inputs evaluated.")
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="The task's `METRICS` that were measured, by key; a metric the "
        "task does not define, or that was not measured (no executor model), is "
        "absent, and `notes` says why.",
    )
    llm_calls: int = Field(
        default=0,
        description="Judge and executor calls that reached a model; the oracle's "
        "look-ups are not calls (`oracle_lookups`).",
    )
    oracle_lookups: int = Field(
        default=0,
        description="Judgments the oracle answered from the gold labels (the "
        "decision oracle's: requests): look-ups, not LLM calls (nothing paid), "
        "though a judge model in the oracle's place would make as many calls.",
    )
    executor_calls: int = 0
    grader_calls: int = Field(
        default=0,
        description="LLM grading calls (NPOV's VFR judge): the evaluation's cost, "
        "not the method's, so not in `llm_calls`.",
    )
    input_tokens: int | None = Field(
        default=None,
        description="Judge and executor input tokens, as the models reported them "
        "(the decision oracle's: counted, what its requests would send); None if "
        "unknown (a model reported no usage).",
    )
    cached_input_tokens: int | None = Field(
        default=None,
        description="Of `input_tokens`, those the providers read from their prompt "
        "cache (billed at the cached-input price).",
    )
    output_tokens: int | None = None
    wall_seconds: float = Field(
        default=0.0, description="Retrieval and execution of all inputs (not grading)."
    )
    setup_seconds: float = Field(
        default=0.0, description="Building the method (indexing, embedding)."
    )
    mean_units: float | None = Field(
        default=None, description="Units given to the executor per input."
    )
    mean_context_chars: float | None = Field(
        default=None, description="Characters of those units per input."
    )
    malformed: int = Field(
        default=0,
        description="Executor answers that could not be parsed: scored as wrong.",
    )
    failures: int = Field(
        default=0,
        description="Inputs whose retrieval, execution or grading raised (a "
        "judgment failed after its retries, say): flagged and left out of the "
        "quality means, never scored as wrong answers.",
    )
    first_error: str | None = Field(
        default=None, description="The first failure's error, when any failed."
    )
    notes: list[str] = Field(
        default_factory=list, description="What was not measured, and why."
    )

    @model_validator(mode="before")
    @classmethod
    def _gather_metrics(cls, data: Any) -> Any:
        """Take flat metric keys (a report row) into `metrics`, dropping Nones."""
        if not isinstance(data, dict):
            return data
        fields = {k: v for k, v in data.items() if k not in _METRIC_KEYS}
        found = {
            **dict(data.get("metrics") or {}),
            **{k: data[k] for k in _METRIC_KEYS if k in data},
        }
        return fields | {"metrics": {k: v for k, v in found.items() if v is not None}}

    @model_validator(mode="after")
    def _known_metrics(self) -> Self:
        known = {metric.key for metric in METRICS[self.task]}
        if unknown := sorted(set(self.metrics) - known):
            msg = f"{', '.join(unknown)}: not metrics of the {self.task} task"
            raise ValueError(msg)
        return self

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        flat: dict[str, Any] = {}
        for key, value in handler(self).items():
            if key == "metrics":
                flat |= {k: value.get(k) for k in _METRIC_KEYS}
            else:
                flat[key] = value
        return flat

    @classmethod
    def columns(cls) -> list[str]:
        """The keys of a serialised result, in order (the CSV columns)."""
        return [
            column
            for field in cls.model_fields
            for column in (_METRIC_KEYS if field == "metrics" else [field])
        ]

    @property
    def calls_per_input(self) -> float | None:
        """LLM calls per evaluated input (not the oracle's look-ups)."""
        return self.llm_calls / self.n if self.n else None

    @property
    def calls_per_input_with_lookups(self) -> float | None:
        """Calls per input, a look-up counted as the judge call it stands for.

        What the method would cost with a judge model in the oracle's place; the
        same as `calls_per_input` for a method without the oracle.
        """
        return (self.llm_calls + self.oracle_lookups) / self.n if self.n else None


class RunOptions(TypedDict, total=False):
    """Options of `aevaluate` and the `run_*` functions."""

    methods: Sequence[str] | None
    """Method names or globs to run (default: every standard method)."""
    limit: int | None
    """Evaluate only the first `limit` inputs."""
    judge_model: BaseChatModel | None
    """Judges for TAG, the reranker and the LLM filters; None skips them."""
    cheap_judge_model: BaseChatModel | None
    """The cascade's cheap first judge (a model with logprobs); None skips it."""
    decision_model: BaseDecisionModel | None
    """Judges `tag-decision` (every candidate rule of an input in one request);
    None skips it."""
    executor_model: BaseChatModel | None
    """Executes the task (strict accuracy, pass@1); None measures retrieval only."""
    embeddings: EmbeddingsSpec
    """For similarity methods: an `Embeddings`, a local sentence-transformers
    directory, or `module:attribute`; default the offline MiniLM."""
    max_concurrency: int
    """Inputs in progress at once, and LLM calls in flight per method."""
    rules_sim_k: int | None
    """rules+similarity's k; None (default) is TAG's mean picks on the run."""
    failed_inputs: FailedInputs
    """`excluded` (default, the method): a failed input is flagged, counted and
    left out of the quality means; `wrong`: scored as a wrong answer."""
    on_result: Callable[[EvalResult], None] | None
    """Called with each method's result as soon as it is known (progress)."""


async def aevaluate(task: EvalTask, **options: Unpack[RunOptions]) -> list[EvalResult]:
    """Run the task's standard methods (or those selected) and score them.

    Methods run one after another, so their wall times do not disturb each other;
    the inputs of a method run concurrently, at most `max_concurrency` at once.
    """
    context = method_context(task, **options)
    methods = methods_for(task)
    if options.get("methods"):
        methods = select_methods(methods, options["methods"] or ())
    executor_model = options.get("executor_model")
    executor = (
        None
        if executor_model is None or task.template is None
        else ActionOnlyExecutor(llm=executor_model, template=task.template)
    )
    on_result = options.get("on_result")
    results = []
    for method in methods:
        reason = context.unavailable(method)
        result = (
            _result(context.task, method, status="skipped", skip_reason=reason)
            if reason is not None
            else await _evaluate_method(context, method, executor)
        )
        results.append(result)
        if method.name == "tag" and result.status == "ok":
            context = replace(
                context,
                tag_picks=(result.mean_units, result.n - result.failures, result.n),
            )
        if on_result is not None:
            on_result(result)
    return results


def method_context(task: EvalTask, **options: Unpack[RunOptions]) -> MethodContext:
    """What the methods of a run are built from.

    The task (limited, its grading model the judge model), the embeddings, the
    models and the settings of `options`.
    """
    limited = copy.copy(task.limited(options.get("limit")))
    if limited.grading_model is None:
        limited.grading_model = options.get("judge_model")
    limited.failed_inputs = options.get("failed_inputs", task.failed_inputs)
    return MethodContext(
        task=limited,
        embeddings=shared_embeddings(options.get("embeddings")),
        judge_model=options.get("judge_model"),
        cheap_judge_model=options.get("cheap_judge_model"),
        decision_model=options.get("decision_model"),
        max_concurrency=options.get("max_concurrency", 8),
        rules_sim_k=options.get("rules_sim_k"),
    )


def _result(task: EvalTask, method: Method, **fields: Any) -> EvalResult:
    """The row of `method` on `task`."""
    return EvalResult(
        task=task.name,
        method=method.name,
        family=method.family,
        units=method.units,
        **fields,
    )


async def _evaluate_method(
    context: MethodContext, method: Method, executor: ActionOnlyExecutor | None
) -> EvalResult:
    task = context.task
    started = time.perf_counter()
    try:
        # Building may embed a whole corpus: keep the event loop free meanwhile.
        retriever = await asyncio.to_thread(method.build, context)
    except Exception as error:  # noqa: BLE001 - one bad configuration skips one row
        logger.warning("%s: %s could not be built: %s", task.name, method.name, error)
        reason = f"could not be built: {error}"
        return _result(task, method, status="skipped", skip_reason=reason)
    setup_seconds = time.perf_counter() - started
    retrieval, execution, grading = CallCounter(), CallCounter(), CallCounter()
    slots = asyncio.Semaphore(context.max_concurrency)
    advice: dict[str, None] = {}  # what would help against the failures, once each

    async def run(item: EvalItem) -> ItemOutcome:
        async with slots:
            return await _run_item(
                task, method, retriever, executor, item, (retrieval, execution), advice
            )

    async def grade(outcome: ItemOutcome) -> None:
        async with slots:
            await _grade(task, method, outcome, grading, advice)

    started = time.perf_counter()
    outcomes = await asyncio.gather(*(run(item) for item in task.items))
    wall_seconds = time.perf_counter() - started
    # Graded after the clock stops: running checks and pylint is not the method's.
    await asyncio.gather(*(grade(o) for o in outcomes if o.answer is not None))
    quality, notes = task.quality(
        outcomes, units=method.units, executed=executor is not None
    )
    errors = [o.error for o in outcomes if o.error]
    if errors:
        treated = (
            "are scored as wrong answers"
            if task.failed_inputs == "wrong"
            else "are left out of the quality means"
        )
        notes.append(
            f"{len(errors)} of {len(outcomes)} inputs failed (see failures) and "
            + treated
        )
        notes += advice
    unreadable = [o.malformed for o in outcomes if o.malformed is not None]
    if unreadable:
        notes.append(
            f"{len(unreadable)} executor answers malformed, scored as wrong (the "
            f"first: {unreadable[0][:200]})"
        )
    curated = task.rulebook.diagnostics.get("curated") if task.rulebook else None
    if "rulebook" in method.needs and curated:
        notes.append(
            f"rulebook: curated, written by hand from {curated['document']} "
            "(not extracted)"
        )
    # Over the inputs that did not fail, so TAG's picks are counted over as many
    # inputs as `tag_picks` says.
    succeeded = [o for o in outcomes if o.error is None]
    usage = retrieval.usage + execution.usage
    return _result(
        task,
        method,
        n=len(outcomes),
        metrics=quality,
        llm_calls=retrieval.model_calls + execution.model_calls,
        oracle_lookups=retrieval.oracle_calls + execution.oracle_calls,
        executor_calls=execution.model_calls,
        grader_calls=grading.calls,
        input_tokens=usage.input_tokens,
        cached_input_tokens=usage.cached_input_tokens,
        output_tokens=usage.output_tokens,
        wall_seconds=wall_seconds,
        setup_seconds=setup_seconds,
        mean_units=mean(len(o.units) for o in succeeded),
        mean_context_chars=mean(
            sum(len(d.page_content) for d in o.units) for o in succeeded
        ),
        malformed=len(unreadable),
        failures=len(errors),
        first_error=errors[0] if errors else None,
        notes=[
            *method.notes,
            *([method.explain(context)] if method.explain else []),
            *notes,
        ],
    )


async def _run_item(
    task: EvalTask,
    method: Method,
    retriever: BaseRetriever,
    executor: ActionOnlyExecutor | None,
    item: EvalItem,
    counters: tuple[CallCounter, CallCounter],
    advice: dict[str, None],
) -> ItemOutcome:
    """Retrieve and execute one input; a failing step ends it, recorded.

    `counters` count the retrieval's calls and the execution's.
    """
    retrieval, execution = counters
    outcome = ItemOutcome(item)
    step: _Step = "retrieval"
    try:
        outcome.units = await retriever.ainvoke(
            item.text, {"callbacks": [retrieval], "run_name": method.name}
        )
        if executor is not None:
            step = "execution"
            outcome.answer = await executor.ainvoke(
                {"input": item.task_input or item.text, "rules": outcome.units},
                {"callbacks": [execution]},
            )
    except Exception as error:  # noqa: BLE001 - a failed input is counted, not fatal
        if step == "execution" and isinstance(error, OutputParserException):
            # The executor's own output, unreadable: a wrong answer, not a failure.
            outcome.malformed = f"{type(error).__name__}: {error}"
        else:
            _failed(task, method, outcome, step, error)
            advice.update(dict.fromkeys(_advice(error)))
    return outcome


async def _grade(
    task: EvalTask,
    method: Method,
    outcome: ItemOutcome,
    grading: CallCounter,
    advice: dict[str, None],
) -> None:
    try:
        outcome.grade = await task.grade(
            outcome.item, outcome.answer, {"callbacks": [grading]}
        )
    except Exception as error:  # noqa: BLE001 - a failed input is counted, not fatal
        _failed(task, method, outcome, "grading", error)
        advice.update(dict.fromkeys(_advice(error)))


def _failed(
    task: EvalTask, method: Method, outcome: ItemOutcome, step: _Step, error: Exception
) -> None:
    # A JudgmentError's own message advises in the Python judge's options
    # (on_error=...), which an evaluation does not have: its cause is recorded,
    # `_advice` says the rest.
    cause = error.cause if isinstance(error, JudgmentError) else str(error)
    outcome.error = f"{step}: {type(error).__name__}: {cause}"
    logger.warning(
        "%s %s %s: %s", task.name, method.name, outcome.item.id, outcome.error
    )


def _advice(error: Exception) -> list[str]:
    """What an evaluation's user can do about `error`, in its options.

    Nothing for a permanent error: the failures line shows it as it is.
    """
    kind = failure_kind(error)
    if kind == "permanent":
        return []
    return [
        advice(
            kind,
            stronger_model="a stronger judge model (--judge-model, or judge_model=)",
            retry_hint="run again later, or with fewer calls in flight "
            "(--max-concurrency, or max_concurrency=)",
            reason=failure_reason(error),
        )
    ]


def run_nba(
    data_dir: str | os.PathLike[str] | None = None, **options: Unpack[RunOptions]
) -> list[EvalResult]:
    """Evaluate the standard methods on RuleArena-NBA (dev problems)."""
    return asyncio.run(aevaluate(load_task("nba", data_dir), **options))


def run_obliqa(
    data_dir: str | os.PathLike[str] | None = None, **options: Unpack[RunOptions]
) -> list[EvalResult]:
    """Evaluate the standard methods on the ObliQA sample (dev questions)."""
    return asyncio.run(aevaluate(load_task("obliqa", data_dir), **options))


def run_humaneval(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    rulebook: Rulebook | str | os.PathLike[str] | None = None,
    timeout: float = 10.0,
    **options: Unpack[RunOptions],
) -> list[EvalResult]:
    """Evaluate the standard methods on HumanEval + PEP 8.

    Args:
        data_dir: The shared data directory (default `../shared/data`).
        rulebook: A PEP 8 rulebook (object or file) for the rule methods; default
            the curated one shipped.
        timeout: Seconds each problem's `check` may run.
        **options: See `RunOptions`.
    """
    task = load_task("humaneval", data_dir, rulebook=rulebook, timeout=timeout)
    return asyncio.run(aevaluate(task, **options))
