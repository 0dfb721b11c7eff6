"""`tag run RULEBOOK --inputs IN.jsonl -o OUT.jsonl`: a rulebook over a corpus.

The options a bulk run adds to `tag run`; the job itself is `langchain_tag.bulk`.
Resumable (a rerun skips the ids already written), spread over a Ray pool
(`--engine ray`) or split by hand (`--shard I/N`), at batch prices (`--via
batch`), and priced before it starts (`--estimate`).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from langchain_tag.cli import prices
from langchain_tag.cli._status import StatusLine
from langchain_tag.cli.errors import (
    at_least,
    check_writable,
    model_failed,
    no_rules,
    number_in,
    probability,
)
from langchain_tag.cli.prefilter import target_recall
from langchain_tag.errors import (
    BulkPendingError,
    BulkRunError,
    CommandError,
    JudgmentError,
    advice,
    describe_error,
)

PENDING_STATUS = 75
"""Exit status when batches are still running (EX_TEMPFAIL): run again later."""

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_tag.batch import BatchProgress
    from langchain_tag.bulk import BulkInput, BulkJob, BulkSummary
    from langchain_tag.learning import LearnedPrefilter
    from langchain_tag.rules import Rulebook


def add_arguments(run: argparse.ArgumentParser) -> None:
    """Add the bulk options to `tag run`'s parser."""
    bulk = run.add_argument_group(
        "bulk runs",
        'With --inputs: every line of IN.jsonl ({"id": ..., "input": "..."}) '
        "is matched and answered into -o OUT.jsonl; run the same command again to "
        "resume.",
    )
    bulk.add_argument(
        "--inputs", metavar="IN.jsonl", help="the inputs, one JSON a line"
    )
    bulk.add_argument("-o", "--output", metavar="OUT.jsonl", help="where records go")
    bulk.add_argument(
        "--match-only", action="store_true", help="match only: no executor calls"
    )
    bulk.add_argument(
        "--via",
        choices=["online", "batch"],
        default="online",
        help="online requests, or the OpenAI Batch API (about half price, results "
        "within 24 h)",
    )
    bulk.add_argument(
        "--poll-interval",
        type=_seconds,
        default=60.0,
        help="--via batch: seconds between polls of the running batches (default 60)",
    )
    bulk.add_argument(
        "--max-wait",
        type=_seconds,
        help="--via batch: stop polling after this many seconds (exit status 75; "
        "run again to collect); default: wait until the batches end",
    )
    bulk.add_argument(
        "--batch-max-requests",
        type=at_least(1),
        default=50_000,
        help="--via batch: requests per batch file (default 50,000, OpenAI's limit)",
    )
    bulk.add_argument(
        "--batch-max-mb",
        type=number_in(0.001, 200.0),
        default=200.0,
        help="--via batch: megabytes per batch file (default 200, OpenAI's limit)",
    )
    bulk.add_argument(
        "--shard",
        metavar="I/N",
        type=_shard,
        help="only the I-th of N shares of the ids (each share a run of its own, "
        "e.g. one per machine without a cluster; with a cluster, --engine ray)",
    )
    bulk.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: this process; ray: a pool of Ray workers, each with its own "
        "judge (pip install 'langchain-tag[ray]')",
    )
    bulk.add_argument(
        "--workers",
        type=at_least(1),
        help="--engine ray: worker actors (default: the CPUs of Ray)",
    )
    bulk.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="--engine ray: the cluster to join (ray://host:10001, or auto); "
        "default: a local Ray for this run",
    )
    bulk.add_argument(
        "--estimate",
        action="store_true",
        help="print the calls, tokens and price of what is left to do; call nothing",
    )
    prices.add_arguments(bulk)
    bulk.add_argument(
        "--cache",
        metavar="PATH|URI",
        help="verdict cache: an SQLite file or a postgresql:// URI shared by shards "
        "(default OUT.jsonl.cache.sqlite)",
    )
    bulk.add_argument(
        "--verdict-log", metavar="PATH|URI", help="log every judgment (to learn from)"
    )
    bulk.add_argument(
        "--learned-prefilter",
        metavar="MODEL.npz",
        help="skip rules a trained LearnedPrefilter predicts NO (tag prefilter train)",
    )
    bulk.add_argument(
        "--target-recall",
        type=target_recall,
        help="with --learned-prefilter: the recall to keep, in (0, 1] (default the "
        "model's)",
    )
    bulk.add_argument(
        "--explore",
        type=probability,
        help="with --learned-prefilter: share of skipped pairs judged anyway "
        "(default 0.05)",
    )
    bulk.add_argument(
        "--retrain-every",
        type=at_least(1),
        help="with --learned-prefilter and --verdict-log: retrain after this many "
        "new verdicts",
    )
    bulk.add_argument(
        "--rules-per-call", type=at_least(1), default=1, help="rules judged per call"
    )
    bulk.add_argument(
        "--concurrency",
        type=at_least(1),
        default=4,
        help="inputs in progress at once (online; judgments in flight stay under "
        "--max-concurrency)",
    )


