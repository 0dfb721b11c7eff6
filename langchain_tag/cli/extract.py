"""`tag extract FILES... -o rulebook.json`: documents to a verified rulebook.

`tag extract FILES... --estimate` prints what that would cost, calling no model.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from langchain_tag.cli import prices
from langchain_tag.cli._status import StatusLine
from langchain_tag.cli.errors import at_least, check_writable, model_failed, model_name
from langchain_tag.errors import (
    CommandError,
    DocumentError,
    RuleSchemaError,
    describe_error,
)

if TYPE_CHECKING:
    from langchain_core.documents import Document

    from langchain_tag.extraction import ExtractionReport
    from langchain_tag.rule_schemas import RuleSchema
    from langchain_tag.rules import Rulebook


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag extract` on the `tag` command's subparsers."""
    extract = commands.add_parser(
        "extract",
        help="extract a verified rulebook from instruction documents",
        description="Run the five extraction phases over PDF, HTML, DOCX, or UTF-8 "
        "text, Markdown or reStructuredText files (PDF, HTML and DOCX need the "
        "documents extra). Every file is loaded before any model call. Interrupted "
        "runs resume when re-run with the same arguments; after an edit only the "
        "sections that changed are sent again (in a PDF, the edited pages').",
    )
    extract.add_argument(
        "files",
        nargs="+",
        help="PDF (with a text layer), HTML, DOCX, or UTF-8 text, Markdown or RST "
        "files, by suffix",
    )
    extract.add_argument(
        "-o", "--output", help="rulebook JSON to write (required, but by --estimate)"
    )
    extract.add_argument(
        "--domain",
        default="instruction",
        help='what the documents govern, e.g. "PEP 8"',
    )
    extract.add_argument(
        "--model",
        type=model_name,
        help="model name for the default ChatOpenAI (else $TAG_MODEL)",
    )
    extract.add_argument(
        "--skip-phase",
        type=int,
        action="append",
        default=[],
        choices=range(1, 6),
        metavar="N",
        help="skip phase N (1-5), for ablations; repeatable",
    )
    extract.add_argument(
        "--checkpoint",
        default="default",
        help="SQLite file for resumable runs and the section cache "
        "(default .langchain-tag/extraction.sqlite)",
    )
    extract.add_argument(
        "--no-checkpoint", action="store_true", help="keep no checkpoint or cache"
    )
    extract.add_argument(
        "--max-concurrency",
        type=at_least(1),
        default=8,
        help="model calls in flight at most (default 8)",
    )
    extract.add_argument(
        "--max-section-tokens",
        type=at_least(1),
        default=1500,
        help="the longest section sent to the model in one call, in tokens "
        "(default 1500); longer sections are split",
    )
    extract.add_argument(
        "--max-pairs",
        metavar="N|none",
        help="phase 4 compares at most N rule pairs sharing a tag, the most similar "
        "when there are more (default 5000: at most ~625 calls plus one a tag); "
        "none: every pair, which grows with the square of the rules",
    )
    extract.add_argument(
        "--estimate",
        action="store_true",
        help="print the calls and tokens each phase would take (and dollars with "
        "--price-in/--price-out), as a run without stored answers; calls no model, "
        "needs no API key, writes nothing",
    )
    extract.add_argument(
        "--max-calls",
        type=at_least(0),
        default=DEFAULT_MAX_CALLS,
        help="estimate the run first (as --estimate does) and stop before any call "
        f"if it would make more model calls than this (default {DEFAULT_MAX_CALLS:,}"
        "; 0: no cap)",
    )
    prices.add_arguments(extract)
    extract.add_argument(
        "--faithfulness",
        choices=["corrected", "literal"],
        default="corrected",
        help="phase 5's check that a rule's source text is in the document: "
        "literal is the method's difflib windows as stated; corrected (default) "
        "also tries windows of the source's own length and where it aligns, so "
        "a short or lightly edited source is not refused for the window's size",
    )
    extract.add_argument(
        "--merge",
        choices=["duplicates", "preferred"],
        default="duplicates",
        help="phase-4 pairs merged into one rule: only duplicates (default, the "
        "method), or also pairs the model marked preferred_action merge",
    )
    extract.add_argument(
        "--schema",
        default="condition",
        metavar="NAME|FILE",
        help="the rule schema phase 3 writes: 'condition' (default: a condition the "
        "judge sees, an action the executor gets), 'nba' (the NBA matcher's "
        "applies_when, constraint, violation_check, does_not_apply_to, and an "
        "action), or a JSON Schema file whose string properties each have a "
        'description and "x-tag-side": "judge" or "executor" ("required" lists '
        "those the model must always write). The rulebook records it, and `tag "
        "run` judges its rules by their judge-side fields",
    )
    extract.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="write the rulebook even when model answers that could not be read "
        "left sections or spans without a rule (default: exit 2, write nothing)",
    )
    extract.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    extract.set_defaults(handler=extract_command)


