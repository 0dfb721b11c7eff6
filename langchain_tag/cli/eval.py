"""`tag eval nba|obliqa|humaneval|all`: run the methods, print and write the report.

The subcommand's options are declared here and `langchain_tag.cli` only registers
them; the evaluation is imported when the command runs, so `tag --help` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from langchain_tag.cli.errors import CommandError
from langchain_tag.data import DATA_DIR_ENV, shared_data_dir

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from langchain_tag.evaluation.diagnostic import DiagnosticResult
    from langchain_tag.evaluation.runner import EvalResult
    from langchain_tag.evaluation.tasks import TaskName

DEFAULT_OUT = Path(".langchain-tag") / "eval"
DEFAULT_EMBEDDING_CACHE = Path(".langchain-tag") / "embeddings"


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag eval` on the `tag` command's subparsers."""
    parser = commands.add_parser(
        "eval",
        help="evaluate TAG and the baselines on the development data",
        description="Run the standard methods on RuleArena-NBA, the ObliQA sample "
        "and/or HumanEval + PEP 8, print the results tables, and write them as "
        "Markdown, CSV and JSON with a cost-versus-quality plot. Methods that need "
        "an LLM run only when a model is configured; --offline runs the others and "
        "the oracle (which reads the gold labels: an upper bound).",
    )
    parser.add_argument("task", choices=["nba", "obliqa", "humaneval", "all"])
    parser.add_argument(
        "--data-dir",
        help=f"the shared data directory (default ${DATA_DIR_ENV}, else "
        "../shared/data)",
    )
    parser.add_argument(
        "--methods",
        help="comma-separated method names or globs, e.g. 'm0-*,prefilter-*,oracle' "
        "(default: all)",
    )
    parser.add_argument(
        "--limit", type=int, help="evaluate only the first N inputs of each task"
    )
    parser.add_argument(
        "--out",
        default=str(DEFAULT_OUT),
        help=f"directory for the report files (default {DEFAULT_OUT})",
    )
    parser.add_argument(
        "--judge-model", help="judge model name for the default ChatOpenAI"
    )
    parser.add_argument(
        "--executor-model", help="executor model name for the default ChatOpenAI"
    )
    parser.add_argument(
        "--cheap-judge-model",
        help="the cascade's cheap first judge (a ChatOpenAI model with logprobs); "
        "without it the cascade is skipped",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use no LLM: skip the methods that need one and the executor",
    )
    parser.add_argument(
        "--pep8-rulebook",
        help="a PEP 8 rulebook (tag extract) for HumanEval's rule methods",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=8,
        help="inputs in progress, and LLM calls in flight per method (default 8)",
    )
    parser.add_argument(
        "--embedding-cache",
        default=str(DEFAULT_EMBEDDING_CACHE),
        help="directory keeping embedding vectors across runs (default "
        f"{DEFAULT_EMBEDDING_CACHE})",
    )
    parser.add_argument(
        "--no-embedding-cache",
        action="store_true",
        help="keep no vectors on disk (everything is embedded again next time)",
    )
    parser.add_argument("--no-plot", action="store_true", help="write the tables only")
    parser.set_defaults(handler=run_eval_command)


def _model(name: str | None, role: str, notices: list[str]) -> BaseChatModel | None:
    from langchain_tag.models import (  # noqa: PLC0415 - loads langchain-core
        ModelNotConfiguredError,
        default_chat_model,
    )

    if name:
        return default_chat_model(model=name)
    try:
        return default_chat_model()
    except ModelNotConfiguredError:
        notices.append(
            f"no {role} model is configured (OPENAI_API_KEY / OPENAI_BASE_URL), so "
            f"the methods or metrics needing one are skipped"
        )
        return None


