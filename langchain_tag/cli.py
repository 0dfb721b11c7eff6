"""The `tag` command line.

tag extract FILES... --domain D -o rulebook.json
tag run RULEBOOK "input"
tag eval nba|obliqa|humaneval|all [--offline] [--limit N] [--out DIR]
tag demo [--sections TITLES] [--offline]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from langchain_core.documents import Document

from langchain_tag.demo import add_demo_parser
from langchain_tag.evaluation.command import add_eval_parser
from langchain_tag.matching import JudgmentError, RetryPolicy
from langchain_tag.models import ModelNotConfiguredError, default_chat_model
from langchain_tag.rules import Rulebook, RulebookError, wide_encoding

if TYPE_CHECKING:
    from langchain_core.callbacks import UsageMetadataCallbackHandler


class CommandError(Exception):
    """A problem the user can fix; printed without a traceback."""


def read_documents(paths: Sequence[str]) -> list[Document]:
    """Read text files as documents, with errors that name the file and the fix."""
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


def _model_failed(error: Exception) -> bool:
    """Whether `error` is the model provider failing, after the retries."""
    return (
        isinstance(error, JudgmentError)
        or RetryPolicy().is_transient(error)
        or getattr(error, "status_code", None) is not None
    )


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _extract(args: argparse.Namespace) -> int:
    from langchain_tag.extraction import (  # noqa: PLC0415 - loads langgraph
        DEFAULT_CHECKPOINT,
        extract_rules,
    )

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
        )
    except Exception as error:
        if not _model_failed(error):
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
            f"({_describe(error)}); {kept}."
        )
        raise CommandError(msg) from error
    finally:
        if progress is not None:
            progress.close()
    rulebook.save(args.output)
    from langchain_tag.extraction import ExtractionReport  # noqa: PLC0415

    print(ExtractionReport.model_validate(rulebook.diagnostics).format())  # noqa: T201
    print(f"\nwrote {len(rulebook)} rules to {args.output}")  # noqa: T201
    return 0


def _run(args: argparse.Namespace) -> int:
    from langchain_core.callbacks import UsageMetadataCallbackHandler  # noqa: PLC0415

    from langchain_tag.query_graph import QueryContext, build_query_graph  # noqa: PLC0415

    rulebook = Rulebook.load(args.rulebook)
    text = sys.stdin.read() if args.input == "-" else args.input
    llm = default_chat_model(model=args.model) if args.model else default_chat_model()
    usage = UsageMetadataCallbackHandler()
    started = time.perf_counter()
    try:
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
            ),
        )
    except Exception as error:
        if not _model_failed(error):
            raise
        msg = (
            f"no answer: the model failed after its retries ({_describe(error)}). "
            "Nothing was assumed about any rule; try again later."
        )
        raise CommandError(msg) from error
    seconds = time.perf_counter() - started
    print(_format_run(output, len(rulebook), usage, seconds))  # noqa: T201
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    """The `tag` argument parser."""
    parser = argparse.ArgumentParser(
        prog="tag",
        description="Task-Aligned Retrieval: extract rules and retrieve them by "
        "applicability.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
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
    extract.add_argument("--max-concurrency", type=int, default=8)
    extract.add_argument("--max-section-tokens", type=int, default=1500)
    extract.add_argument(
        "--faithfulness", choices=["corrected", "literal"], default="corrected"
    )
    extract.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    extract.set_defaults(handler=_extract)

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
    run.add_argument("-k", type=int, help="execute with at most K matched rules")
    run.add_argument("--score-threshold", type=float)
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
    run.add_argument("--max-concurrency", type=int, default=8)
    run.set_defaults(handler=_run)
    add_eval_parser(commands)
    add_demo_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `tag` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (CommandError, ModelNotConfiguredError, RulebookError, ValueError) as error:
        print(f"tag {args.command}: error: {error}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt:
        print(  # noqa: T201
            f"\ntag {args.command}: interrupted; run the same command again to resume.",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