def read_documents(paths: Sequence[str]) -> list[Document]:
    """Load the files as documents, with errors that name the file and the fix.

    All of them, before any model is made: a bad file costs nothing.
    """
    # pypdf logs what it meets in damaged files; a file it cannot read gets one
    # line of ours instead, and a file it could read needs none.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    return [_read_document(name) for name in paths]


def _read_document(name: str) -> Document:
    from langchain_tag.extraction.documents import load_document  # noqa: PLC0415

    try:
        return load_document(Path(name))
    except DocumentError as error:  # empty, scanned, encrypted, damaged, not UTF-8
        raise CommandError(str(error)) from None
    except FileNotFoundError:
        msg = f"{name}: no such file."
        raise CommandError(msg) from None
    except IsADirectoryError:
        msg = f"{name}: is a directory; pass the files in it (e.g. {name}/*.md)."
        raise CommandError(msg) from None
    except OSError as error:
        msg = f"{name}: cannot be read ({error.strerror})."
        raise CommandError(msg) from None


class Progress:
    """One status line per node on a terminal, one line per change otherwise."""

    def __init__(self, stream: TextIO) -> None:
        """Report to `stream` (normally stderr)."""
        self.status = StatusLine(stream)
        self.started = time.perf_counter()

    def __call__(self, node: str, done: int) -> None:
        """Record that `done` tasks of `node` have finished."""
        elapsed = time.perf_counter() - self.started
        self.status.show(f"[{elapsed:6.1f}s] {node}: {done} done", node)

    def close(self) -> None:
        """End the status line."""
        self.status.close()


DEFAULT_MAX_CALLS = 5_000
"""`tag extract --max-calls`: a run the estimate puts above this stops before its
first call (PEP 8 takes ~140 calls, the NBA agreement ~250)."""


