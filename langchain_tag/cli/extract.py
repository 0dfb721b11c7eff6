"""`tag extract FILES... -o rulebook.json`: documents to a verified rulebook."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from langchain_tag._text import describe_error, read_text
from langchain_tag.cli._status import StatusLine
from langchain_tag.cli.errors import (
    CommandError,
    at_least,
    check_writable,
    model_failed,
)

if TYPE_CHECKING:
    from langchain_core.documents import Document

    from langchain_tag.extraction import ExtractionReport
    from langchain_tag.rules import Rulebook


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag extract` on the `tag` command's subparsers."""
    extract = commands.add_parser(
        "extract",
        help="extract a verified rulebook from instruction documents",
        description="Run the five extraction phases over text, Markdown or "
        "reStructuredText files. Interrupted runs resume when re-run with the same "
        "arguments; after an edit only the changed sections are sent again.",
    )
    extract.add_argument("files", nargs="+", help="UTF-8 text, Markdown or RST files")
    extract.add_argument("-o", "--output", required=True, help="rulebook JSON to write")
    extract.add_argument(
        "--domain",
        default="instruction",
        help='what the documents govern, e.g. "PEP 8"',
    )
    extract.add_argument(
        "--model", help="model name for the default ChatOpenAI (else $TAG_MODEL)"
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
    extract.add_argument("--max-concurrency", type=at_least(1), default=8)
    extract.add_argument("--max-section-tokens", type=at_least(1), default=1500)
    extract.add_argument(
        "--faithfulness", choices=["corrected", "literal"], default="corrected"
    )
    extract.add_argument(
        "--merge",
        choices=["duplicates", "preferred"],
        default="duplicates",
        help="phase-4 pairs merged into one rule: only duplicates (default, the "
        "method), or also pairs the model marked preferred_action merge",
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
    """Read text files as documents, with errors that name the file and the fix."""
    from langchain_core.documents import Document  # noqa: PLC0415

    documents = []
    for name in paths:
        path = Path(name)
        try:
            text = read_text(path, what=name)
        except FileNotFoundError:
            msg = f"{name}: no such file."
            raise CommandError(msg) from None
        except IsADirectoryError:
            msg = f"{name}: is a directory; pass the files in it (e.g. {name}/*.md)."
            raise CommandError(msg) from None
        except OSError as error:
            msg = f"{name}: cannot be read ({error.strerror})."
            raise CommandError(msg) from None
        if not text.strip():
            msg = f"{name}: the file is empty."
            raise CommandError(msg)
        documents.append(Document(page_content=text, metadata={"source": str(path)}))
    return documents


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


def extract_command(args: argparse.Namespace) -> int:
    """Run `tag extract`."""
    from langchain_tag.extraction import ExtractionReport  # noqa: PLC0415

    check_writable(Path(args.output), example="rulebook.json", not_done="extracted")
    documents = read_documents(args.files)
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
            max_section_tokens=args.max_section_tokens,
            faithfulness_mode=args.faithfulness,
            merge=args.merge,
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
