"""The `tag` command line, one module per command.

tag extract FILES... --domain D -o rulebook.json
tag run RULEBOOK "input"
tag demo [--sections TITLES] [--offline]
tag verdicts stats|export [LOG]
tag prefilter train RULEBOOK [LOG] -o MODEL

Each command module registers its options and imports what it runs only when it
runs, so `tag --help` loads neither LangGraph nor the judge. Other distributions add
commands as entry points in the `langchain_tag.commands` group, each a module with
the same `add_parser(commands)` (`tag eval` comes with langchain-tag-experiments).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import stat
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import entry_points
from types import ModuleType

from langchain_tag.cli import demo, extract, prefilter, run, verdicts
from langchain_tag.errors import (
    CommandError,
    ModelNotConfiguredError,
    RulebookError,
    Terminated,
)

COMMANDS_GROUP = "langchain_tag.commands"
"""The entry-point group of commands other distributions add to `tag`."""

ELSEWHERE = {
    "eval": "langchain-tag-experiments (the paper's evaluation harness): pip install "
    "langchain-tag-experiments, or `bash scripts/setup` in a checkout",
}
"""Commands of other distributions, and where to get them when not installed."""


def _plugins() -> list[ModuleType]:
    """The command modules other installed distributions register."""
    return [found.load() for found in entry_points(group=COMMANDS_GROUP)]


def build_parser() -> argparse.ArgumentParser:
    """The `tag` argument parser."""
    parser = argparse.ArgumentParser(
        prog="tag",
        description="Task-Aligned Retrieval: extract rules and retrieve them by "
        "applicability.",
    )
    from langchain_tag import __version__  # noqa: PLC0415

    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__ or 'unknown'}"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (extract, run, demo, verdicts, prefilter, *_plugins()):
        command.add_parser(commands)
    for name, where in ELSEWHERE.items():
        if name not in commands.choices:
            # Named, so that `tag eval` says where it comes from, not "invalid choice".
            absent = commands.add_parser(
                name, help=f"not installed: comes with {where.split(' ')[0]}"
            )
            absent.add_argument("rest", nargs=argparse.REMAINDER)
            absent.set_defaults(handler=functools.partial(_not_installed, name, where))
    return parser


def _not_installed(name: str, where: str, args: argparse.Namespace) -> int:
    del args
    msg = f"`tag {name}` is not installed here: it comes with {where}."
    raise CommandError(msg)


BROKEN_PIPE_STATUS = 141
"""The status when the reader of stdout went away (`tag verdicts export | head -1`):
128 + SIGPIPE, what a shell reports for any tool its closed pipe stopped."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `tag` command; returns the exit status.

    0 on success; 2 for a problem the user can fix, printed in one line; 130 when
    interrupted (Ctrl-C), 143 when terminated (SIGTERM), each with a line;
    `BROKEN_PIPE_STATUS` (141), silently, when stdout's reader stopped reading
    early; argparse's own 2 for a bad option.
    """
    try:
        status = _run(argv)
        # Written here, not at exit: a reader gone is then seen below, not by the
        # interpreter's last flush ("Exception ignored ... BrokenPipeError").
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_is_a_pipe():
            raise  # another pipe (a FIFO given as a file): not the reader leaving
        _discard_stdout()
        return BROKEN_PIPE_STATUS
    return status


def _stdout_is_a_pipe() -> bool:
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return True  # not a real file (a test's capture): it stands for the pipe
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


TERMINATED_STATUS = 128 + signal.SIGTERM


def _terminate(signum: int, frame: object) -> None:
    del signum, frame
    raise Terminated


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (a test calling `main`): leave it
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)

    try:
        with _sigterm_as_interrupt():
            return int(args.handler(args))
    except (
        CommandError,
        ModelNotConfiguredError,
        RulebookError,
        ValueError,
        ImportError,  # an extra not installed: its message names the install
    ) as error:
        print(f"tag {args.command}: error: {error}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt as interrupt:
        how = "terminated" if isinstance(interrupt, Terminated) else "interrupted"
        print(  # noqa: T201
            f"\ntag {args.command}: {how}; run the same command again to resume.",
            file=sys.stderr,
        )
        return TERMINATED_STATUS if isinstance(interrupt, Terminated) else 130


def _discard_stdout() -> None:
    """Point stdout at the null device, so what is still buffered goes nowhere.

    The standard remedy (Python docs, "Note on SIGPIPE"): the interpreter flushes
    stdout once more at exit, which would raise again on the closed pipe.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass  # not a real file (a test's capture): nothing is flushed to a pipe