_seconds = number_in(0.0, math.inf)


def _shard(text: str) -> Any:
    from langchain_tag.bulk import Shard  # noqa: PLC0415

    try:
        return Shard.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def bulk_command(args: argparse.Namespace) -> int:
    """Run `tag run --inputs`."""
    from langchain_tag.bulk import read_inputs  # noqa: PLC0415
    from langchain_tag.rules import Rulebook  # noqa: PLC0415

    if args.output is None:
        msg = "--inputs needs -o OUT.jsonl: the file the records are appended to."
        raise CommandError(msg)
    orphans = [
        option
        for option, given in (
            ("--target-recall", args.target_recall),
            ("--explore", args.explore),
            ("--retrain-every", args.retrain_every),
        )
        if given is not None
    ]
    if orphans and args.learned_prefilter is None:
        msg = f"{', '.join(orphans)}: options of --learned-prefilter MODEL.npz."
        raise CommandError(msg)
    _check_engine(args)
    prices.check(args)
    out = Path(args.output)
    if not args.estimate:
        check_writable(out, example="out.jsonl", not_done="run")
    rulebook = Rulebook.load(args.rulebook)
    if not rulebook.rules:
        raise CommandError(no_rules(args.rulebook, rulebook))
    if out.exists() and Path(args.inputs).exists() and out.samefile(args.inputs):
        msg = f"-o {out} is the --inputs file; name another file for the records."
        raise CommandError(msg)
    inputs = read_inputs(args.inputs)
    job = _job(args, rulebook, out)
    # An estimate changes nothing, not even a torn last line.
    todo, already, _ = job.pending(inputs, out, cut=not args.estimate)
    if args.estimate:
        return _estimate(args, job, todo, already)
    return _run(args, job, inputs, out, len(todo), already)


def _check_engine(args: argparse.Namespace) -> None:
    """Refuse Ray options without --engine ray, and what a Ray run cannot do."""
    if args.engine != "ray":
        ray_only = [
            option
            for option, given in (
                ("--workers", args.workers),
                ("--ray-address", args.ray_address),
            )
            if given is not None
        ]
        if ray_only:
            msg = f"{', '.join(ray_only)}: options of --engine ray."
            raise CommandError(msg)
        return
    if args.via == "batch":
        msg = (
            "--engine ray with --via batch: the Batch API already spreads the "
            "judgments on the provider's side; drop one of them."
        )
        raise CommandError(msg)
    if args.retrain_every is not None:
        msg = (
            "--retrain-every with --engine ray: each worker uses the prefilter it "
            "was given; retrain between runs (tag prefilter train) and pass the "
            "new --learned-prefilter."
        )
        raise CommandError(msg)
    if not args.estimate:
        from langchain_tag.bulk_ray import require_ray  # noqa: PLC0415 - ray, optional

        require_ray()  # missing: one line naming the install, before anything runs


