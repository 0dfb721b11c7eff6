"""`tag eval nba|obliqa|humaneval|npov|custom|all`: run the methods, write the report.

The subcommand's options are declared here and `langchain_tag.cli` only registers
them; the evaluation is imported when the command runs, so `tag --help` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from langchain_tag.cli import prices
from langchain_tag.cli.failures import failed_judgments
from langchain_tag.errors import CommandError, ModelNotConfiguredError
from langchain_tag_experiments.data import DATA_DIR_ENV, shared_data_dir

if TYPE_CHECKING:
    from langchain_core.decisions import BaseDecisionModel
    from langchain_core.embeddings import Embeddings
    from langchain_core.language_models import BaseChatModel

    from langchain_tag_experiments.evaluation.diagnostic import DiagnosticResult
    from langchain_tag_experiments.evaluation.methods import Method
    from langchain_tag_experiments.evaluation.runner import EvalResult
    from langchain_tag_experiments.evaluation.tasks import EvalTask

DEFAULT_OUT = Path(".langchain-tag") / "eval"
DEFAULT_EMBEDDING_CACHE = Path(".langchain-tag") / "embeddings"


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag eval` on the `tag` command's subparsers."""
    parser = commands.add_parser(
        "eval",
        help="evaluate TAG and the baselines on the development data or your own",
        description="Run the standard methods on RuleArena-NBA, the ObliQA sample, "
        "HumanEval + PEP 8, NPOV rewriting (WNC sample), or your own labelled set "
        "(custom), print the results tables, and write them as Markdown, CSV and "
        "JSON with a cost-versus-quality plot. Methods that need an LLM run only "
        "when a model is configured; --offline runs the others and the oracle "
        "(which reads the gold labels: an upper bound). --estimate prints what a "
        "run would cost without calling a model.",
    )
    parser.add_argument(
        "task",
        choices=["nba", "obliqa", "humaneval", "npov", "custom", "all"],
        help="the evaluation task (custom: your --rulebook and labelled --inputs)",
    )
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
        "--suite",
        choices=["2x2", "phases"],
        help="a named experiment: 2x2 runs chunks|rules x similarity|applicability; "
        "phases extracts a rulebook with each extraction phase skipped and "
        "evaluates TAG on each (needs a model)",
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
        "--judge-model",
        help="judge model name for the default ChatOpenAI (also NPOV's VFR judge "
        "and the extraction model of --suite phases)",
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
        "--decision-model",
        metavar="NAME",
        help="judge tag-decision with this OpenAI decision model (OpenAIClassifier, "
        "from OPENAI_API_KEY / OPENAI_BASE_URL): every candidate rule of an input "
        "one question, in one request; without it tag-decision is skipped",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use no LLM: skip the methods that need one and the executor",
    )
    parser.add_argument(
        "--rulebook", help="custom: your rulebook (tag extract's JSON file)"
    )
    parser.add_argument(
        "--inputs",
        help='custom: your labelled inputs, JSON lines {"input": ..., "applicable": '
        '[rule ids], "reference": optional expected answer, "id": optional}',
    )
    parser.add_argument(
        "--nba-rulebook",
        help="nba: an extracted rulebook instead of RuleArena's 55 catalogue rules "
        "(the method's setup). Rules in the NBA matcher's schema (applies_when, "
        "constraint, violation_check, does_not_apply_to; written by hand or by "
        "your own tooling) are judged with the NBA profile; selection is scored "
        "through the rules that map onto the catalogue (metadata catalogue_id, "
        "rule id or a tag)",
    )
    parser.add_argument(
        "--pep8-rulebook",
        help="humaneval: a PEP 8 rulebook (tag extract) instead of the curated one "
        "shipped",
    )
    parser.add_argument(
        "--npov-rulebook",
        help="npov: an NPOV rulebook (tag extract) instead of the curated one shipped",
    )
    parser.add_argument(
        "--embeddings",
        help="the embedding model of the similarity methods: a local "
        "sentence-transformers directory, or module:attribute naming a LangChain "
        "Embeddings (class, factory or instance); default the offline MiniLM (the "
        "method used BGE)",
    )
    parser.add_argument(
        "--rules-sim-k",
        type=int,
        help="k of rules+similarity (default: TAG's mean picks on the run, as in "
        "the method)",
    )
    parser.add_argument(
        "--failed-inputs",
        choices=["excluded", "wrong"],
        default="excluded",
        help="an input that failed (e.g. a judgment failed after its retries): "
        "flagged and left out of the quality means (default, the method), or "
        "scored as a wrong answer",
    )
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="print the LLM calls and tokens each chosen method would use (the "
        "input tokens a provider's prompt cache would serve among them), and "
        "dollars at list and batch prices with --price-in/--price-out; calls no "
        "model",
    )
    prices.add_arguments(parser)
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
    from langchain_tag.models import default_chat_model  # noqa: PLC0415 - loads langchain-core

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


