"""Bulk runs: one rulebook applied to a corpus of inputs, resumable and shardable.

The input file holds one JSON object a line, `{"id": ..., "input": "..."}`; the
output file gets one line per input, `{"id", "matched", "verdicts", "answer"}`, the
same engine and executor as a single `tag run` (`MatchEngine.match`, then
`ActionOnlyExecutor` with only the matched actions). What makes it a job rather
than a loop:

- **Resumable.** Each record is appended and flushed as soon as its input is done;
  a rerun reads the output, skips the ids already written and sends nothing for
  them. A line torn by a kill is cut off and its input done again. A manifest
  beside the output (`OUT.run.json`) records what produced it (rulebook, model,
  options, shard); a rerun with different settings is refused instead of mixing
  two jobs' answers in one file.
- **Shardable.** `Shard(index, count)` keeps the ids whose hash falls in its
  share, so N machines split one corpus without coordinating; with a shared
  PostgreSQL verdict cache and log, a pair judged by one machine is never paid
  for by another. Or one run spreads over a Ray pool (`backend="ray"`,
  `langchain_tag.bulk_ray`), still writing one output here.
- **At batch prices.** `via="batch"` sends the judgments (`MatchEngine.prejudge`)
  and, unless `match_only`, the executor calls through the OpenAI Batch API;
  matching then reads the verdicts from the cache.
- **Nothing paid is lost.** Verdicts reach the judge's cache as they are made, so
  an input whose run stopped midway is judged again from the cache; the first
  input that fails for good stops the job (its record is not written) with the
  input's id and what to do.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from tenacity import Retrying

from langchain_tag._text import decode_text, digest, json_lines
from langchain_tag.engine import MatchEngine, MatchOptions, MatchResult
from langchain_tag.errors import (
    BulkInputError,
    BulkJobMismatchError,
    BulkOutputBusyError,
    BulkPendingError,
    BulkRunError,
    TextEncodingError,
)
from langchain_tag.matching.verdicts import Verdict
from langchain_tag.models import ONE_ATTEMPT, CallRetry, model_identity
from langchain_tag.usage import TokenUsage, UsageCounter

if TYPE_CHECKING:
    import ray.data

    from langchain_tag.batch import BatchProgress, BatchReport, BatchSettings
    from langchain_tag.execution import ActionOnlyExecutor
    from langchain_tag.rules import Rule

__all__ = [
    "BulkInput",
    "BulkJob",
    "BulkRecord",
    "BulkSummary",
    "Shard",
    "match_dataset",
    "read_inputs",
]

Via = Literal["online", "batch"]
Backend = Literal["local", "ray"]
Progress = Callable[[int, int], None]
"""Called with (inputs done, inputs to do) as the job goes."""


# --- inputs ---------------------------------------------------------------------------


class BulkInput(BaseModel):
    """One input of a bulk job."""

    model_config = ConfigDict(frozen=True)

    id: str | int = Field(description="Unique in the file; echoed in the output.")
    input: str

    @property
    def key(self) -> str:
        """The id as the output and the shards compare it (`1` and `"1"` differ)."""
        return json.dumps(self.id)


@dataclass(frozen=True)
class Shard:
    """The `index`-th of `count` shares of a corpus, numbered from 1.

    An input belongs to one shard by a hash of its id, so shards are the same on
    every machine and whatever the order of the file.
    """

    index: int
    count: int

    def __post_init__(self) -> None:
        """Refuse a shard that does not exist."""
        if not 1 <= self.index <= self.count:
            msg = (
                f"shard {self.index}/{self.count} does not exist: shards are numbered "
                f"1 to N, e.g. 1/{max(self.count, 1)}."
            )
            raise ValueError(msg)

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`"I/N"`, as `--shard` takes it."""
        index, _, count = text.partition("/")
        if not (index.strip().isdigit() and count.strip().isdigit()):
            msg = f"expected I/N, e.g. 2/4 for the second of four shards; got {text!r}."
            raise ValueError(msg)
        return cls(int(index), int(count))

    def __contains__(self, item: BulkInput) -> bool:
        """Whether `item` belongs to this shard."""
        hashed = int(hashlib.sha256(item.key.encode()).hexdigest()[:16], 16)
        return hashed % self.count == self.index - 1

    def __str__(self) -> str:
        """`I/N`."""
        return f"{self.index}/{self.count}"