def _run(
    args: argparse.Namespace,
    job: BulkJob,
    inputs: Sequence[BulkInput],
    out: Path,
    todo: int,
    already: int,
) -> int:
    """Run the job, its errors said in one line with this command's options."""
    from langchain_tag.cli._models import batch_api  # noqa: PLC0415
    from langchain_tag.errors import BatchFailedError, BatchLaneError  # noqa: PLC0415
    from langchain_tag.matching.verdicts import failure_kind, failure_reason  # noqa: PLC0415

    progress = _Progress(sys.stderr, todo, already)
    try:
        summary = job.run(
            inputs, out, config={"run_name": "tag-bulk"}, progress=progress
        )
    except BulkPendingError as error:
        print(f"tag run: {error}", file=sys.stderr)  # noqa: T201
        return PENDING_STATUS
    except BulkRunError as error:
        raise CommandError(_failed(error)) from error
    except (BatchLaneError, BatchFailedError) as error:
        msg = f"--via batch: {error}"
        raise CommandError(msg) from error
    except Exception as error:
        if not model_failed(error):
            raise
        # The batch lane's own calls (files, batches, their online retries).
        what = advice(
            failure_kind(error),
            stronger_model="a stronger --model",
            retry_hint="run the same command again later to resume",
            reason=failure_reason(error),
        )
        endpoint = (
            f" (does this endpoint serve {batch_api(args)}?)"
            if args.via == "batch"
            else ""
        )
        msg = (
            f"the model provider failed{endpoint}: {describe_error(error)}. Every "
            f"answer so far is kept; {what}."
        )
        raise CommandError(msg) from error
    finally:
        progress.close()
        job.close()
    print(_format_summary(summary, out))  # noqa: T201
    return 0


def _failed(error: BulkRunError) -> str:
    """A failed input, said with this command's options."""
    from langchain_tag.matching.verdicts import failure_kind, failure_reason  # noqa: PLC0415

    cause = error.cause
    what = advice(
        failure_kind(cause),
        stronger_model="a stronger --model",
        retry_hint="run the same command again later to resume",
        on_error=(
            "--on-error not_applicable" if isinstance(cause, JudgmentError) else None
        ),
        reason=failure_reason(cause),
    )
    return f"{error} Nothing was assumed about any rule; {what}."