_RULEBOOK_OPTIONS: dict[str, str] = {
    "custom": "rulebook",
    "nba": "nba_rulebook",
    "humaneval": "pep8_rulebook",
    "npov": "npov_rulebook",
}
"""Each task's rulebook option (as an attribute of the parsed arguments)."""


def _check_options(args: argparse.Namespace) -> None:
    if args.offline and (
        args.judge_model
        or args.executor_model
        or args.cheap_judge_model
        or args.decision_model
    ):
        msg = (
            "--offline uses no model; drop --judge-model, --executor-model, "
            "--cheap-judge-model and --decision-model."
        )
        raise CommandError(msg)
    for option in ("limit", "rules_sim_k", "max_concurrency"):
        value = getattr(args, option)
        if value is not None and value < 1:
            msg = f"--{option.replace('_', '-')} must be at least 1, got {value}."
            raise CommandError(msg)
    prices.check(args)
    if not args.no_embedding_cache and Path(args.embedding_cache).is_file():
        msg = (
            f"--embedding-cache {args.embedding_cache} is a file; it must be a "
            "directory (vectors are kept a file each): pass another path, or "
            "delete the file (an embeddings.sqlite of an earlier version)."
        )
        raise CommandError(msg)
    _check_task_options(args)


def _check_task_options(args: argparse.Namespace) -> None:
    """The options naming files or suites fit the task."""
    if args.task == "custom" and not (args.rulebook and args.inputs):
        msg = (
            "tag eval custom needs --rulebook R.json (your rules) and --inputs "
            'L.jsonl (one {"input": ..., "applicable": [rule ids]} per line).'
        )
        raise CommandError(msg)
    # `all` runs every task on the shared data, not a custom one.
    given = [
        f"--{option.replace('_', '-')}"
        for task, option in _RULEBOOK_OPTIONS.items()
        if getattr(args, option)
        and args.task != task
        and not (args.task == "all" and task != "custom")
    ]
    if args.inputs and args.task != "custom":
        given.append("--inputs")
    if given:
        msg = f"{', '.join(given)}: not an option of tag eval {args.task}."
        raise CommandError(msg)
    if args.suite and args.methods:
        msg = "--suite chooses the methods; drop --methods."
        raise CommandError(msg)
    _check_suite(args)


def _check_suite(args: argparse.Namespace) -> None:
    """What a suite runs leaves no room for options that would be ignored."""
    if args.suite == "2x2" and args.task == "custom":
        msg = (
            "--suite 2x2 needs chunks of the task's documents; a custom task has "
            "only its rulebook."
        )
        raise CommandError(msg)
    if args.suite != "phases":
        return
    if args.offline or args.task not in ("nba", "humaneval", "npov"):
        msg = (
            "--suite phases extracts a rulebook per ablation from the task's "
            "document with the judge model: use it without --offline, on one of "
            "nba, humaneval, npov."
        )
        raise CommandError(msg)
    ignored = [
        f"--{option.replace('_', '-')}"
        for option in (
            "estimate",
            "rules_sim_k",
            "cheap_judge_model",
            "decision_model",
            *_RULEBOOK_OPTIONS.values(),
        )
        if getattr(args, option)
    ]
    if ignored:
        msg = (
            f"--suite phases extracts its own rulebooks and runs TAG on each, and "
            f"cannot estimate extraction before its answers: drop "
            f"{', '.join(ignored)}."
        )
        raise CommandError(msg)


