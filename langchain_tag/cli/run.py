"""`tag run RULEBOOK "input"`: match the input, then execute the matched actions.

With `--inputs IN.jsonl -o OUT.jsonl` it runs a whole corpus instead (`cli.bulk`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain_tag._text import STANDARD_INPUT, read_text
from langchain_tag.cli import bulk
from langchain_tag.cli._models import model_from
from langchain_tag.cli.errors import (
    at_least,
    model_failed,
    model_name,
    no_rules,
    probability,
)
from langchain_tag.errors import CommandError, JudgmentError, advice, describe_error

if TYPE_CHECKING:
    from langchain_tag.usage import TokenUsage


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag run` on the `tag` command's subparsers."""
    run = commands.add_parser(
        "run",
        help="match an input against a rulebook and execute the matched actions",
        description="Judge every rule of the rulebook against the input (one LLM "
        "call each, the actions withheld), then answer with only the matched actions.",
    )
    run.add_argument("rulebook", help="rulebook JSON written by `tag extract`")
    run.add_argument(
        "input",
        nargs="?",
        help='the input text, or "-" to read standard input (or --inputs FILE)',
    )
    run.add_argument(
        "--model",
        type=model_name,
        help="model name for the default ChatOpenAI, or anthropic:NAME for "
        "ChatAnthropic (else $TAG_MODEL)",
    )
    run.add_argument(
        "-k", type=at_least(0), help="execute with at most K matched rules"
    )
    run.add_argument(
        "--score-threshold",
        type=probability,
        help="drop matches scoring below this (needs --logprobs)",
    )
    run.add_argument(
        "--logprobs",
        action="store_true",
        help="score verdicts by P(YES) from the model's logprobs",
    )
    run.add_argument(
        "--profile",
        help="rule-schema profile (condition, nba); default the one of the schema "
        "the rulebook was extracted in (`tag extract --schema`), else condition",
    )
    run.add_argument(
        "--template",
        default="generic",
        help="executor template (generic, npov, code, nba)",
    )
    run.add_argument(
        "--on-error",
        choices=["raise", "not_applicable"],
        default="raise",
        help="a judgment that still fails after its retries: stop (default), or go "
        "on with that rule flagged as unjudged and not applied",
    )
    run.add_argument(
        "--max-concurrency",
        type=at_least(1),
        default=8,
        help="model calls in flight at most (default 8)",
    )
    run.add_argument(
        "--service-tier",
        choices=["auto", "default", "flex", "priority"],
        help="OpenAI service tier (else $TAG_SERVICE_TIER); flex: batch prices, "
        "slower, and 'resource unavailable' retried patiently",
    )
    add_decision_arguments(run)
    bulk.add_arguments(run)
    run.set_defaults(handler=run_command)