def _job(
    args: argparse.Namespace,
    rulebook: Rulebook,
    out: Path,
    loaded: _Prefilter | None = None,
) -> BulkJob:
    """The job of these options; `loaded`: the prefilter, when a worker builds it."""
    from langchain_tag._names import named  # noqa: PLC0415
    from langchain_tag.bulk import BulkJob  # noqa: PLC0415
    from langchain_tag.cache import open_verdict_cache  # noqa: PLC0415
    from langchain_tag.cli._models import model_from  # noqa: PLC0415
    from langchain_tag.cli.run import decision_options  # noqa: PLC0415
    from langchain_tag.engine import MatchOptions  # noqa: PLC0415
    from langchain_tag.execution import ActionOnlyExecutor  # noqa: PLC0415
    from langchain_tag.execution.templates import TEMPLATES  # noqa: PLC0415
    from langchain_tag.learning import LearnedPrefilter  # noqa: PLC0415
    from langchain_tag.learning.verdict_log import open_verdict_log  # noqa: PLC0415
    from langchain_tag.matching.profiles import PROFILES, profile_for  # noqa: PLC0415
    from langchain_tag.models import with_settings  # noqa: PLC0415
    from langchain_tag.settings import MatchSettings  # noqa: PLC0415

    decision = decision_options(args)
    # A decision model judges; the executor is the chat model (none: match only).
    llm = None if args.match_only and decision else model_from(args)
    if loaded is None and args.learned_prefilter is not None:
        extra = (
            {} if args.target_recall is None else {"target_recall": args.target_recall}
        )
        loaded = _Prefilter(
            LearnedPrefilter.load(args.learned_prefilter, rulebook, **extra),
            _file_digest(args.learned_prefilter),
        )
    prefilter = None if loaded is None else loaded.model
    cache = args.cache or f"{out}.cache.sqlite"
    settings = MatchSettings(
        llm=decision.get("llm", llm),
        # An estimate writes nothing: a cache or log not there yet has nothing to
        # read, so it is not made.
        cache=open_verdict_cache(cache)
        if not args.estimate or _exists(cache)
        else None,
        verdict_log=(
            open_verdict_log(args.verdict_log)
            if args.verdict_log is not None
            and (not args.estimate or _exists(args.verdict_log))
            else None
        ),
        rules_per_call=args.rules_per_call,
        questions_per_request=decision.get("questions_per_request", 200),
        decision_threshold=decision.get("decision_threshold", 0.5),
        on_error=args.on_error,
        logprobs=args.logprobs,
        prefilter=prefilter,
        explore=0.05 if args.explore is None else args.explore,
        retrain_every=args.retrain_every,
        max_concurrency=args.max_concurrency,
    )
    profile = (
        named(args.profile, PROFILES, "profile")
        if args.profile
        else profile_for(rulebook)
    )
    engine = settings.build_engine(profile)
    executor = (
        None
        if args.match_only or llm is None
        # The job's retries are the one layer: the client's own would multiply them.
        else ActionOnlyExecutor(
            llm=with_settings(llm, max_retries=0)[0],
            template=named(args.template, TEMPLATES, "template"),
        )
    )
    batch_settings = None
    if args.via == "batch":
        from langchain_tag.batch import BatchSettings  # noqa: PLC0415 - openai

        batch_settings = BatchSettings(
            poll_interval=args.poll_interval,
            max_wait=args.max_wait,
            max_requests_per_file=args.batch_max_requests,
            max_bytes_per_file=int(args.batch_max_mb * 1_000_000),
        )
    return BulkJob(
        engine,
        rulebook.rules,
        executor,
        MatchOptions(k=args.k, score_threshold=args.score_threshold),
        via=args.via,
        shard=args.shard,
        concurrency=args.concurrency,
        backend=args.engine,
        workers=args.workers,
        ray_address=args.ray_address,
        recipe=(
            _Recipe(_portable(args), rulebook, out.absolute(), loaded)
            if args.engine == "ray"
            else None
        ),
        batch_settings=batch_settings,
        batch_progress=_batch_progress,
        settings={
            "profile": profile.name,
            "rules_per_call": args.rules_per_call,
            "logprobs": args.logprobs,
            **(
                {}
                if not decision
                else {
                    "questions_per_request": settings.questions_per_request,
                    "decision_threshold": settings.decision_threshold,
                }
            ),
            "learned_prefilter": None if loaded is None else loaded.digest,
            "target_recall": args.target_recall,
            "explore": args.explore,
        },
    )


@dataclass(frozen=True)
class _Prefilter:
    """A learned prefilter loaded on the driver, and the digest of its file."""

    model: LearnedPrefilter
    digest: str


@dataclass(frozen=True)
class _Recipe:
    """How a Ray worker builds this command's job: pickled, by value.

    The options, the rulebook and the prefilter travel as they are (a worker on
    another machine has neither the rulebook's file nor the model's); the models
    are configured from the command's options and environment variables, which
    `langchain_tag.bulk_ray` forwards.
    """

    args: argparse.Namespace
    rulebook: Rulebook
    out: Path
    prefilter: _Prefilter | None

    def __call__(self) -> BulkJob:
        return _job(self.args, self.rulebook, self.out, self.prefilter)


def _portable(args: argparse.Namespace) -> argparse.Namespace:
    """The options as a worker needs them: paths absolute, no handler function."""
    options = {**vars(args)}
    options.pop("handler", None)
    for name in ("cache", "verdict_log"):
        location = options.get(name)
        if location is not None and "://" not in location:
            options[name] = str(Path(location).absolute())
    return argparse.Namespace(**options)