def _data_dir(args: argparse.Namespace) -> Path | None:
    if args.task == "custom":
        return None
    data_dir = shared_data_dir(args.data_dir)
    if data_dir is None:
        where = args.data_dir or f"${DATA_DIR_ENV} or ../shared/data"
        msg = (
            f"no data directory at {where}: pass --data-dir DIR (the directory "
            f"holding rulearena_nba/, obliqa_sample/, humaneval/, wnc_sample/ and "
            f"pep8/) or set {DATA_DIR_ENV}."
        )
        raise CommandError(msg)
    return data_dir


def _tasks(args: argparse.Namespace, data_dir: Path | None) -> list[EvalTask]:
    from langchain_tag_experiments.evaluation import tasks  # noqa: PLC0415 - heavy

    names = tasks.TASKS if args.task == "all" else (args.task,)
    return [
        tasks.load_task(
            name,
            data_dir,
            rulebook=getattr(args, _RULEBOOK_OPTIONS.get(name, ""), None),
            inputs=args.inputs,
        ).limited(args.limit)
        for name in names
    ]


def _need_sacrebleu(loaded: Sequence[EvalTask]) -> None:
    """BLEU (NPOV, custom references) needs sacrebleu: say so before running."""
    import importlib.util  # noqa: PLC0415 - only for this check

    if any(task.name in ("npov", "custom") for task in loaded) and (
        importlib.util.find_spec("sacrebleu") is None
    ):
        msg = (
            "BLEU needs sacrebleu, which is not installed: "
            "pip install 'langchain-tag-experiments[eval]'."
        )
        raise CommandError(msg)


def _patterns(args: argparse.Namespace, loaded: Sequence[EvalTask]) -> list[str] | None:
    from langchain_tag_experiments.evaluation import methods  # noqa: PLC0415 - heavy

    if args.suite == "2x2":
        return list(methods.SUITES["2x2"])
    if args.suite == "phases":
        return ["tag"]
    if not args.methods:
        return None
    patterns: list[str] = args.methods.split(",")
    # Check the patterns against every task's methods; each task then runs those
    # it has (prefilter sizes differ between tasks).
    methods.select_methods(
        [m for task in loaded for m in methods.methods_for(task)], patterns
    )
    return patterns


def run_eval_command(args: argparse.Namespace) -> int:
    """Run `tag eval` as parsed by `add_parser`; returns the exit status."""
    _check_options(args)
    loaded = _tasks(args, _data_dir(args))
    patterns = _patterns(args, loaded)
    if args.estimate:
        return _estimate(args, loaded, patterns)
    _need_sacrebleu(loaded)
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
    decision = _decision_model(args.decision_model)
    for notice in dict.fromkeys(notices):
        print(f"tag eval: {notice}", file=sys.stderr)  # noqa: T201
    # A judge that flags failed judgments warns per input: one line for the run.
    if args.suite == "phases":
        if judge is None:
            msg = "--suite phases extracts with the judge model: configure one."
            raise CommandError(msg)
        with failed_judgments("eval"):
            results = _phase_suite(args, loaded[0], judge, executor)
        return _report(args, results, [])
    with failed_judgments("eval"):
        results, diagnostics = _evaluate(
            args, loaded, patterns, (judge, cheap, executor), decision
        )
    return _report(args, results, diagnostics)


def _decision_model(name: str | None) -> BaseDecisionModel | None:
    """`--decision-model NAME` as `OpenAIClassifier`; None without it."""
    if name is None:
        return None
    from langchain_tag.settings import decision_model  # noqa: PLC0415 - openai

    return decision_model(name)


