"""Bulk runs on Ray: one job's inputs spread over a pool of actors.

`BulkJob(..., backend="ray")` (`tag run --inputs IN -o OUT --engine ray`) turns
the pending inputs into a `ray.data.Dataset` and maps it over an actor pool
(`map_batches`): each actor builds the job once from its `recipe` (one engine:
one judge, its concurrency bound, its prefilter) and runs its batches through
`BulkJob._records`, the loop a one-process run uses. The driver alone writes the
output, as a one-process run does (flock-guarded, one line per input, the same
records), so an interrupted run resumes the same way whichever ran it.

What a failure costs:

- A worker that dies (killed, out of memory, its node lost) is restarted and its
  batch done again (Ray Data's actor restarts and task retries). The
  verdicts it had paid for are in the verdict cache (an SQLite file shared by
  the local workers, or PostgreSQL across machines) and are read back, not paid
  again; only the judgments in flight when it died can be paid twice.
- A judgment that fails for good follows `on_error` as in one process: with
  "raise", the input's failure travels back to the driver, which stops the job
  with the input's id (the records done before it are kept).
- The learned prefilter is the one each worker was given; retraining stays on
  the driver, between runs (`tag prefilter train`).

Ray is imported here only, when a Ray run starts: `pip install 'langchain-tag[ray]'`.
Without an address, a local Ray is started for the run (node address 127.0.0.1,
no dashboard) and stopped after; a Ray already initialised in the process (a
notebook's, a test's) is joined and left running.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from langchain_core.runnables import RunnableConfig

from langchain_tag.bulk import BulkInput, BulkJob, BulkRecord
from langchain_tag.errors import BulkRunError, RayMissingError
from langchain_tag.usage import TokenUsage, UsageCounter

if TYPE_CHECKING:
    import ray.data

    from langchain_tag.bulk import BulkSummary, Progress, _Output

__all__ = ["match_dataset", "require_ray", "run_on_ray"]

INSTALL_HINT = "pip install 'langchain-tag[ray]'"

_ENVIRONMENT_PREFIXES = ("OPENAI_", "TAG_", "ANTHROPIC_", "AZURE_OPENAI_")
"""Environment variables that configure the models: they travel to the workers
(a cluster's nodes do not share the driver's environment)."""

_CONFIG_KEYS = ("run_name", "tags", "metadata")
"""What of the caller's config travels (callbacks hold live objects: they stay)."""


def require_ray() -> Any:
    """The `ray` module, with Ray Data, or a one-line error naming the install."""
    try:
        import ray  # noqa: PLC0415 - an optional dependency, loaded on use
        import ray.data  # noqa: PLC0415
    except ImportError:
        msg = f"--engine ray (backend='ray') needs Ray: {INSTALL_HINT}."
        raise RayMissingError(msg) from None
    return ray


@dataclass(frozen=True)
class _Spec:
    """What every worker of a run gets, pickled by value with its class."""

    recipe: Callable[[], BulkJob]
    manifest: dict[str, Any]
    config: dict[str, Any]
    environment: dict[str, str]
    keyed: bool


class _Worker:
    """One actor of the pool: one job built from the recipe, batches run through it.

    A run subclasses it with its `spec` (`_map`): the spec travels with the class,
    by value, and the actor takes no arguments.
    """

    spec: ClassVar[_Spec]

    def __init__(self) -> None:
        # The worker process is this actor's alone: its environment configures
        # the models as the driver's does (a cluster's nodes do not share it).
        os.environ.update(self.spec.environment)
        self.job = self.spec.recipe()
        self.config = self.spec.config
        self.keyed = self.spec.keyed
        ours = json.loads(json.dumps(self.job.manifest()))
        manifest = self.spec.manifest
        if ours != manifest:
            differ = ", ".join(
                sorted(k for k in {*ours, *manifest} if ours.get(k) != manifest.get(k))
            )
            msg = (
                f"the job a Ray worker built differs from the driver's ({differ}): "
                "the recipe must build the same job everywhere (same rulebook, model "
                "and options; the models' environment variables are forwarded)."
            )
            raise ValueError(msg)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        items = [
            BulkInput(id=json.loads(key) if self.keyed else _plain(key), input=text)
            for key, text in zip(batch["id"], batch["input"], strict=True)
        ]
        counter = UsageCounter()
        config = counter.watch(RunnableConfig(**self.config))  # type: ignore[typeddict-item]
        rows: dict[str, list[Any]] = {
            "id": [],
            "record": [],
            "executed": [],
            "error": [],
            "usage": [],
        }
        for item, outcome in self.job._records(items, config):  # noqa: SLF001 - the one loop
            rows["id"].append(item.key if self.keyed else item.id)
            if isinstance(outcome, Exception):
                rows["record"].append("")
                rows["executed"].append(False)
                rows["error"].append(_pickled(outcome))
            else:
                rows["record"].append(outcome.line(match_only=self.job.match_only))
                rows["executed"].append(outcome._executed)  # noqa: SLF001
                rows["error"].append(b"")
            rows["usage"].append("")
        if rows["usage"]:
            # The batch's tokens, once: summed by the driver.
            rows["usage"][0] = counter.usage.model_dump_json()
        return rows


def _plain(value: Any) -> str | int:
    """A dataset's id (numpy scalars from Parquet) as a BulkInput takes it."""
    plain = value.item() if hasattr(value, "item") else value
    return plain if isinstance(plain, str) else int(plain)