def extract_command(args: argparse.Namespace) -> int:
    """Run `tag extract`."""
    from langchain_tag.extraction import ExtractionReport  # noqa: PLC0415

    prices.check(args)
    args.max_pairs = _max_pairs(args.max_pairs)
    if not args.estimate:
        if args.output is None:
            msg = (
                "-o/--output is required: the rulebook JSON to write (or pass "
                "--estimate to see what the extraction would cost first)."
            )
            raise CommandError(msg)
        check_writable(Path(args.output), example="rulebook.json", not_done="extracted")
    args.rule_schema = _schema(args.schema)
    documents = read_documents(args.files)
    if args.estimate:
        return _estimate(args, documents)
    if args.max_calls:
        _check_calls(args, documents)
    rulebook, stored = _extract(args, documents)
    report = ExtractionReport.model_validate(rulebook.diagnostics)
    if stored:
        # A finished run is returned as it was stored: its counts are not this run's.
        print(  # noqa: T201
            f"reused the finished extraction stored in {_checkpoint(args)} (same "
            "documents, domain, model and settings): this run made 0 LLM calls."
        )
    print(report.format(stored=stored))  # noqa: T201
    lost = " and ".join(_losses(report))
    problem = (
        f"{'incomplete' if len(rulebook) else 'no rule extracted'}: "
        f"{_unreadable(report)}, so {lost}."
        if lost
        else ""
    )
    if lost and not (args.allow_incomplete and len(rulebook)):
        msg = f"{problem} {_resume(args)}"
        if len(rulebook):
            msg += (
                f" Or pass --allow-incomplete to write the {len(rulebook)} rules kept."
            )
        msg += f" Nothing was written to {args.output}."
        raise CommandError(msg)
    try:
        rulebook.save(args.output)
    except OSError as error:
        msg = (
            f"-o {args.output}: cannot be written ({error.strerror}). Every answer is "
            "kept in the checkpoint: run again with another -o to write the rulebook "
            "without new model calls."
        )
        raise CommandError(msg) from error
    incomplete = f" (incomplete: {lost})" if lost else ""
    print(f"\nwrote {len(rulebook)} rules to {args.output}{incomplete}")  # noqa: T201
    if report.unreadable:
        # Written, but a re-run asks those answers again: say so.
        warning = problem or f"{_unreadable(report)}."
        print(  # noqa: T201
            f"tag extract: warning: {warning} {_resume(args)}", file=sys.stderr
        )
    return 0


def _extract(
    args: argparse.Namespace, documents: list[Document]
) -> tuple[Rulebook, bool]:
    """The rulebook, and whether it is a finished run's, returned as stored."""
    from langchain_tag.extraction import extract_rules  # noqa: PLC0415
    from langchain_tag.models import default_chat_model  # noqa: PLC0415

    llm = default_chat_model(model=args.model) if args.model else default_chat_model()
    progress = None if args.quiet else Progress(sys.stderr)
    stored: list[bool] = []  # extract_rules says when it returned a stored run
    try:
        rulebook = extract_rules(
            documents,
            llm=llm,
            domain=args.domain,
            skip_phases=args.skip_phase,
            checkpoint=None if args.no_checkpoint else args.checkpoint,
            max_concurrency=args.max_concurrency,
            on_progress=progress,
            on_stored=lambda: stored.append(True),
            **_settings(args),
        )
    except Exception as error:
        if not model_failed(error):
            raise
        kept = (
            "nothing was kept (--no-checkpoint): run again without it to make runs "
            "resumable"
            if args.no_checkpoint
            else f"every answer received so far is kept in {_checkpoint(args)}: run "
            "the same command again to resume where it stopped"
        )
        msg = (
            "extraction stopped: the model failed after its retries "
            f"({describe_error(error)}); {kept}."
        )
        raise CommandError(msg) from error
    finally:
        if progress is not None:
            progress.close()
    return rulebook, bool(stored)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `ExtractionSettings` the options give, for the run and its estimate."""
    settings: dict[str, Any] = {
        "max_section_tokens": args.max_section_tokens,
        "faithfulness_mode": args.faithfulness,
        "merge": args.merge,
        "rule_schema": args.rule_schema,
    }
    if args.max_pairs is not _DEFAULT:
        settings["max_pairs"] = args.max_pairs
    return settings


_DEFAULT = object()
"""`--max-pairs` not given: the library's default cap."""


def _max_pairs(text: str | None) -> object:
    """`--max-pairs`: an integer >= 1, None for "none" (no cap), or `_DEFAULT`."""
    if text is None:
        return _DEFAULT
    if text.strip().lower() == "none":
        return None
    value = int(text) if text.strip().isdigit() else 0
    if value < 1:
        msg = (
            f"--max-pairs must be an integer >= 1 (rule pairs phase 4 compares at "
            f"most), or none for no cap, got {text!r}."
        )
        raise CommandError(msg)
    return value


