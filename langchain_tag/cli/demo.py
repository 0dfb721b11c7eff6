"""`tag demo`: the whole method on PEP 8 and a few code snippets (see `demo`)."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from langchain_tag.cli.errors import at_least, model_name
from langchain_tag.errors import CommandError, LocalServerError

if TYPE_CHECKING:
    from langchain_tag.extraction.sectioning import Section


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag demo` on the `tag` command's subparsers."""
    parser = commands.add_parser(
        "demo",
        help="run the whole method on PEP 8 and a few code snippets",
        description="Extract rules from PEP 8 (bundled), store them in embedded "
        "Chroma, match a few code snippets and execute with the matched actions, "
        "printing the rules, matches with scores, answers, calls and time. Uses the "
        "model configured by OPENAI_API_KEY / OPENAI_BASE_URL; with neither set it "
        "runs offline on SmolLM2-135M, which demonstrates the pipeline but judges "
        "poorly. When extraction yields no rules, matching and execution run on the "
        "curated PEP 8 rulebook shipped with the package (written by hand, not "
        "extracted), and the output says so.",
    )
    parser.add_argument(
        "--sections",
        help='comma-separated PEP 8 section titles, or "all" (default: Imports, '
        "Programming Recommendations; Imports alone with the offline model)",
    )
    parser.add_argument(
        "--max-sections",
        type=at_least(1),
        help="extract from at most N of those sections",
    )
    parser.add_argument(
        "--rulebook",
        help="match against this rulebook (e.g. written by `tag extract`) instead of "
        "extracting one",
    )
    parser.add_argument(
        "--workdir",
        help="rulebook, extraction checkpoint and Chroma database (default "
        ".langchain-tag/demo)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use the local SmolLM2 even when a model is configured",
    )
    parser.add_argument(
        "--local-server",
        action="store_true",
        help="run the offline SmolLM2 behind llama.cpp's OpenAI-compatible server "
        "(the `llama-cpp` extra) instead of in this process; implies --offline",
    )
    parser.add_argument(
        "--model",
        type=model_name,
        help="model name for the default ChatOpenAI (else $TAG_MODEL)",
    )
    parser.add_argument(
        "--no-logprobs",
        action="store_true",
        help="do not ask the configured model for logprobs (matches get no score)",
    )
    parser.add_argument(
        "--prefilter-k",
        type=at_least(1),
        default=5,
        help="rules shortlisted by similarity per snippet, then judged (default 5)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=at_least(1),
        default=4,
        help="model calls in flight at most (default 4)",
    )
    parser.set_defaults(handler=demo_command)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _interrupts_stop(stop: Callable[[], None] | None) -> Iterator[None]:
    """On Ctrl-C or SIGTERM, end the local model before unwinding.

    Otherwise the calls in flight wait for it to finish generating (a server
    ignores a client's interruption), and a SIGTERM would leave a server running.
    """
    if stop is None:
        yield
        return

    def interrupt(*_: object) -> None:
        stop()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def demo_command(args: argparse.Namespace) -> int:
    """Run `tag demo` with parsed arguments; returns the exit status."""
    from langchain_tag.demo import (  # noqa: PLC0415 - loads the judge
        DEFAULT_SECTIONS,
        DEFAULT_WORKDIR,
        OFFLINE_SECTIONS,
        demo_models,
        pep8_sections,
        run_demo,
    )
    from langchain_tag.rules import Rulebook  # noqa: PLC0415

    rulebook = Rulebook.load(args.rulebook) if args.rulebook else None

    def chosen(titles: str) -> list[Section]:
        wanted = None if titles.strip().lower() == "all" else titles.split(",")
        return pep8_sections(wanted, args.max_sections)

    # Checked before any model starts; the default depends on the model.
    given = chosen(args.sections) if args.sections else None
    try:
        with (
            demo_models(
                offline=args.offline,
                model=args.model,
                logprobs=not args.no_logprobs,
                local_server=args.local_server,
            ) as models,
            _interrupts_stop(models.stop),
        ):
            default = OFFLINE_SECTIONS if models.offline else DEFAULT_SECTIONS
            sections = given or chosen(",".join(default))
            run_demo(
                models,
                workdir=args.workdir or DEFAULT_WORKDIR,
                sections=sections,
                rulebook=rulebook,
                prefilter_k=args.prefilter_k,
                max_concurrency=args.max_concurrency,
            )
    except (ImportError, LocalServerError) as error:
        raise CommandError(str(error)) from error
    return 0