def run_eval_command(args: argparse.Namespace) -> int:
    """Run `tag eval` as parsed by `add_eval_parser`; returns the exit status."""
    if args.offline and (
        args.judge_model or args.executor_model or args.cheap_judge_model
    ):
        msg = (
            "--offline uses no model; drop --judge-model, --executor-model and "
            "--cheap-judge-model."
        )
        raise CommandError(msg)
    if args.limit is not None and args.limit < 1:
        msg = f"--limit must be a positive number of inputs, got {args.limit}."
        raise CommandError(msg)
    if not args.no_embedding_cache and Path(args.embedding_cache).is_file():
        msg = (
            f"--embedding-cache {args.embedding_cache} is a file; it must be a "
            "directory (vectors are kept a file each): pass another path, or "
            "delete the file (an embeddings.sqlite of an earlier version)."
        )
        raise CommandError(msg)
    data_dir = shared_data_dir(args.data_dir)
    if data_dir is None:
        where = args.data_dir or f"${DATA_DIR_ENV} or ../shared/data"
        msg = (
            f"no data directory at {where}: pass --data-dir DIR (the directory "
            f"holding rulearena_nba/, obliqa_sample/, humaneval/ and pep8/) or set "
            f"{DATA_DIR_ENV}."
        )
        raise CommandError(msg)
    from langchain_tag.evaluation import methods, tasks  # noqa: PLC0415 - heavy

    names = tasks.TASKS if args.task == "all" else (args.task,)
    patterns = args.methods.split(",") if args.methods else None
    if patterns:
        # Check the patterns against every task's methods; each task then runs
        # those it has (prefilter sizes differ between tasks).
        methods.select_methods(
            [m for name in names for m in methods.standard_methods(name)], patterns
        )
    notices: list[str] = []
    judge = None if args.offline else _model(args.judge_model, "judge", notices)
    executor = (
        None if args.offline else _model(args.executor_model, "executor", notices)
    )
    cheap = (
        _model(args.cheap_judge_model, "cheap judge", notices)
        if args.cheap_judge_model
        else None
    )
    for notice in dict.fromkeys(notices):
        print(f"tag eval: {notice}", file=sys.stderr)  # noqa: T201
    results, diagnostics = _evaluate(
        args, data_dir, (names, patterns), (judge, cheap, executor)
    )
    return _report(args, results, diagnostics)


def _evaluate(
    args: argparse.Namespace,
    data_dir: Path,
    selection: tuple[Sequence[TaskName], list[str] | None],
    models: tuple[BaseChatModel | None, BaseChatModel | None, BaseChatModel | None],
) -> tuple[list[EvalResult], list[DiagnosticResult]]:
    from langchain_tag.evaluation import (  # noqa: PLC0415 - heavy imports
        diagnostic,
        embedding_cache,
        methods,
        runner,
        tasks,
    )

    names, patterns = selection
    embeddings = embedding_cache.shared_embeddings(
        cache=None if args.no_embedding_cache else args.embedding_cache
    )
    started = time.perf_counter()

    def progress(result: EvalResult) -> None:
        status = (
            f"skipped ({(result.skip_reason or '').split(':')[0]})"
            if result.status == "skipped"
            else f"{result.n} inputs, {result.wall_seconds:.1f} s"
        )
        elapsed = time.perf_counter() - started
        print(  # noqa: T201
            f"[{elapsed:6.1f}s] {result.task} {result.method}: {status}",
            file=sys.stderr,
            flush=True,
        )

    results: list[EvalResult] = []
    diagnostics: list[DiagnosticResult] = []
    for name in names:
        chosen = (
            methods.standard_methods(name)
            if patterns is None
            else methods.select_methods(
                methods.standard_methods(name), patterns, strict=False
            )
        )
        if not chosen:
            continue
        task = tasks.load_task(
            name, data_dir, pep8_rulebook=args.pep8_rulebook
        ).limited(args.limit)
        results += asyncio.run(
            runner.aevaluate(
                task,
                methods=[m.name for m in chosen],
                judge_model=models[0],
                cheap_judge_model=models[1],
                executor_model=models[2],
                embeddings=embeddings,
                max_concurrency=args.max_concurrency,
                on_result=progress,
            )
        )
        kinds = [m.scorer for m in chosen if m.scorer is not None]
        if kinds:
            diagnostics += diagnostic.diagnose(task, embeddings, kinds)
    return results, diagnostics


def _report(
    args: argparse.Namespace,
    results: list[EvalResult],
    diagnostics: list[DiagnosticResult],
) -> int:
    from langchain_tag.evaluation.report import (  # noqa: PLC0415
        markdown_table,
        write_report,
    )

    print(markdown_table(results, diagnostics))  # noqa: T201
    try:
        files = write_report(
            results, args.out, diagnostics=diagnostics, plot=not args.no_plot
        )
    except ImportError as error:
        raise CommandError(str(error)) from None
    written = [files.markdown, files.csv, files.json, files.diagnostic]
    if files.plot is not None:
        written.append(files.plot)
    print("wrote " + ", ".join(str(path) for path in written))  # noqa: T201
    return 0