def add_decision_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that judge with a decision model (`tag run`, `tag eval`)."""
    group = parser.add_argument_group(
        "decision model",
        "Judge with a decision model instead of a chat model: every rule of an "
        "input is one yes/no question of one request, answered with a probability "
        "(the verdict's score) and no text.",
    )
    group.add_argument(
        "--decision-model",
        metavar="NAME",
        help="OpenAI Decisions API model (e.g. gpt-6-luna), from OPENAI_API_KEY and "
        "OPENAI_BASE_URL; --model still names the executor's chat model",
    )
    group.add_argument(
        "--questions-per-request",
        type=at_least(1),
        help="with --decision-model: rules asked in one request at most (default 200)",
    )
    group.add_argument(
        "--decision-threshold",
        type=probability,
        help="with --decision-model: a rule applies when its probability reaches "
        "this (default 0.5)",
    )


def decision_options(args: argparse.Namespace) -> dict[str, Any]:
    """The judge options of `--decision-model`, checked; {} without it.

    Raises:
        CommandError: A decision option without `--decision-model`, or a chat-only
            option with it.
    """
    name = args.decision_model
    given = [
        option
        for option, value in (
            ("--questions-per-request", args.questions_per_request),
            ("--decision-threshold", args.decision_threshold),
        )
        if value is not None
    ]
    if name is None:
        if given:
            msg = f"{', '.join(given)}: options of --decision-model NAME."
            raise CommandError(msg)
        return {}
    chat_only = [
        option
        for option, value in (
            ("--logprobs", getattr(args, "logprobs", False)),
            ("--rules-per-call", (getattr(args, "rules_per_call", 1) or 1) > 1),
            ("--via batch", getattr(args, "via", None) == "batch"),
        )
        if value
    ]
    if chat_only:
        msg = (
            f"{', '.join(chat_only)} judge with a chat model; --decision-model "
            "answers every rule of an input in one request, with a probability each "
            "(use --questions-per-request and --decision-threshold)."
        )
        raise CommandError(msg)
    from langchain_tag.settings import decision_model  # noqa: PLC0415

    return {
        "llm": decision_model(name),
        "questions_per_request": args.questions_per_request or 200,
        "decision_threshold": (
            0.5 if args.decision_threshold is None else args.decision_threshold
        ),
    }


def run_command(args: argparse.Namespace) -> int:
    """Run `tag run` (one input, or a corpus with --inputs)."""
    if (args.input is None) == (args.inputs is None):
        msg = (
            "give one input (the text, or - for standard input) or --inputs FILE "
            "(one JSON object a line), not both"
            if args.input is not None
            else "nothing to run: give the input text, - to read standard input, or "
            "--inputs IN.jsonl -o OUT.jsonl for a corpus"
        )
        raise CommandError(msg)
    if args.inputs is not None:
        return bulk.bulk_command(args)
    single_only = [
        option
        for option, given in (
            ("-o", args.output),
            ("--match-only", args.match_only),
            ("--estimate", args.estimate),
            ("--via batch", args.via == "batch"),
            ("--shard", args.shard),
            ("--cache", args.cache),
            ("--verdict-log", args.verdict_log),
            ("--learned-prefilter", args.learned_prefilter),
            ("--retrain-every", args.retrain_every),
            ("--max-wait", args.max_wait),
        )
        if given
    ]
    if single_only:
        verb = "goes" if len(single_only) == 1 else "go"
        msg = f"{', '.join(single_only)} {verb} with --inputs (a bulk run)."
        raise CommandError(msg)
    from langchain_tag.matching.profiles import profile_for  # noqa: PLC0415
    from langchain_tag.query_graph import QueryContext, build_query_graph  # noqa: PLC0415
    from langchain_tag.rules import Rulebook  # noqa: PLC0415
    from langchain_tag.usage import UsageCounter  # noqa: PLC0415

    rulebook = Rulebook.load(args.rulebook)
    if not rulebook.rules:
        raise CommandError(no_rules(args.rulebook, rulebook))
    text = _read_input(args.input)
    decision = decision_options(args)
    llm = model_from(args)
    from langchain_tag.cli.failures import failed_judgments  # noqa: PLC0415
    from langchain_tag.matching.verdicts import failure_kind, failure_reason  # noqa: PLC0415

    counter = UsageCounter()
    started = time.perf_counter()
    try:
        # Judgments failed under --on-error not_applicable: one line, at the end.
        with failed_judgments("run", "--on-error not_applicable"):
            output = build_query_graph().invoke(
                {"query": text, "rulebook": rulebook.model_dump(mode="json")},
                counter.watch({"max_concurrency": args.max_concurrency}),
                context=QueryContext(
                    judge_model=decision.get("llm", llm),
                    executor_model=llm,
                    questions_per_request=decision.get("questions_per_request", 200),
                    decision_threshold=decision.get("decision_threshold", 0.5),
                    k=args.k,
                    score_threshold=args.score_threshold,
                    logprobs=args.logprobs,
                    profile=args.profile or profile_for(rulebook),
                    template=args.template,
                    on_error=args.on_error,
                    max_concurrency=args.max_concurrency,
                ),
            )
    except Exception as error:
        if not model_failed(error):
            raise
        # JudgmentError's own message advises in the Python API's options: its
        # cause only, and the advice in this command's.
        if isinstance(error, JudgmentError):
            cause, on_error = error.cause, "--on-error not_applicable"
        else:  # only a judgment's failure can be flagged and gone past
            cause, on_error = describe_error(error), None
        what = advice(
            failure_kind(error),
            stronger_model="a stronger --model",
            retry_hint="try again later",
            on_error=on_error,
            reason=failure_reason(error),
        )
        msg = (
            f"no answer: the model failed after its retries ({cause}). "
            f"Nothing was assumed about any rule; {what}."
        )
        raise CommandError(msg) from error
    seconds = time.perf_counter() - started
    print(_format_run(output, len(rulebook), counter.usage, seconds))  # noqa: T201
    return 0


def _read_input(given: str) -> str:
    """The input: `given`, or standard input for "-"; never blank."""
    if given != "-":
        what = "the input"
        text = given
    else:
        what = STANDARD_INPUT
        # Read as bytes, decoded by the reader of every user's text: a locale's
        # decoding would turn a Latin-1 byte into a lone surrogate, or fail unnamed.
        raw = getattr(sys.stdin, "buffer", None)
        text = read_text(raw) if raw is not None else sys.stdin.read()
    if not text.strip():
        # Judging no text costs nothing, but executing nothing still pays a call,
        # and models answer nothing with nothing: a traceback, not an answer.
        fix = (
            "Pipe the text in, e.g. `tag run RULEBOOK - < input.txt`."
            if given == "-"
            else 'Pass the text to check, or "-" to read it from standard input.'
        )
        msg = f"{what} is empty or blank: there is nothing to match. {fix}"
        raise CommandError(msg)
    return text


def _format_run(
    output: Mapping[str, Any],
    n_rules: int,
    usage: TokenUsage,
    seconds: float,
) -> str:
    matches = output["matches"]
    lines = [f"matched {len(matches)} of {n_rules} rules:"]
    lines += [
        f"  {m['rule_id']:<28} "
        f"{'-' if m['score'] is None else format(m['score'], '.3f'):>6}  {m['name']}"
        for m in matches
    ] or ["  (none)"]
    answer = output["answer"]
    rendered = answer if isinstance(answer, str) else json.dumps(answer, indent=2)
    cost = output["cost"]
    if cost.get("failed"):
        lines.append(
            f"  ({cost['failed']} judgment(s) failed and were treated as not "
            "applicable: --on-error not_applicable)"
        )
    lines += [
        "",
        "answer:",
        rendered,
        "",
        (
            f"LLM calls: {cost['judgments']} judgments + {cost['executor_calls']} "
            f"execution; tokens: {usage.describe()}; {seconds:.2f} s"
        ),
    ]
    return "\n".join(lines)
