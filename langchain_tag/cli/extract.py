"""`tag extract FILES... -o rulebook.json`: documents to a verified rulebook."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from langchain_tag._text import describe_error
from langchain_tag.cli.errors import CommandError, at_least, model_failed

if TYPE_CHECKING:
    from langchain_core.documents import Document


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
    extract.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    extract.set_defaults(handler=extract_command)


def read_documents(paths: Sequence[str]) -> list[Document]:
    """Read text files as documents, with errors that name the file and the fix."""
    from langchain_core.documents import Document  # noqa: PLC0415

    from langchain_tag.rules import wide_encoding  # noqa: PLC0415

    documents = []
    for name in paths:
        path = Path(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            msg = f"{name}: no such file."
            raise CommandError(msg) from None
        except IsADirectoryError:
            msg = f"{name}: is a directory; pass the files in it (e.g. {name}/*.md)."
            raise CommandError(msg) from None
        except OSError as error:
            msg = f"{name}: cannot be read ({error.strerror})."
            raise CommandError(msg) from None
        wide = wide_encoding(raw)
        if wide is not None:
            msg = (
                f"{name}: {wide} text, not UTF-8. Convert it first, e.g. `iconv -f "
                f"{wide} -t utf-8 {name} > {path.stem}.utf8{path.suffix}`."
            )
            raise CommandError(msg)
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as error:
            msg = (
                f"{name}: not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
                f"{error.start}). Convert it first, e.g. `iconv -f latin1 -t utf-8 "
                f"{name} > {path.stem}.utf8{path.suffix}`; PDFs and word-processor "
                "files need a LangChain document loader and the Python API."
            )
            raise CommandError(msg) from None
        if "\x00" in text:
            msg = (
                f"{name}: contains NUL bytes (at offset {text.index(chr(0))}), so it "
                "is not a text file; extract from its text, e.g. with a LangChain "
                "document loader and the Python API."
            )
            raise CommandError(msg)
        if not text.strip():
            msg = f"{name}: the file is empty."
            raise CommandError(msg)
        documents.append(Document(page_content=text, metadata={"source": str(path)}))
    return documents


def check_writable(path: Path) -> None:
    """Refuse an output path that cannot be written, before any model call."""
    problem = None
    if path.is_dir():
        problem = "is a directory; name the rulebook file, e.g. " + str(
            path / "rulebook.json"
        )
    else:
        parent = path.parent
        existing = next(p for p in (parent, *parent.parents) if p.exists())
        if not existing.is_dir():
            problem = f"cannot be created: {existing} is not a directory"
        else:
            try:
                with tempfile.NamedTemporaryFile(dir=existing, prefix=".tag-check-"):
                    pass
            except OSError as error:
                problem = f"cannot be written ({error.strerror}); choose another path"
    if problem is not None:
        msg = f"-o {path}: {problem}. Nothing was extracted."
        raise CommandError(msg)


class Progress:
    """One status line per node on a terminal, one line per change otherwise."""

    def __init__(self, stream: TextIO) -> None:
        """Report to `stream` (normally stderr)."""
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.perf_counter()
        self.last = ""

    def __call__(self, node: str, done: int) -> None:
        """Record that `done` tasks of `node` have finished."""
        elapsed = time.perf_counter() - self.started
        line = f"[{elapsed:6.1f}s] {node}: {done} done"
        if self.tty:
            self.stream.write(f"\r\033[K{line}")
        elif node != self.last:
            self.stream.write(line + "\n")
        self.last = node
        self.stream.flush()

    def close(self) -> None:
        """End the status line."""
        if self.tty:
            self.stream.write("\n")


def extract_command(args: argparse.Namespace) -> int:
    """Run `tag extract`."""
    from langchain_tag.extraction import (  # noqa: PLC0415 - loads langgraph
        DEFAULT_CHECKPOINT,
        ExtractionReport,
        extract_rules,
    )
    from langchain_tag.models import default_chat_model  # noqa: PLC0415

    check_writable(Path(args.output))
    documents = read_documents(args.files)
    llm = default_chat_model(model=args.model) if args.model else default_chat_model()
    progress = None if args.quiet else Progress(sys.stderr)
    try:
        rulebook = extract_rules(
            documents,
            llm=llm,
            domain=args.domain,
            skip_phases=args.skip_phase,
            checkpoint=None if args.no_checkpoint else args.checkpoint,
            max_concurrency=args.max_concurrency,
            on_progress=progress,
            max_section_tokens=args.max_section_tokens,
            faithfulness_mode=args.faithfulness,
            merge=args.merge,
        )
    except Exception as error:
        if not model_failed(error):
            raise
        where = DEFAULT_CHECKPOINT if args.checkpoint == "default" else args.checkpoint
        kept = (
            "nothing was kept (--no-checkpoint): run again without it to make runs "
            "resumable"
            if args.no_checkpoint
            else f"every answer received so far is kept in {where}: run the same "
            "command again to resume where it stopped"
        )
        msg = (
            "extraction stopped: the model failed after its retries "
            f"({describe_error(error)}); {kept}."
        )
        raise CommandError(msg) from error
    finally:
        if progress is not None:
            progress.close()
    try:
        rulebook.save(args.output)
    except OSError as error:
        msg = (
            f"-o {args.output}: cannot be written ({error.strerror}). Every answer is "
            "kept in the checkpoint: run again with another -o to write the rulebook "
            "without new model calls."
        )
        raise CommandError(msg) from error
    print(ExtractionReport.model_validate(rulebook.diagnostics).format())  # noqa: T201
    print(f"\nwrote {len(rulebook)} rules to {args.output}")  # noqa: T201
    return 0