def _file_digest(path: str) -> str:
    """The sha256 of a file: the manifest names a model by content, not by path."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _exists(location: str) -> bool:
    """Whether a cache or log is there to read: a server always, a file if it is."""
    return "://" in location or Path(location).exists()


def _estimate(
    args: argparse.Namespace, job: BulkJob, todo: Sequence[BulkInput], already: int
) -> int:
    from langchain_tag.estimate import estimate_bulk  # noqa: PLC0415

    token_prices, caching = prices.from_args(args)
    found = estimate_bulk(
        job.engine,
        job.rules,
        [item.input for item in todo],
        options=job.options,
        executor=job.executor,
        prices=token_prices,
        caching=caching,
        in_flight=args.max_concurrency,
    )
    usage = found.usage
    left = f"{found.inputs} input(s) to do" + (
        f" ({already} already written)" if already else ""
    )
    lines = [
        f"estimate for {left}; no model was called:",
        (
            f"  judgments: {found.judgments} pairs, {found.cached_verdicts} already "
            f"in the verdict cache; {found.judge_calls} judge call(s)"
        ),
        f"  executor calls: {found.executor_calls}",
        (
            f"  tokens: {usage.input_tokens:,} in ({usage.cached_input_tokens:,} "
            f"from the provider's prompt cache, estimated), {usage.output_tokens:,} "
            f"out ({found.token_counter})"
        ),
    ]
    if found.dollars is None:
        lines.append(
            "  price: give --price-in and --price-out (USD per million tokens)"
        )
    else:
        lines.append(
            f"  price: ${found.dollars:,.2f} at list prices, "
            f"${found.batch_dollars:,.2f} at batch prices (--via batch, or flex)"
        )
    lines += [f"  note: {note}" for note in found.notes]
    print("\n".join(lines))  # noqa: T201
    return 0


def _batch_progress(poll: BatchProgress) -> None:
    """One line per poll of a batch, on stderr."""
    counts = f"{poll.completed}/{poll.total} done" + (
        f", {poll.failed} failed" if poll.failed else ""
    )
    print(  # noqa: T201
        f"tag run: batch {poll.batch_id} {poll.status}: {counts} "
        f"({_duration(poll.waited)} waited)",
        file=sys.stderr,
        flush=True,
    )


class _Progress:
    """Inputs done on a status line: redrawn on a terminal, every 10% elsewhere."""

    def __init__(self, stream: TextIO, total: int, already: int) -> None:
        self.status = StatusLine(stream)
        self.total = total
        self.already = already
        self.started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        self.total = total
        if not total:
            return
        share = done / total
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 and done else 0.0
        eta = f", about {_duration((total - done) / rate)} left" if rate else ""
        already = f"; {self.already} already written" if self.already else ""
        line = f"tag run: {done}/{total} inputs ({share:.0%}){eta}{already}"
        self.status.show(line, int(share * 10))

    def close(self) -> None:
        self.status.close()


def _duration(seconds: float) -> str:
    if seconds < 90:  # noqa: PLR2004
        return f"{seconds:.0f} s"
    if seconds < 5400:  # noqa: PLR2004
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _format_summary(summary: BulkSummary, out: Path) -> str:
    usage = summary.usage
    written = f"{summary.done} input(s) written to {out}"
    if summary.already_written:
        written += f" ({summary.already_written} already there, skipped)"
    if summary.in_shard != summary.inputs:
        written += f"; shard holds {summary.in_shard} of {summary.inputs}"
    lines = [
        written,
        (
            f"judgments: {summary.judgments} ({summary.cached} from the cache); "
            f"executor calls: {summary.executor_calls}; via {summary.via}"
            + (
                f"; engine ray, {summary.workers} worker(s)"
                if summary.backend == "ray"
                else ""
            )
        ),
        (
            f"LLM calls: {usage.calls}; tokens: {usage.describe()}; "
            f"{summary.seconds:.1f} s"
        ),
    ]
    for lane, report in (summary.batch or {}).items():
        failures = ", ".join(
            f"{count} {why}" for why, count in report["line_failures"].items()
        )
        lines.append(
            f"batch ({lane}): {report['sent']} sent, {report['from_batch']} answered "
            f"by batches, {report['online']} done online after their line failed"
            + (f" ({failures})" if failures else "")
            + f", {report['cached']} already answered; batches "
            + ", ".join(report["batch_ids"] + report["resumed_batch_ids"])
        )
    if summary.torn_line:
        lines.append(
            "note: the output's last line was torn (an earlier run was killed); "
            "that input was done again"
        )
    if summary.failed_judgments:
        lines.append(
            f"{summary.failed_judgments} judgment(s) failed and were treated as not "
            "applicable (--on-error not_applicable): see failed_rule_ids"
        )
    return "\n".join(lines)
