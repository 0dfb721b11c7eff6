"""Judging and executing through a provider's batch API: the public functions.

`judge_in_batch` fills the judge's verdict cache (and its verdict log) from batch
answers; `execute_in_batch` returns the executor's outputs and stores its answers.
Both send only what is not answered yet, resume the batches an earlier run left
(recorded beside the store: `_records`), and do online, through the judge or the
executor, what a batch did not answer.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

from langchain_core.callbacks import CallbackManager
from langchain_core.documents import Document
from langchain_core.load import dumpd
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_core.stores import BaseStore
from pydantic import BaseModel, Field, PrivateAttr
from tenacity import Retrying

from langchain_tag.batch._jobs import (
    BatchFile,
    BatchJobs,
    BatchProgress,
    BatchSettings,
    Collected,
)
from langchain_tag.batch._providers import (
    ModelCall,
    executor_call,
    judge_call,
    provider_for,
    provider_of_client,
)
from langchain_tag.batch._records import JobRecords, Lane, job_records
from langchain_tag.batch._requests import request_hash
from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.errors import BatchFailedError, BatchLaneError
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.execution.executor import ExecutionInput
from langchain_tag.matching import ApplicabilityJudge, BaseJudge, Verdict
from langchain_tag.models import CallRetry
from langchain_tag.rules import Rule
from langchain_tag.usage import TokenUsage

if TYPE_CHECKING:
    import anthropic
    import openai

    BatchClient = openai.OpenAI | anthropic.Anthropic

__all__ = [
    "BatchExecution",
    "BatchFailedError",
    "BatchReport",
    "cancel_batches",
    "execute_in_batch",
    "judge_in_batch",
]

logger = logging.getLogger(__name__)

_READ_SLICE = 5_000
"""Answers read into verdicts (or outputs) at a time."""

_T = TypeVar("_T")


Source = Literal["cache", "batch", "online"]
"""Where a verdict of a prejudged job came from."""


class BatchReport(BaseModel):
    """What a batch call did. `complete` is False while batches are still running."""

    requests: int = Field(description="Distinct requests asked for.")
    cached: int = Field(
        default=0,
        description="Answered before this call (a cached verdict, a stored "
        "answer): never sent.",
    )
    sent: int = Field(default=0, description="Requests in the batches created.")
    from_batch: int = Field(
        default=0,
        description="Answers read from batch output (of this call's batches or an "
        "earlier run's).",
    )
    online: int = Field(
        default=0,
        description="Done online after their batch line failed, expired, was "
        "cancelled or gave an unreadable answer.",
    )
    failed: int = Field(
        default=0,
        description="Of `online`, those that failed online too (a failed verdict "
        "under on_error='not_applicable', an exception returned).",
    )
    pending: int = Field(
        default=0, description="Requests in batches still running at `max_wait`."
    )
    batch_ids: list[str] = Field(default_factory=list, description="Created.")
    resumed_batch_ids: list[str] = Field(
        default_factory=list, description="An earlier run's batches, collected."
    )
    running_batch_ids: list[str] = Field(
        default_factory=list, description="Still running; a later call collects them."
    )
    failed_batch_ids: list[str] = Field(
        default_factory=list, description="Refused at validation."
    )
    files: list[BatchFile] = Field(default_factory=list)
    usage: TokenUsage = Field(
        default_factory=TokenUsage,
        description="Of the answers read from batches (billed at the batch price).",
    )
    line_failures: dict[str, int] = Field(
        default_factory=dict,
        description="Why lines came back without a usable answer, counted "
        "(`batch_expired`, `batch_cancelled`, `HTTP 500`, `unreadable`, ...).",
    )

    _sources: dict[tuple[str, str], Source] = PrivateAttr(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every request is answered (none left in a running batch)."""
        return self.pending == 0

    def source(self, text: str, rule_id: str) -> Source | None:
        """Where the judgment's verdict came from in this call; None if not known.

        "cache" (answered before it), "batch" (read from a batch's output), or
        "online" (judged now, after its batch line failed, or on the online lane).
        """
        return self._sources.get((text, rule_id))

    def note(self, text: str, rule_id: str, source: Source) -> None:
        """Record where a judgment's verdict came from."""
        self._sources[text, rule_id] = source


class BatchExecution(NamedTuple):
    """`execute_in_batch`'s outputs, in the items' order, and its report."""

    outputs: list[Any]
    report: BatchReport