def read_inputs(
    source: str | os.PathLike[str] | IO[bytes], *, what: str | None = None
) -> list[BulkInput]:
    """The inputs of a JSON Lines file: one `{"id": ..., "input": "..."}` a line.

    Blank lines are skipped; other keys are ignored. A path ending in `.parquet`
    is read as a Parquet table with columns `id` and `input` (needs `pyarrow`,
    which the `ray` extra brings).

    Raises:
        BulkInputError: The file cannot be read, a line is not such an object, or
            an id repeats; the message names the file, the line and what to fix.
    """
    if isinstance(source, (str, os.PathLike)):
        what = what or os.fspath(source)
        if os.fspath(source).endswith(".parquet"):
            return _unique(_parquet_inputs(Path(source), what), what, "row")
        try:
            raw = Path(source).read_bytes()
        except OSError as error:
            msg = f"{what}: cannot read the inputs ({error.strerror or error})."
            raise BulkInputError(msg) from None
    else:
        what = what or "standard input"
        raw = source.read()
    try:
        text = decode_text(raw, what=what)
    except TextEncodingError as error:
        raise BulkInputError(str(error)) from None
    lines = (
        (number, _input_of(line, f"{what}, line {number}"))
        for number, line in enumerate(json_lines(text), 1)
        if line.strip()
    )
    return _unique(lines, what, "line")


def _unique(
    numbered: Iterable[tuple[int, BulkInput]], what: str, unit: str
) -> list[BulkInput]:
    """The inputs, refused if an id repeats or there are none."""
    inputs: list[BulkInput] = []
    first_line: dict[str, int] = {}
    for number, item in numbered:
        if item.key in first_line:
            msg = (
                f"{what}, {unit} {number}: id {item.id!r} was already used on {unit} "
                f"{first_line[item.key]}; every input needs its own id (the output "
                "and a resumed run find inputs by id)."
            )
            raise BulkInputError(msg)
        first_line[item.key] = number
        inputs.append(item)
    if not inputs:
        msg = (
            f'{what}: no inputs. Write one JSON object a line: {{"id": "a-1", '
            '"input": "the text to check"}.'
        )
        raise BulkInputError(msg)
    return inputs


def _parquet_inputs(path: Path, what: str) -> Iterator[tuple[int, BulkInput]]:
    """The rows of a Parquet file with columns `id` and `input`, numbered from 1."""
    try:
        import pyarrow.parquet as pq  # noqa: PLC0415 - optional, Parquet only
    except ImportError:
        msg = (
            f"{what}: reading Parquet needs pyarrow: pip install "
            "'langchain-tag[ray]' (or pyarrow), or give the inputs as JSON Lines."
        )
        raise BulkInputError(msg) from None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as error:
        msg = f"{what}: cannot read the inputs as Parquet ({error})."
        raise BulkInputError(msg) from None
    missing = [name for name in ("id", "input") if name not in table.column_names]
    if missing:
        msg = (
            f"{what}: no {' or '.join(map(repr, missing))} column; a Parquet input "
            f"file needs columns id (string or integer) and input (string), it has "
            f"{table.column_names}."
        )
        raise BulkInputError(msg)
    ids, texts = table.column("id").to_pylist(), table.column("input").to_pylist()
    for number, (identifier, text) in enumerate(zip(ids, texts, strict=True), 1):
        yield (
            number,
            _input_from({"id": identifier, "input": text}, f"{what}, row {number}"),
        )


_EXAMPLE = '{"id": "a-1", "input": "the text to check"}'