def _selected(task: EvalTask, patterns: list[str] | None) -> list[Method]:
    from langchain_tag_experiments.evaluation import methods  # noqa: PLC0415 - heavy

    chosen = methods.methods_for(task)
    return (
        chosen
        if patterns is None
        else methods.select_methods(chosen, patterns, strict=False)
    )


def _embeddings(args: argparse.Namespace) -> Embeddings:
    from langchain_tag_experiments.evaluation import embedding_cache  # noqa: PLC0415 - heavy

    return embedding_cache.shared_embeddings(
        args.embeddings,
        cache=None if args.no_embedding_cache else args.embedding_cache,
    )


def _progress(started: float) -> Callable[[EvalResult], None]:
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

    return progress


def _evaluate(
    args: argparse.Namespace,
    loaded: Sequence[EvalTask],
    patterns: list[str] | None,
    models: tuple[BaseChatModel | None, BaseChatModel | None, BaseChatModel | None],
    decision: BaseDecisionModel | None,
) -> tuple[list[EvalResult], list[DiagnosticResult]]:
    from langchain_tag_experiments.evaluation import (  # noqa: PLC0415 - heavy imports
        diagnostic,
        runner,
    )

    embeddings = _embeddings(args)
    progress = _progress(time.perf_counter())
    results: list[EvalResult] = []
    diagnostics: list[DiagnosticResult] = []
    for task in loaded:
        chosen = _selected(task, patterns)
        if not chosen:
            continue
        results += asyncio.run(
            runner.aevaluate(
                task,
                methods=[m.name for m in chosen],
                judge_model=models[0],
                cheap_judge_model=models[1],
                executor_model=models[2],
                decision_model=decision,
                embeddings=embeddings,
                max_concurrency=args.max_concurrency,
                rules_sim_k=args.rules_sim_k,
                failed_inputs=args.failed_inputs,
                on_result=progress,
            )
        )
        kinds = [m.scorer for m in chosen if m.scorer is not None]
        if kinds and task.gold_rules() is not None:
            diagnostics += diagnostic.diagnose(task, embeddings, kinds)
    return results, diagnostics


def _estimate(
    args: argparse.Namespace, loaded: Sequence[EvalTask], patterns: list[str] | None
) -> int:
    from langchain_tag_experiments.evaluation import estimate  # noqa: PLC0415 - heavy

    embeddings = _embeddings(args)
    token_prices, caching = prices.from_args(args)
    rows = [
        row
        for task in loaded
        for row in estimate.estimate_methods(
            task,
            _selected(task, patterns),
            judge=not args.offline,
            cheap_judge=bool(args.cheap_judge_model),
            executor=not args.offline,
            decision=bool(args.decision_model),
            embeddings=embeddings,
            max_concurrency=args.max_concurrency,
            rules_sim_k=args.rules_sim_k,
            prices=token_prices,
            caching=caching,
        )
    ]
    print(estimate.estimate_table(rows, prices=token_prices, caching=caching))  # noqa: T201
    if not args.offline:
        print(  # noqa: T201
            "Assumes a judge model and an executor model are configured (as a run "
            "needs); --offline estimates the methods that need none."
        )
    return 0


def _phase_suite(
    args: argparse.Namespace,
    task: EvalTask,
    judge: BaseChatModel,
    executor: BaseChatModel | None,
) -> list[EvalResult]:
    from langchain_tag_experiments.evaluation import suites  # noqa: PLC0415 - heavy

    return asyncio.run(
        suites.aphase_ablation(
            task,
            extraction_model=judge,
            judge_model=judge,
            executor_model=executor,
            embeddings=_embeddings(args),
            max_concurrency=args.max_concurrency,
            checkpoint_dir=Path(args.out) / "phases",
            on_result=_progress(time.perf_counter()),
        )
    )


def _report(
    args: argparse.Namespace,
    results: list[EvalResult],
    diagnostics: list[DiagnosticResult],
) -> int:
    from langchain_tag_experiments.evaluation.report import (  # noqa: PLC0415
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