# --- judging ------------------------------------------------------------------------


def judge_in_batch(
    judge: BaseJudge,
    pairs: Iterable[tuple[str, Rule]],
    *,
    client: BatchClient | None = None,
    store: BaseStore[str, str] | None = None,
    settings: BatchSettings | None = None,
    progress: Callable[[BatchProgress], None] | None = None,
    config: RunnableConfig | None = None,
    explored: Mapping[tuple[str, str], float] | None = None,
) -> BatchReport:
    """Judge (input, rule) pairs through a batch API, into the judge's cache.

    Each pair not in the judge's cache becomes one request, the very call the judge
    makes online (same messages, prompt, structured output, temperature, logprobs;
    never the action) with the pair's cache key as its `custom_id`. Answers are
    read by the judge and go where its own do: the verdict cache and the verdict
    log; a later `judge.invoke` or `MatchEngine` run finds them cached. Pairs whose
    line failed, expired, was cancelled or gave no readable verdict are judged
    online by the judge (its retries, its `on_error`), never assumed NO.

    Batches are recorded beside `store` as soon as they are made: a call that is
    killed, or returns at `max_wait`, is resumed by calling again with the same
    pairs, which polls those batches instead of paying for them again.

    Args:
        judge: An `ApplicabilityJudge` on a `ChatOpenAI` (OpenAI's Batch API) or a
            `ChatAnthropic` (Anthropic's Message Batches), one rule per call, with
            a cache (give it a `SQLiteVerdictCache` to resume across processes).
        pairs: (input, rule) pairs; repeats are judged once.
        client: The `openai.OpenAI` (or `anthropic.Anthropic`) client for the
            batches; default one of the judge's
            model's own (`root_client`: its key, base URL and retries).
        store: Where batches and answers are recorded; default the judge's cache.
            Beside a `SQLiteVerdictCache` or `PostgresVerdictCache`, in tables of
            their own in its database (`batch_jobs`, `batch_job_answers`); beside
            an `InMemoryVerdictCache`, in this process's memory; in any other
            store, under its keys `tag-batch:job:...` and `tag-batch:answer:...`.
        settings: File limits, polling, `max_wait`.
        progress: Called with each poll of each batch.
        config: Callbacks, tags and metadata: each answer read from a batch is
            reported to the callbacks as a chat model run (usage included), and
            the online judgments run with them.
        explored: `(input, rule id)` -> the rate at which a learned prefilter's
            shadow judging drew the pair (`MatchPlan.explored`); the verdict log
            marks those verdicts with it, as online judging does.

    Raises:
        BatchLaneError: The judge cannot be sent through the Batch API (see above).
        BatchFailedError: A batch failed validation; the others' answers are kept.
        JudgmentError: An online judgment failed under `on_error="raise"`.
    """
    if not isinstance(judge, ApplicabilityJudge):
        msg = (
            "The batch lane judges with an ApplicabilityJudge (one call per pair); "
            f"a {type(judge).__name__} decides otherwise. Judge online."
        )
        raise BatchLaneError(msg)
    call = judge_call(judge)
    cache = _checked_cache(judge.cache)
    wanted: dict[str, tuple[str, Rule]] = {}
    for text, rule in pairs:
        wanted.setdefault(judge.cache_key(text, rule), (text, rule))
    keys = list(wanted)
    pending = [k for k, v in zip(keys, cache.mget(keys), strict=True) if v is None]
    _check_room(cache, len(pending))
    kept = _kept(store or cache)
    jobs = BatchJobs(
        provider_for(call.llm, "judge", client),
        kept,
        "judge",
        settings or BatchSettings(),
        progress,
    )
    report = BatchReport(requests=len(keys), cached=len(keys) - len(pending))
    for key in set(keys) - set(pending):
        report.note(wanted[key][0], wanted[key][1].rule_id, "cache")
    config = ensure_config(config)

    def render(custom_ids: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        return ((k, call.body(judge.messages(*wanted[k]))) for k in custom_ids)

    run = _run(jobs, pending, render, report)
    readable: set[str] = set()
    explored = explored or {}
    # In slices, so that a large job's answers are never all in memory at once.
    answered = [k for k in pending if k in run.answered]
    for start in range(0, len(answered), _READ_SLICE):
        keys = answered[start : start + _READ_SLICE]
        bodies = jobs.answers(keys)
        outputs = {k: _read(call.output, body) for k, body in bodies.items()}
        read = [k for k, output in outputs.items() if output is not None]
        verdicts = judge.remember_answers(
            [(*wanted[k], outputs[k]) for k in read], explored
        )
        done = [k for k, v in zip(read, verdicts, strict=True) if v is not None]
        jobs.forget(done)
        readable.update(done)
        runs = ((judge.messages(*wanted[k]), outputs[k]) for k in read)
        _trace(config, call, runs)
        messages = (
            _answer(output) or _read(call.message, bodies[k])
            for k, output in outputs.items()
        )
        report.usage += _usage(m for m in messages if m is not None)
    report.from_batch = len(readable)
    for key in readable:
        report.note(wanted[key][0], wanted[key][1].rule_id, "batch")
    retry = run.unanswered(readable, report)
    by_text: defaultdict[str, list[Rule]] = defaultdict(list)
    for custom_id in retry:
        text, rule = wanted[custom_id]
        by_text[text].append(rule)
        report.note(text, rule.rule_id, "online")
    online: list[Verdict] = []
    for text, rules in by_text.items():
        rates = {
            rule.rule_id: explored[text, rule.rule_id]
            for rule in rules
            if (text, rule.rule_id) in explored
        }
        online += judge.judge_rules(text, rules, config, explored=rates)
    report.online = len(online)
    report.failed = sum(v.failed for v in online)
    jobs.forget(run.answered - readable)
    return report


def _checked_cache(cache: BaseStore[str, str] | None) -> BaseStore[str, str]:
    if cache is None:
        msg = (
            "judge_in_batch puts its verdicts in the judge's cache, and this judge "
            "has none (cache=None). Give it one: SQLiteVerdictCache(path) keeps "
            "them, and lets a killed run resume its batches."
        )
        raise BatchLaneError(msg)
    return cache


def _check_room(cache: BaseStore[str, str], pending: int) -> None:
    """Refuse a bounded in-memory cache that would evict verdicts paid for."""
    if isinstance(cache, InMemoryVerdictCache) and cache.maxsize < pending:
        msg = (
            f"The in-memory cache holds {cache.maxsize:,} entries, fewer than the "
            f"{pending:,} verdicts to judge: verdicts paid for would be evicted "
            "before they are read. Use SQLiteVerdictCache(path), or a larger maxsize."
        )
        raise BatchLaneError(msg)


def _kept(store: BaseStore[str, str]) -> JobRecords:
    """The job records beside `store`; a warning if they die with the process."""
    if isinstance(store, InMemoryVerdictCache):
        logger.warning(
            "Batches are recorded in memory (beside an in-memory cache): a run "
            "that is killed cannot resume them. Use SQLiteVerdictCache(path) to "
            "keep them."
        )
    return job_records(store)


# --- executing -----------------------------------------------------------------------


def execute_in_batch(
    executor: ActionOnlyExecutor,
    items: Sequence[tuple[str, Sequence[Document | Rule]]],
    *,
    store: BaseStore[str, str],
    client: BatchClient | None = None,
    settings: BatchSettings | None = None,
    progress: Callable[[BatchProgress], None] | None = None,
    config: RunnableConfig | None = None,
    return_exceptions: bool = False,
    retry: CallRetry | None = CallRetry(),  # noqa: B008 - frozen, shared safely
) -> BatchExecution:
    """Run the executor on (input, matched rules) items through the Batch API.

    Each item is the executor's own call (`executor.messages`: the actions only),
    its answer stored beside `store` under the hash of its request body, so a
    repeated or resumed call pays for nothing twice. Outputs are parsed by the
    executor's template; an item whose line failed or whose answer does not read
    or parse is executed online (`executor.invoke`, retried by `retry`).

    Args:
        executor: An `ActionOnlyExecutor` on a `ChatOpenAI` or a `ChatAnthropic`.
        items: (input, matched rules) per execution.
        store: Where answers and batches are kept, as `judge_in_batch` keeps
            them (`SQLiteVerdictCache(path)`, say: its file's batch tables).
        client: The provider's SDK client; default the executor's model's own.
        settings: File limits, polling, `max_wait`.
        progress: Called with each poll of each batch.
        config: Callbacks, tags and metadata (see `judge_in_batch`).
        return_exceptions: Put an online execution's exception in `outputs` in
            place of raising it (as `Runnable.batch` does).
        retry: The one retry layer of the online executions (give the executor a
            model with `max_retries=0`); None: one attempt each.

    Returns:
        The outputs in the items' order (None for an item still in a running
        batch) and the report.

    Raises:
        BatchLaneError: The executor's model is neither a `ChatOpenAI` nor a
            `ChatAnthropic`.
        BatchFailedError: A batch failed validation; the others' answers are kept.
    """
    call = executor_call(executor)
    # Bodies are rendered again where needed, never all kept: a large job's
    # prompts, bodies and answers are in memory a slice at a time.
    ids = [
        request_hash(call.body(executor.messages(text, rules))) for text, rules in items
    ]
    first: dict[str, int] = {}  # request -> its first item, in the items' order
    for i, custom_id in enumerate(ids):
        first.setdefault(custom_id, i)

    def prompt(custom_id: str) -> list[BaseMessage]:
        return executor.messages(*items[first[custom_id]])

    jobs = BatchJobs(
        provider_for(call.llm, "executor", client),
        _kept(store),
        "execute",
        settings or BatchSettings(),
        progress,
    )
    stored = jobs.answered(first)
    pending = [k for k in first if k not in stored]
    report = BatchReport(requests=len(first), cached=len(stored))
    config = ensure_config(config)
    run = _run(jobs, pending, lambda k: ((i, call.body(prompt(i))) for i in k), report)
    parsed: dict[str, Any] = {}
    read = [k for k in first if k in stored or k in run.answered]
    for begin in range(0, len(read), _READ_SLICE):
        bodies = jobs.answers(read[begin : begin + _READ_SLICE])
        answers = {k: _read(call.message, body) for k, body in bodies.items()}
        fresh = [
            (k, answer)
            for k, answer in answers.items()
            if answer is not None and k in run.answered
        ]
        _trace(config, call, ((prompt(k), answer) for k, answer in fresh))
        report.usage += _usage(answer for _, answer in fresh)
        for custom_id, answer in answers.items():
            if answer is not None:
                output = _parsed(executor, answer, config)
                if output is not _UNPARSED:
                    parsed[custom_id] = output
    report.from_batch = len(run.answered & parsed.keys())
    retry_online = run.unanswered(set(parsed), report)
    if stale := stored - parsed.keys():  # stored by an earlier call
        retry_online |= stale
        unreadable = report.line_failures.get("unreadable", 0) + len(stale)
        report.line_failures["unreadable"] = unreadable
    outputs: list[Any] = []
    online: dict[str, Any] = {}
    for custom_id, (text, rules) in zip(ids, items, strict=True):
        if custom_id in retry_online and custom_id not in online:
            online[custom_id] = _execute_online(
                executor,
                text,
                rules,
                config,
                retry=retry,
                return_exceptions=return_exceptions,
            )
        outputs.append(online.get(custom_id, parsed.get(custom_id)))
    report.online = len(online)
    report.failed = sum(isinstance(o, Exception) for o in online.values())
    jobs.forget((stored | run.answered) - parsed.keys())
    return BatchExecution(outputs, report)


def _read(
    reader: Callable[[Mapping[str, Any]], _T], body: Mapping[str, Any]
) -> _T | None:
    """What `reader` makes of a stored answer; None if it is malformed (done online).

    Such an answer is then forgotten, so it never blocks a later call.
    """
    try:
        return reader(body)
    except Exception:  # noqa: BLE001 - a malformed answer is done again online
        logger.warning("A stored batch answer is malformed: %.200r", body)
        return None


_UNPARSED = object()


def _parsed(
    executor: ActionOnlyExecutor, answer: AIMessage, config: RunnableConfig
) -> Any:
    """The executor's output parsed from `answer`, or `_UNPARSED`."""
    try:
        return executor.template.output_parser.invoke(answer, config)
    except Exception:  # noqa: BLE001 - executed again online
        logger.debug("A batch answer does not parse: %r", answer.text[:200])
        return _UNPARSED


def _execute_online(
    executor: ActionOnlyExecutor,
    text: str,
    rules: Sequence[Document | Rule],
    config: RunnableConfig,
    *,
    retry: CallRetry | None,
    return_exceptions: bool,
) -> Any:
    arguments = ExecutionInput(input=text, rules=rules)
    try:
        if retry is None:
            return executor.invoke(arguments, config)
        return retry.retrying(Retrying)(executor.invoke, arguments, config)
    except Exception as error:
        if return_exceptions:
            return error
        raise


# --- what both lanes share ----------------------------------------------------------


@dataclass
class _Run:
    """What sending and collecting came to for one call's pending requests."""

    pending: Sequence[str]
    collected: Collected
    answered: set[str]
    """Pending requests whose answers are now stored."""
    running: set[str]
    """Pending requests still in a running batch."""

    def unanswered(self, used: set[str], report: BatchReport) -> set[str]:
        """The pending requests to do online: neither `used` nor still running.

        Counts why in `report.line_failures`; raises first if a batch was refused
        (its requests are not done online: the whole batch failed, not a line).

        Raises:
            BatchFailedError: A batch failed validation.
        """
        if self.collected.failed_batches:
            raise BatchFailedError(_refusals(self.collected), report)
        missing = {k for k in self.pending if k not in used and k not in self.running}
        reasons = Counter(
            self.collected.failures.get(
                k, "unreadable" if k in self.answered else "no answer"
            )
            for k in missing
        )
        report.line_failures = dict(reasons)
        return missing


def _run(
    jobs: BatchJobs,
    pending: Sequence[str],
    render: Callable[[Sequence[str]], Iterable[tuple[str, dict[str, Any]]]],
    report: BatchReport,
) -> _Run:
    """Send what no batch answers or runs yet, then collect the batches holding it."""
    wanted = set(pending)
    earlier = jobs.holding(wanted)
    running = {custom_id for record in earlier for custom_id in record.custom_ids}
    stored = jobs.answered(pending)
    to_send = [k for k in pending if k not in stored and k not in running]
    report.files = jobs.submit(render(to_send)) if to_send else []
    report.sent = len(to_send)
    report.batch_ids = [f.batch_id for f in report.files if f.batch_id]
    collected = jobs.collect(wanted)
    report.resumed_batch_ids = [
        batch_id for batch_id in collected.collected if batch_id not in report.batch_ids
    ]
    report.running_batch_ids = [
        r.batch_id or r.input_file_id for r in collected.running
    ]
    report.failed_batch_ids = [b.id for b in collected.failed_batches]
    still = {k for record in collected.running for k in record.custom_ids}
    still &= wanted
    report.pending = len(still)
    answered = jobs.answered(k for k in pending if k not in still)
    return _Run(pending, collected, answered, still)


def _refusals(collected: Collected) -> list[str]:
    """The provider's reasons for the batches it refused, one line per error."""
    return [line for batch in collected.failed_batches for line in batch.refusals]


def _answer(output: Any) -> AIMessage | None:
    """The answer message in a call's output (structured, or the message)."""
    answer = output.get("raw") if isinstance(output, Mapping) else output
    return answer if isinstance(answer, AIMessage) else None


def _usage(answers: Iterable[AIMessage]) -> TokenUsage:
    reports = [answer.usage_metadata for answer in answers]
    return TokenUsage.from_metadata(reports, calls=len(reports))


def _trace(
    config: RunnableConfig,
    call: ModelCall,
    runs: Iterable[tuple[list[BaseMessage], Any]],
) -> None:
    """Report each answer read to the callbacks as the chat model run it was."""
    manager = CallbackManager.configure(
        config.get("callbacks"),
        inheritable_tags=config.get("tags"),
        inheritable_metadata=config.get("metadata"),
    )
    if not manager.handlers:
        return
    serialized = dumpd(call.llm)
    for messages, output in runs:
        answer = _answer(output)
        if answer is None:
            continue
        (run,) = manager.on_chat_model_start(
            serialized,
            [messages],
            invocation_params={"batch": True, **call.invocation_params},
            name=type(call.llm).__name__,
        )
        run.on_llm_end(
            LLMResult(
                generations=[[ChatGeneration(message=answer)]],
                llm_output={"model_name": call.model},
            )
        )


# --- cancelling ---------------------------------------------------------------------


def cancel_batches(
    store: BaseStore[str, str],
    *,
    client: BatchClient,
    lanes: Sequence[Lane] = ("judge", "execute"),
) -> list[str]:
    """Cancel the batches recorded beside `store` still running at `client`'s API.

    Their records stay: the next `judge_in_batch` / `execute_in_batch` call
    collects what they answered before the cancellation and does the rest online.

    Returns:
        The ids of the batches asked to cancel.
    """
    kept = job_records(store)
    provider = provider_of_client(client)
    return [
        batch_id
        for lane in lanes
        for batch_id in BatchJobs(provider, kept, lane, BatchSettings()).cancel()
    ]