def _input_of(line: str, where: str) -> BulkInput:
    """The input a JSON Lines line holds."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        msg = (
            f"{where}: not JSON ({error.msg} at column {error.colno}); "
            f"expected {_EXAMPLE}."
        )
        raise BulkInputError(msg) from None
    return _input_from(value, where)


def _input_from(value: Any, where: str) -> BulkInput:
    """The input an object holds (a JSON line's, or a Parquet row's), checked."""
    example = _EXAMPLE
    if not isinstance(value, dict):
        kind = type(value).__name__
        msg = f"{where}: expected a JSON object like {example}, got {kind}."
        raise BulkInputError(msg)
    missing = [key for key in ("id", "input") if key not in value]
    if missing:
        msg = f"{where}: no {' or '.join(map(repr, missing))} key; expected {example}."
        raise BulkInputError(msg)
    identifier, text = value["id"], value["input"]
    if isinstance(identifier, bool) or not isinstance(identifier, str | int):
        msg = f'{where}: "id" must be a string or an integer, got {identifier!r}.'
        raise BulkInputError(msg)
    if not isinstance(text, str):
        msg = f'{where}: "input" must be a string, got {type(text).__name__}.'
        raise BulkInputError(msg)
    return BulkInput(id=identifier, input=text)


# --- outputs --------------------------------------------------------------------------


class BulkRecord(BaseModel):
    """One line of a bulk job's output."""

    id: str | int
    matched: list[str] = Field(description="The rules applied, best first.")
    verdicts: list[dict[str, Any]] = Field(
        description="Every judged rule: rule_id, applies, and score, reason, error "
        "and cached where set; with via='batch', `from`: where the verdict came "
        "from (cache: answered before this run; batch; online)."
    )
    failed_rule_ids: list[str] = Field(default_factory=list)
    reason: str | None = Field(
        default=None, description="Why nothing matched, when nothing did."
    )
    answer: Any = Field(
        default=None, description="The executor's answer (absent with match_only)."
    )
    _executed: bool = PrivateAttr(default=False)
    """Whether this run called the executor for it (not a kept answer)."""

    @classmethod
    def of(
        cls,
        item: BulkInput,
        result: MatchResult,
        answer: Any = None,
        sources: BatchReport | None = None,
    ) -> BulkRecord:
        """The record of `item`'s result (and answer).

        `sources`: the batch lane's report of this job, which says where each
        verdict came from (they are all read back from the cache).
        """
        return cls(
            id=item.id,
            matched=[str(doc.metadata["rule_id"]) for doc in result.documents],
            verdicts=[
                _verdict(
                    v,
                    None if sources is None else sources.source(item.input, v.rule_id),
                )
                for v in result.verdicts
            ],
            failed_rule_ids=result.failed_rule_ids,
            reason=result.reason,
            answer=_jsonable(answer),
        )

    def line(self, *, match_only: bool) -> str:
        """The record as one JSON line (without `answer` when `match_only`)."""
        exclude = {"answer"} if match_only else set()
        return self.model_dump_json(exclude=exclude) + "\n"


_VERDICT_FIELDS = {"rule_id", "applies", "score", "reason", "error", "cached"}


def _verdict(verdict: Verdict, source: str | None) -> dict[str, Any]:
    """A verdict as a record writes it; `source` from the batch lane, if any."""
    written = verdict.model_dump(exclude_defaults=True, include=_VERDICT_FIELDS) | {
        "rule_id": verdict.rule_id,
        "applies": verdict.applies,
    }
    if source is not None:
        written["from"] = source
        written.pop("cached", None)
        if source == "cache":
            written["cached"] = True
    return written


def _execution_key(
    executor: ActionOnlyExecutor, text: str, rules: Sequence[Rule]
) -> str:
    """Where an online run keeps an executor's answer: its model and exact messages."""
    messages = [[m.type, m.text] for m in executor.messages(text, rules)]
    payload = json.dumps([model_identity(executor.llm), messages])
    return "tag-execution:" + hashlib.sha256(payload.encode()).hexdigest()


def _jsonable(answer: Any) -> Any:
    if isinstance(answer, BaseModel):
        return answer.model_dump(mode="json")
    return answer


class _Output:
    """The output file: ids already written, a torn tail cut, lines appended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.torn = False
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    def written(self, *, cut: bool = True) -> set[str]:
        """Keys of the ids already in the file.

        Only the last line can be torn (a kill mid-write): it is cut off (with
        `cut`) and its input done again. An unreadable line before the last is no
        tear: the file is refused rather than records already paid for dropped.

        Raises:
            BulkJobMismatchError: A line other than the last is not a record.
        """
        if not self.path.exists():
            return set()
        keys: set[str] = set()
        good = 0
        with self.path.open("rb") as file:
            for number, line in enumerate(file, 1):
                record = _record_key(line)
                if record is None:
                    if file.read(1):  # more follows: not a torn last line
                        msg = (
                            f"{self.path}, line {number}: not a record of a bulk run "
                            '(one JSON object with an "id" a line). Fix or delete '
                            "that line and run again; nothing was sent."
                        )
                        raise BulkJobMismatchError(msg)
                    break
                keys.add(record)
                good += len(line)
        if good < self.path.stat().st_size:
            self.torn = True
            if cut:
                with self.path.open("r+b") as file:
                    file.truncate(good)
        return keys

    def open(self) -> None:
        with self._lock:
            if self._file is None:
                self._file = self.path.open("a", encoding="utf-8")

    def claim(self) -> None:
        """Open the file and hold its lock: one run writes an output at a time.

        A second run on the same output (an overlapping cron job, a resume while
        the first still runs) would do the same inputs again and append their ids
        twice. The lock is advisory (`flock`), released when the file is closed
        or the process ends; where `fcntl` is missing (Windows) there is none.

        Raises:
            BulkOutputBusyError: Another run holds the lock.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.open()
        try:
            import fcntl  # noqa: PLC0415 - POSIX only
        except ImportError:
            return
        assert self._file is not None  # noqa: S101 - opened above
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            msg = (
                f"{self.path} is being written by another run (of this job, or "
                "another): wait for it to end, then run again to resume."
            )
            raise BulkOutputBusyError(msg) from None

    def append(self, line: str) -> None:
        self.open()
        with self._lock:
            assert self._file is not None  # noqa: S101 - opened above
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None