def _estimated(args: argparse.Namespace, documents: list[Document]) -> Any:
    """The `ExtractionEstimate` of this run; no model is made or called."""
    from langchain_tag.extraction.estimate import (  # noqa: PLC0415 - loads langgraph
        estimate_extraction,
    )

    token_prices, caching = prices.from_args(args)
    return estimate_extraction(
        documents,
        domain=args.domain,
        skip_phases=args.skip_phase,
        prices=token_prices,
        caching=caching,
        max_concurrency=args.max_concurrency,
        **_settings(args),
    )


def _check_calls(args: argparse.Namespace, documents: list[Document]) -> None:
    """Say what the run will cost, and stop it above `--max-calls`.

    Raises:
        CommandError: The estimate is above `--max-calls`; nothing was called.
    """
    found = _estimated(args, documents)
    usage = found.usage
    dollars = found.dollars()
    cost = f", ~${dollars:,.2f}" if dollars is not None else ""
    said = (
        f"estimate: ~{usage.calls:,} model calls, ~{usage.input_tokens or 0:,} "
        f"input tokens{cost} (--estimate shows each phase)"
    )
    if usage.calls > args.max_calls:
        msg = (
            f"{said}, more than --max-calls {args.max_calls:,}; nothing was called. "
            "Extract from fewer documents or sections, lower --max-pairs, or raise "
            "--max-calls (0: no cap)."
        )
        raise CommandError(msg)
    if not args.quiet:
        print(said, file=sys.stderr)  # noqa: T201


def _estimate(args: argparse.Namespace, documents: list[Document]) -> int:
    """Print what the extraction would spend; no model is made or called."""
    found = _estimated(args, documents)
    print(found.format())  # noqa: T201
    if args.output is not None:
        print(f"\n--estimate: nothing was written to {args.output}.")  # noqa: T201
    return 0


def _schema(spec: str) -> RuleSchema:
    """`--schema`: a built-in's name or a JSON Schema file, read before any call."""
    from langchain_tag.rule_schemas import rule_schema  # noqa: PLC0415

    try:
        return rule_schema(spec)
    except RuleSchemaError as error:
        raise CommandError(str(error)) from None


def _checkpoint(args: argparse.Namespace) -> str:
    from langchain_tag.extraction import DEFAULT_CHECKPOINT  # noqa: PLC0415

    return str(DEFAULT_CHECKPOINT if args.checkpoint == "default" else args.checkpoint)


def _losses(report: ExtractionReport) -> list[str]:
    """What unreadable model answers cost the rulebook; empty if nothing was lost.

    An unreadable phase-1 answer loses its section; unreadable phase-3 answers lose
    spans that re-extraction could not cover either. Other unreadable answers
    (relations, atomic units kept whole) lose no rule.
    """
    unreadable = report.unreadable
    if not unreadable:
        return []
    parts = []
    if sections := sum(unreadable.get("spans", {}).values()):
        parts.append(f"{sections} section(s) were not read")
    if spans := len(report.uncovered_after_recovery):
        parts.append(f"{spans} span(s) were left without a rule")
    if not parts and not report.rules:
        parts.append("no rule was kept")
    return parts


def _unreadable(report: ExtractionReport) -> str:
    """`N model answer(s) could not be read (phase: reason=n; ...)`."""
    found = report.unreadable
    answers = sum(n for problems in found.values() for n in problems.values())
    detail = "; ".join(
        f"{phase}: " + ", ".join(f"{k}={n}" for k, n in sorted(problems.items()))
        for phase, problems in found.items()
    )
    return f"{answers} model answer(s) could not be read ({detail})"


def _resume(args: argparse.Namespace) -> str:
    """How to get the answers that could not be read without paying twice."""
    if args.no_checkpoint:
        return (
            "Nothing was kept (--no-checkpoint): run again without it, so that a "
            "re-run asks only those answers again; or use a stronger --model."
        )
    return (
        "Run the same command again to ask only those again: the answers already "
        f"paid for are kept in {_checkpoint(args)}. If the same answers come back, "
        "use a stronger --model."
    )