def _pickled(error: Exception) -> bytes:
    """A failure as it travels to the driver (its type kept when it pickles)."""
    try:
        pickled = pickle.dumps(error)
        pickle.loads(pickled)  # noqa: S301 - its own bytes: does it come back?
    except Exception:  # noqa: BLE001 - an exception holding live objects
        return pickle.dumps(RuntimeError(f"{type(error).__name__}: {error}"))
    return pickled


def _environment() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith(_ENVIRONMENT_PREFIXES)
    }


def _map(
    dataset: ray.data.Dataset,
    job: BulkJob,
    workers: int,
    config: RunnableConfig | None,
    *,
    keyed: bool,
) -> ray.data.Dataset:
    ray = require_ray()
    assert job.recipe is not None  # noqa: S101 - checked by BulkJob
    cpus = float(ray.cluster_resources().get("CPU", 1.0))
    spec = _Spec(
        recipe=job.recipe,
        manifest=json.loads(json.dumps(job.manifest())),
        config={k: v for k, v in (config or {}).items() if k in _CONFIG_KEYS},
        environment=_environment(),
        keyed=keyed,
    )
    return dataset.map_batches(
        type("TagBulkWorker", (_Worker,), {"spec": spec}),
        # Small batches: progress comes in steps of this, and a dead worker's
        # batch is all that is done again.
        batch_size=job.concurrency,
        compute=ray.data.ActorPoolStrategy(size=workers),
        # Judging waits on the network: a worker needs little CPU, and the pool
        # must fit beside Ray Data's own tasks.
        num_cpus=min(1.0, cpus / (workers + 1)),
    )


def match_dataset(
    dataset: ray.data.Dataset,
    job: BulkJob,
    *,
    workers: int | None = None,
    config: RunnableConfig | None = None,
) -> ray.data.Dataset:
    """Each row of `dataset` (columns `id`, `input`) matched and answered by `job`.

    The rows of the result have `id`, `record` (the output line a bulk run writes,
    JSON, "" when the input failed), `executed`, `error` (the pickled exception of
    a failed input, b"" otherwise) and `usage` (a batch's `TokenUsage` as JSON on
    one of its rows). Lazy: nothing runs until the dataset is consumed; Ray must be
    initialised. Resuming and writing are the caller's (`BulkJob.run` does both).

    Args:
        dataset: The inputs.
        job: A `BulkJob` with backend="ray" and a `recipe`.
        workers: The actors (default `job.workers`, else the cluster's CPUs).
        config: `run_name`, `tags` and `metadata` travel to the workers.
    """
    ray = require_ray()
    if job.backend != "ray" or job.recipe is None:
        msg = "match_dataset needs a BulkJob with backend='ray' and a recipe."
        raise ValueError(msg)
    count = workers or job.workers or int(ray.cluster_resources().get("CPU", 1))
    return _map(dataset, job, count, config, keyed=False)


def run_on_ray(
    job: BulkJob,
    todo: Sequence[BulkInput],
    output: _Output,
    summary: BulkSummary,
    config: RunnableConfig,
    progress: Progress | None,
) -> None:
    """Do `todo` on Ray, appending the records to `output` (`BulkJob.run`'s part)."""
    ray = require_ray()
    if progress is not None:
        progress(0, len(todo))
    if not todo:
        summary.workers = 0
        return
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the run reports its own progress
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    started = _start(ray, job)
    try:
        workers = job.workers or int(ray.cluster_resources().get("CPU", 1))
        workers = min(workers, len(todo))
        summary.workers = workers
        # Keys, not ids: a column holds one type, and `1` and `"1"` differ.
        dataset = ray.data.from_items(
            [{"id": item.key, "input": item.input} for item in todo]
        )
        by_key = {item.key: item for item in todo}
        for key, line, executed, error, usage in _rows(
            _map(dataset, job, workers, config, keyed=True)
        ):
            if usage:
                summary.usage = summary.usage + TokenUsage.model_validate_json(usage)
            if error:
                raise BulkRunError(by_key[key].id, pickle.loads(error), summary.done)  # noqa: S301 - our workers'
            record = BulkRecord.model_validate_json(line)
            record._executed = executed  # noqa: SLF001 - the worker's own record
            job._count(record, summary)  # noqa: SLF001 - one way of counting
            output.append(line)
            if progress is not None:
                progress(summary.done, len(todo))
    finally:
        if started:
            ray.shutdown()


def _rows(dataset: ray.data.Dataset) -> Iterator[tuple[str, str, bool, bytes, str]]:
    for row in dataset.iter_rows():
        yield (
            str(row["id"]),
            str(row["record"]),
            bool(row["executed"]),
            bytes(row["error"]),
            str(row["usage"]),
        )


def _start(ray: Any, job: BulkJob) -> bool:
    """Join the job's cluster, or start a local Ray; whether this run started it."""
    if ray.is_initialized():
        return False  # the caller's Ray (a test's, a notebook's): theirs to stop
    if job.ray_address is not None:
        ray.init(
            address=job.ray_address,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
        return True
    ray.init(
        num_cpus=job.workers or os.cpu_count() or 1,
        include_dashboard=False,
        # The node's address is loopback; Ray's gRPC servers still listen on every
        # interface (no switch for that), behind its token authentication.
        _node_ip_address="127.0.0.1",
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    return True