def _record_key(line: bytes) -> str | None:
    if not line.endswith(b"\n"):
        return None
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict) or "id" not in value:
        return None
    return json.dumps(value["id"])


# --- the job --------------------------------------------------------------------------


class BulkSummary(BaseModel):
    """What a bulk run did."""

    inputs: int = Field(description="Inputs in the file.")
    in_shard: int = Field(description="Inputs of this shard (all, without one).")
    already_written: int = Field(description="Skipped: written by an earlier run.")
    done: int = Field(description="Inputs written by this run.")
    judgments: int = Field(description="Rules judged, cache hits included.")
    cached: int = Field(description="Judgments answered from the verdict cache.")
    failed_judgments: int = Field(
        default=0, description="Judgments that failed, under on_error=not_applicable."
    )
    executor_calls: int = 0
    usage: TokenUsage = Field(default_factory=TokenUsage)
    via: Via = "online"
    backend: Backend = "local"
    workers: int | None = Field(
        default=None, description="The Ray actors that did the inputs (backend='ray')."
    )
    batch: dict[str, Any] | None = Field(
        default=None, description="The batch lane's report, with via='batch'."
    )
    torn_line: bool = Field(
        default=False, description="A torn last line of the output was cut off."
    )
    seconds: float = 0.0


@dataclass
class BulkJob:
    """One rulebook applied to many inputs, into a JSON Lines file.

    Args:
        engine: Matches each input (its judge's cache makes a rerun free).
        rules: The rulebook's rules.
        executor: Answers each input with its matched actions; None with
            `match_only`.
        options: `k`, `score_threshold` and `filter`, as for one retrieval.
        via: "online" (one request a call) or "batch" (the OpenAI Batch API).
        shard: Only this shard's inputs; None for all.
        concurrency: Inputs in progress at once (online); the engine's
            `max_concurrency` still bounds the judgments in flight across them.
        settings: What produced the output, checked against its manifest; by
            default the rulebook's rules, the judge's model and the options.
        executor_retry: Retries of an executor call (the one layer: give the
            executor a model whose client retries are off, `max_retries=0`).
        batch_settings: The batch lane's file limits, polling and `max_wait`.
        batch_progress: Called with each poll of each batch.
        backend: "local" (this process) or "ray" (a pool of Ray actors, each with
            an engine of its own; see `langchain_tag.bulk_ray`). The CLI calls it
            `--engine`; here `engine` is the matching engine.
        workers: With backend="ray": the actors (default: the CPUs of the
            local Ray, or of the cluster).
        ray_address: With backend="ray": the cluster to join (`ray.init(address)`);
            None starts a local Ray for the run, on loopback, and stops it after.
        recipe: With backend="ray": builds this same job in each worker. Live
            models, caches and locks do not pickle, so the job travels as this
            function (pickled, e.g. a module-level function or a
            `functools.partial` of one); each worker checks that what it built
            has this job's manifest.
    """

    engine: MatchEngine
    rules: Sequence[Rule]
    executor: ActionOnlyExecutor | None = None
    options: MatchOptions = MatchOptions()  # noqa: RUF009 - frozen, shared safely
    via: Via = "online"
    shard: Shard | None = None
    concurrency: int = 4
    settings: Mapping[str, Any] | None = None
    executor_retry: CallRetry | None = CallRetry()  # noqa: RUF009 - frozen
    batch_settings: BatchSettings | None = None
    batch_progress: Callable[[BatchProgress], None] | None = None
    backend: Backend = "local"
    workers: int | None = None
    ray_address: str | None = None
    recipe: Callable[[], BulkJob] | None = None
    _torn: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        """Refuse settings that cannot run."""
        if self.via == "batch" and self.engine.retrainer is not None:
            msg = (
                "via='batch' with retraining: a retraining between the batch and "
                "the matching would change which pairs are judged, and those would "
                "be judged online at list price. Train before the job (tag "
                "prefilter train) and run it without retrain_every."
            )
            raise ValueError(msg)
        if self.via not in ("online", "batch"):
            msg = f"via must be 'online' or 'batch', got {self.via!r}."
            raise ValueError(msg)
        if self.concurrency < 1:
            msg = f"concurrency must be at least 1, got {self.concurrency!r}."
            raise ValueError(msg)
        self._check_backend()

    def _check_backend(self) -> None:
        if self.backend not in ("local", "ray"):
            msg = f"backend must be 'local' or 'ray', got {self.backend!r}."
            raise ValueError(msg)
        if self.backend == "local":
            given = [
                name
                for name, value in (
                    ("workers", self.workers),
                    ("ray_address", self.ray_address),
                    ("recipe", self.recipe),
                )
                if value is not None
            ]
            if given:
                msg = f"{', '.join(given)}: options of backend='ray'."
                raise ValueError(msg)
            return
        if self.via == "batch":
            msg = (
                "backend='ray' with via='batch': the Batch API already runs the "
                "judgments on the provider's side; run via='batch' in one process."
            )
            raise ValueError(msg)
        if self.engine.retrainer is not None:
            msg = (
                "backend='ray' with retraining: each worker uses the prefilter it was "
                "given, and a retraining in one worker would reach no other. Retrain "
                "between runs, on the driver (tag prefilter train), and run without "
                "retrain_every."
            )
            raise ValueError(msg)
        if self.recipe is None:
            msg = (
                "backend='ray' needs recipe=: a function that builds this job in each "
                "worker (models, caches and locks do not pickle)."
            )
            raise ValueError(msg)
        if self.workers is not None and self.workers < 1:
            msg = f"workers must be at least 1, got {self.workers!r}."
            raise ValueError(msg)

    @property
    def match_only(self) -> bool:
        """Whether the answers are left out (no executor)."""
        return self.executor is None

    def manifest(self) -> dict[str, Any]:
        """What the output's manifest records: the job's identity."""
        rules = json.dumps([r.model_dump(mode="json") for r in self.rules])
        return {
            "rulebook": digest(rules),
            "judge": self.engine.judge.identity,
            "executor": (
                None if self.executor is None else model_identity(self.executor.llm)
            ),
            "template": None if self.executor is None else self.executor.template.name,
            "options": {
                "k": self.options.k,
                "score_threshold": self.options.score_threshold,
                "filter": None
                if self.options.filter is None
                else repr(self.options.filter),
            },
            "shard": None if self.shard is None else str(self.shard),
            **dict(self.settings or {}),
        }

    def pending(
        self,
        inputs: Sequence[BulkInput],
        out: str | os.PathLike[str],
        *,
        cut: bool = True,
    ) -> tuple[list[BulkInput], int, bool]:
        """What is left: this shard's inputs not in `out` yet.

        Checks the manifest, and cuts a torn last line off `out` (with `cut`; an
        estimate looks without changing anything).

        Returns:
            The inputs to do, how many of the shard's were written already, and
            whether the last line was torn.

        Raises:
            BulkJobMismatchError: `out` is the inputs file, belongs to another job
                or is no bulk run's output.
        """
        path = Path(out)
        self._check_manifest(path)
        output = _Output(path)
        written = output.written(cut=cut)
        self._torn = self._torn or (output.torn and cut)
        mine = [i for i in inputs if self.shard is None or i in self.shard]
        todo = [i for i in mine if i.key not in written]
        return todo, len(mine) - len(todo), output.torn

    def run(
        self,
        inputs: Sequence[BulkInput],
        out: str | os.PathLike[str],
        *,
        config: RunnableConfig | None = None,
        progress: Progress | None = None,
    ) -> BulkSummary:
        """Do every pending input of `inputs`, appending its record to `out`.

        Raises:
            BulkJobMismatchError: `out` was written by a job with other settings.
            BulkRunError: An input failed for good (the records before it are kept).
        """
        started = time.perf_counter()
        path = Path(out)
        output = _Output(path)
        output.claim()  # before looking at what is written: no other run writes
        try:
            todo, already, torn = self.pending(inputs, path)
        except BaseException:
            output.close()
            raise
        torn = torn or self._torn  # cut by an earlier look at `pending`
        self._write_manifest(path)
        counter = UsageCounter()
        config = counter.watch(config)
        summary = BulkSummary(
            inputs=len(inputs),
            in_shard=len(todo) + already,
            already_written=already,
            done=0,
            judgments=0,
            cached=0,
            via=self.via,
            backend=self.backend,
            torn_line=torn,
        )
        try:
            if self.backend == "ray":
                from langchain_tag.bulk_ray import run_on_ray  # noqa: PLC0415 - ray

                run_on_ray(self, todo, output, summary, config, progress)
            elif self.via == "batch" and todo:
                self._run_batch(todo, output, summary, config, progress)
            else:
                self._run_online(todo, output, summary, config, progress)
        finally:
            output.close()
            summary.usage = counter.usage
            summary.seconds = time.perf_counter() - started
        return summary

    def close(self) -> None:
        """Close the judge's verdict cache and log (flushing what waits)."""
        judge = self.engine.judge
        for resource in (
            getattr(judge, "cache", None),
            getattr(judge, "verdict_log", None),
        ):
            close = getattr(resource, "close", None)
            if callable(close):
                close()

    # -- online -----------------------------------------------------------------------

    def _one(self, item: BulkInput, config: RunnableConfig) -> BulkRecord:
        result = self.engine.match(item.input, self.rules, self.options, config)
        if self.executor is None:
            return BulkRecord.of(item, result)
        chosen = self._chosen(result)
        store = getattr(self.engine.judge, "cache", None)
        key = _execution_key(self.executor, item.input, chosen)
        if store is not None and (kept := store.mget([key])[0]) is not None:
            return BulkRecord.of(item, result, json.loads(kept))
        request = {"input": item.input, "rules": chosen}
        retrying = (self.executor_retry or ONE_ATTEMPT).retrying(Retrying)
        answer = retrying(self.executor.invoke, request, config)
        if store is not None:
            # Kept as soon as it is paid for: a run killed before this input's
            # line is written does not pay for it again when resumed.
            store.mset([(key, json.dumps(_jsonable(answer)))])
        record = BulkRecord.of(item, result, answer)
        record._executed = True  # noqa: SLF001 - this run's own record
        return record

    def _chosen(self, result: MatchResult) -> list[Rule]:
        by_id = {rule.rule_id: rule for rule in self.rules}
        return [by_id[str(doc.metadata["rule_id"])] for doc in result.documents]

    def _run_online(
        self,
        todo: Sequence[BulkInput],
        output: _Output,
        summary: BulkSummary,
        config: RunnableConfig,
        progress: Progress | None,
    ) -> None:
        if progress is not None:
            progress(0, len(todo))
        for item, outcome in self._records(todo, config):
            if isinstance(outcome, Exception):
                raise BulkRunError(item.id, outcome, summary.done)
            self._count(outcome, summary)
            output.append(outcome.line(match_only=self.match_only))
            if progress is not None:
                progress(summary.done, len(todo))

    def _records(
        self, todo: Sequence[BulkInput], config: RunnableConfig
    ) -> Iterator[tuple[BulkInput, BulkRecord | Exception]]:
        """Each input's record as it is done, `concurrency` at a time.

        The first failure is yielded (as the exception) last: the inputs not
        started are cancelled, those in progress are finished and yielded first,
        so what was paid for is written. A Ray worker runs its batches through
        this same loop.
        """
        failure: tuple[BulkInput, Exception] | None = None
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="tag-bulk"
        )
        try:
            futures = {pool.submit(self._one, item, config): item for item in todo}
            for future in concurrent.futures.as_completed(futures):
                item = futures[future]
                try:
                    record = future.result()
                except concurrent.futures.CancelledError:
                    continue
                except Exception as error:  # noqa: BLE001 - reported with its input
                    if failure is None:
                        failure = (item, error)
                        for waiting in futures:
                            waiting.cancel()
                    continue
                yield item, record
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if failure is not None:
            yield failure

    def _count(self, record: BulkRecord, summary: BulkSummary) -> None:
        summary.done += 1
        summary.judgments += len(record.verdicts)
        summary.cached += sum(bool(v.get("cached")) for v in record.verdicts)
        summary.failed_judgments += len(record.failed_rule_ids)
        summary.executor_calls += int(record._executed)  # noqa: SLF001

    # -- batch ------------------------------------------------------------------------

    def _run_batch(
        self,
        todo: Sequence[BulkInput],
        output: _Output,
        summary: BulkSummary,
        config: RunnableConfig,
        progress: Progress | None,
    ) -> None:
        from langchain_tag.batch import execute_in_batch  # noqa: PLC0415 - openai

        report = self.engine.prejudge(
            [item.input for item in todo],
            self.rules,
            self.options,
            via="batch",
            config=config,
            settings=self.batch_settings,
            progress=self.batch_progress,
        )
        summary.batch = {"judgments": report.model_dump(mode="json")}
        if not report.complete:
            raise BulkPendingError(report.running_batch_ids, report.pending)
        # Every verdict is cached now: matching makes no judgment call.
        results: list[tuple[BulkInput, MatchResult]] = []
        for item in todo:
            try:
                result = self.engine.match(item.input, self.rules, self.options, config)
            except Exception as error:
                raise BulkRunError(item.id, error, summary.done) from error
            results.append((item, result))
        answers: list[Any] = [None] * len(results)
        if self.executor is not None:
            store = getattr(self.engine.judge, "cache", None)
            if store is None:
                msg = "via='batch' needs the judge's cache: it keeps the batches."
                raise ValueError(msg)
            execution = execute_in_batch(
                self.executor,
                [(item.input, self._chosen(result)) for item, result in results],
                store=store,
                retry=self.executor_retry,
                settings=self.batch_settings,
                progress=self.batch_progress,
                config=config,
            )
            summary.batch["executions"] = execution.report.model_dump(mode="json")
            if not execution.report.complete:
                raise BulkPendingError(
                    execution.report.running_batch_ids, execution.report.pending
                )
            answers = execution.outputs
        for (item, result), answer in zip(results, answers, strict=True):
            record = BulkRecord.of(item, result, answer, sources=report)
            record._executed = self.executor is not None  # noqa: SLF001 - in batches
            self._count(record, summary)
            output.append(record.line(match_only=self.match_only))
            if progress is not None:
                progress(summary.done, len(todo))

    # -- the manifest -----------------------------------------------------------------

    def _manifest_path(self, out: Path) -> Path:
        return out.with_name(out.name + ".run.json")

    def _check_manifest(self, out: Path) -> None:
        path = self._manifest_path(out)
        if not out.exists() or out.stat().st_size == 0:
            return  # nothing written yet: this job's settings will be recorded
        if not path.exists():
            msg = (
                f"{out} holds data but no {path.name}: it is not the output of a bulk "
                "run (is it the inputs file?). Name a new file with -o; nothing was "
                "sent."
            )
            raise BulkJobMismatchError(msg)
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            stored = {}
        ours = json.loads(json.dumps(self.manifest()))
        differ = sorted(
            key for key in {*stored, *ours} if stored.get(key) != ours.get(key)
        )
        if differ:
            changes = "; ".join(
                f"{key}: {stored.get(key)!r} then, {ours.get(key)!r} now"
                for key in differ
            )
            msg = (
                f"{out} was written by a job with other settings ({changes}). Its "
                "records would mix two jobs' answers: write to another file, or "
                f"delete {out} and {path} to start again."
            )
            raise BulkJobMismatchError(msg)

    def _write_manifest(self, out: Path) -> None:
        path = self._manifest_path(out)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.manifest(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)


def match_dataset(
    dataset: ray.data.Dataset,
    job: BulkJob,
    *,
    workers: int | None = None,
    config: RunnableConfig | None = None,
) -> ray.data.Dataset:
    """A `ray.data.Dataset` of inputs (`id`, `input`) mapped to one of records.

    `job` has backend="ray" and a recipe; Ray must be initialised. See
    `langchain_tag.bulk_ray.match_dataset` (this loads Ray only when called).
    """
    from langchain_tag.bulk_ray import match_dataset as on_ray  # noqa: PLC0415 - ray

    return on_ray(dataset, job, workers=workers, config=config)


def iter_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of a bulk output file (for reading results back)."""
    with Path(path).open(encoding="utf-8") as file:
        for line in file:
            if line.strip():
                yield json.loads(line)
