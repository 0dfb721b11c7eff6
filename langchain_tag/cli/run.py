"""`tag run RULEBOOK "input"`: match the input, then execute the matched actions."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain_tag._text import STANDARD_INPUT, describe_error, read_text
from langchain_tag.cli.errors import CommandError, at_least, model_failed, probability

if TYPE_CHECKING:
    from langchain_core.callbacks import UsageMetadataCallbackHandler

    from langchain_tag.rules import Rulebook


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag run` on the `tag` command's subparsers."""
    run = commands.add_parser(
        "run",
        help="match an input against a rulebook and execute the matched actions",
        description="Judge every rule of the rulebook against the input (one LLM "
        "call each, the actions withheld), then answer with only the matched actions.",
    )
    run.add_argument("rulebook", help="rulebook JSON written by `tag extract`")
    run.add_argument("input", help='the input text, or "-" to read standard input')
    run.add_argument(
        "--model", help="model name for the default ChatOpenAI (else $TAG_MODEL)"
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
        "--profile", default="condition", help="rule-schema profile (condition, nba)"
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
    run.add_argument("--max-concurrency", type=at_least(1), default=8)
    run.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Run `tag run`."""
    from langchain_core.callbacks import UsageMetadataCallbackHandler  # noqa: PLC0415

    from langchain_tag.models import default_chat_model  # noqa: PLC0415
    from langchain_tag.query_graph import QueryContext, build_query_graph  # noqa: PLC0415
    from langchain_tag.rules import Rulebook  # noqa: PLC0415

    rulebook = Rulebook.load(args.rulebook)
    if not rulebook.rules:
        raise CommandError(_no_rules(args.rulebook, rulebook))
    text = _read_input(args.input)
    llm = default_chat_model(model=args.model) if args.model else default_chat_model()
    from langchain_tag.cli._warnings import failed_judgments  # noqa: PLC0415
    from langchain_tag.matching.verdicts import (  # noqa: PLC0415
        JudgmentError,
        advice,
        failure_kind,
    )

    usage = UsageMetadataCallbackHandler()
    started = time.perf_counter()
    try:
        # Judgments failed under --on-error not_applicable: one line, at the end.
        with failed_judgments("run", "--on-error not_applicable"):
            output = build_query_graph().invoke(
                {"query": text, "rulebook": rulebook.model_dump(mode="json")},
                {"callbacks": [usage], "max_concurrency": args.max_concurrency},
                context=QueryContext(
                    judge_model=llm,
                    k=args.k,
                    score_threshold=args.score_threshold,
                    logprobs=args.logprobs,
                    profile=args.profile,
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
        )
        msg = (
            f"no answer: the model failed after its retries ({cause}). "
            f"Nothing was assumed about any rule; {what}."
        )
        raise CommandError(msg) from error
    seconds = time.perf_counter() - started
    print(_format_run(output, len(rulebook), usage, seconds))  # noqa: T201
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


def _no_rules(path: str, rulebook: Rulebook) -> str:
    """Why a rulebook without rules is refused: how it was made, what to do."""
    sources = ", ".join(d.source or d.document_id for d in rulebook.documents)
    made = (
        f"`tag extract` wrote it from {sources} and kept no rule; its extraction "
        "report (the file's diagnostics) says why. Re-run `tag extract` on the "
        "documents that state your rules"
        if sources
        else f"Add rules to it, or extract them with `tag extract DOCUMENTS -o {path}`"
    )
    return f"{path}: the rulebook holds no rules, so there is nothing to match. {made}."


def _format_run(
    output: Mapping[str, Any],
    n_rules: int,
    usage: UsageMetadataCallbackHandler,
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
    tokens_in = sum(u.get("input_tokens", 0) for u in usage.usage_metadata.values())
    tokens_out = sum(u.get("output_tokens", 0) for u in usage.usage_metadata.values())
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
            f"execution; tokens: {tokens_in} in, {tokens_out} out; {seconds:.2f} s"
        ),
    ]
    return "\n".join(lines)
