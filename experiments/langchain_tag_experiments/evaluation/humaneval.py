"""HumanEval + PEP 8 scoring: run `check` in a subprocess, and score with pylint.

Model-written code is untrusted, so it never runs in this process: each check runs
in a fresh `python -I` subprocess in its own temporary directory and process group,
with a wall-clock timeout (the whole group is killed when it passes) and a cap on
its address space. Pylint also runs in a subprocess, with its default rules except
missing-final-newline (C0304) and trailing-newlines (C0305), as the method says; an
answer pylint cannot rate (blank, unparseable) scores 0 (`UNPARSEABLE_SCORE`).
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from langchain_tag._processes import stop_process_group
from langchain_tag._text import strip_thinking
from langchain_tag_experiments.evaluation.datasets import HumanEvalProblem

PYLINT_DISABLED = ("C0304", "C0305")
"""missing-final-newline and trailing-newlines: left out of the score."""

_STDERR_TAIL = 2000
_PYLINT_TIMEOUT = 120.0

# Sets the address-space cap, then runs the program as __main__. Passed with -c so
# that the program file holds exactly the code under test.
_BOOTSTRAP = """\
import runpy, sys
try:
    import resource
    limit = int(sys.argv[2]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
except (ImportError, ValueError, OSError):
    pass
sys.argv = sys.argv[1:2]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# A fence's info string (language) is the rest of its opening line; an output cut
# off before the closing fence keeps everything after the opening one.
_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)(?:```|\Z)", re.DOTALL)
_DEF = re.compile(r"^\s*(?:async\s+)?def ", re.MULTILINE)
_PYTHON_TAGS = frozenset({"", "python", "python3", "py"})


class CheckResult(BaseModel):
    """The outcome of running one problem's `check` on a completion."""

    model_config = ConfigDict(frozen=True)

    passed: bool
    error: str | None = None
    """Why it failed: the tail of stderr (a traceback, usually), or the timeout."""
    seconds: float
    timed_out: bool = False


def extract_code(model_output: str) -> str:
    """The Python code in a model's answer: a fenced block, or the bare text.

    Reasoning in `<think>` blocks is dropped. Among fenced blocks tagged Python (or
    untagged), the first that defines a function wins, else the first of them; an
    unclosed fence (a cut-off answer) runs to the end. Without a fence, the whole
    answer is taken as code.
    """
    text = strip_thinking(model_output)
    blocks: list[str] = [
        body
        for tag, body in _FENCE.findall(text)
        if tag.strip().lower() in _PYTHON_TAGS
    ]
    if not blocks:
        return text.strip("\n") + "\n"
    chosen = next((b for b in blocks if _DEF.search(b)), blocks[0])
    return chosen.rstrip() + "\n"


def check_program(problem: HumanEvalProblem, completion_code: str) -> str:
    """The program that checks `completion_code`: prompt, completion, test, check.

    The completion follows the prompt, so it may be the function body that
    continues the prompt (HumanEval's convention) or complete code that defines
    the entry point again (as an executor asked for the full function writes).
    """
    return (
        f"{problem.prompt}\n{completion_code}\n\n{problem.test}\n\n"
        f"check({problem.entry_point})\n"
    )


@dataclass(frozen=True)
class _Run:
    """A finished (or killed) subprocess: exit status, or None if it timed out."""

    returncode: int | None
    seconds: float
    stdout: str
    stderr: str


def _run(
    name: str, code: str, argv: Callable[[Path, Path], list[str]], timeout: float
) -> _Run:
    """Run `argv(directory, file)` on `code`, kept as `name` in a fresh directory.

    The child leads its own session, and the whole group is killed when it ends or
    times out. Its output goes to files rather than pipes, so a child that prints
    without end cannot block.
    """
    with tempfile.TemporaryDirectory(prefix="tag-eval-") as directory:
        cwd = Path(directory)
        (cwd / name).write_text(code, encoding="utf-8")
        started = time.perf_counter()
        with (
            (cwd / "stdout.txt").open("wb") as stdout,
            (cwd / "stderr.txt").open("wb") as stderr,
        ):
            # argv is ours; the code under test is a file it names.
            process = subprocess.Popen(  # noqa: S603
                argv(cwd, cwd / name),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
            try:
                returncode: int | None = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                stop_process_group(process, grace=0)
        seconds = time.perf_counter() - started
        stdout_text, stderr_text = (
            (cwd / output).read_text(encoding="utf-8", errors="replace")
            for output in ("stdout.txt", "stderr.txt")
        )
        return _Run(returncode, seconds, stdout_text, stderr_text)


def run_check(
    problem: HumanEvalProblem,
    completion_code: str,
    timeout: float = 10.0,
    *,
    memory_limit_mb: int = 2048,
) -> CheckResult:
    """Run the problem's `check(entry_point)` on the completion, in a subprocess.

    Args:
        problem: The HumanEval problem.
        completion_code: The body continuing the prompt, or complete code (see
            `check_program`); `extract_code` gets it from a model's answer.
        timeout: Wall-clock seconds before the process group is killed.
        memory_limit_mb: Address-space cap of the subprocess (where supported).

    Returns:
        Passed iff the program exits with status 0 within the timeout.
    """

    def argv(_directory: Path, program: Path) -> list[str]:
        limit = str(memory_limit_mb)
        return [sys.executable, "-I", "-c", _BOOTSTRAP, str(program), limit]

    run = _run("program.py", check_program(problem, completion_code), argv, timeout)
    if run.returncode is None:
        return CheckResult(
            passed=False,
            error=f"timed out after {timeout:g} s",
            seconds=run.seconds,
            timed_out=True,
        )
    if run.returncode == 0:
        return CheckResult(passed=True, seconds=run.seconds)
    tail = run.stderr.strip()[-_STDERR_TAIL:]
    return CheckResult(
        passed=False,
        error=tail or f"exited with status {run.returncode}",
        seconds=run.seconds,
    )


async def arun_check(
    problem: HumanEvalProblem,
    completion_code: str,
    timeout: float = 10.0,
    *,
    memory_limit_mb: int = 2048,
) -> CheckResult:
    """`run_check` in a worker thread, without blocking the event loop."""
    return await asyncio.to_thread(
        run_check, problem, completion_code, timeout, memory_limit_mb=memory_limit_mb
    )


def _pylint_argv(directory: Path, module: Path) -> list[str]:
    rcfile = directory / "empty.pylintrc"  # no user or project configuration
    rcfile.write_text("", encoding="utf-8")
    return [
        sys.executable,
        "-m",
        "pylint",
        f"--rcfile={rcfile}",
        "--persistent=n",
        "--jobs=1",
        "--output-format=json2",
        f"--disable={','.join(PYLINT_DISABLED)}",
        str(module),
    ]


UNPARSEABLE_SCORE = 0.0
"""The method's pylint score of an answer pylint cannot rate: it counts as 0."""

_UNRATABLE = frozenset({"syntax-error", "astroid-error", "parse-error", "fatal"})
"""Pylint message symbols saying the module could not be parsed or analysed."""


def _parses(code: str) -> bool:
    """Whether `code` is Python this interpreter (and so pylint) can parse."""
    with warnings.catch_warnings():
        # Invalid escape sequences and the like warn; they are not parse errors.
        warnings.simplefilter("ignore")
        try:
            ast.parse(code, filename="solution.py")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            # ValueError: NUL bytes; the others: nesting too deep to parse.
            return False
    return True


def _report_score(report: object) -> float | None:
    """The score of a pylint JSON report; None if it rates nothing.

    None when the report has no numeric score (pylint's rating failed), or a
    message saying the module could not be parsed or analysed.
    """
    if not isinstance(report, dict):
        return None
    messages = report.get("messages")
    if isinstance(messages, list) and any(
        isinstance(m, dict)
        and (m.get("symbol") in _UNRATABLE or m.get("type") == "fatal")
        for m in messages
    ):
        return None
    statistics = report.get("statistics")
    score = statistics.get("score") if isinstance(statistics, dict) else None
    if isinstance(score, bool) or not isinstance(score, int | float):
        return None  # e.g. "An exception occurred while rating: ..."
    if not math.isfinite(score):
        return None
    return max(0.0, float(score))


def pylint_score(code: str, *, unparseable_score: float = UNPARSEABLE_SCORE) -> float:
    """Pylint's score of `code` (0-10), default rules minus C0304 and C0305.

    As the method counts them, answers pylint cannot rate score 0 and stay in the
    mean (`unparseable_score`): blank code (no answer, which pylint would rate 10),
    code that does not parse (a syntax error, NUL bytes; checked with `ast.parse`
    before pylint runs), and a report with no usable score (a syntax-error or fatal
    message, or a rating that failed). A score below 0 (a custom evaluation
    formula) counts as 0.

    Args:
        code: The answer's Python source.
        unparseable_score: The score of such answers; the default 0 follows the
            method. `math.nan` marks them instead, for a caller that leaves them
            out of its mean (the harness's behaviour before this setting).

    Raises:
        RuntimeError: Pylint could not run: it timed out, or printed no report at
            all (not installed, a usage error, a crash). These say nothing about
            the answer, so they are not scored.
    """
    if not code.strip() or not _parses(code):
        return unparseable_score
    run = _run("solution.py", code, _pylint_argv, _PYLINT_TIMEOUT)
    if run.returncode is None:
        msg = f"pylint did not finish within {_PYLINT_TIMEOUT:g} s"
        raise RuntimeError(msg)
    try:
        report = json.loads(run.stdout)
    except ValueError:
        # A usage error or a crash (exit status 32 and up) prints no report.
        msg = (
            f"pylint gave no report (exit status {run.returncode}): "
            f"{run.stderr.strip()[-_STDERR_TAIL:] or run.stdout[:_STDERR_TAIL]}"
        )
        raise RuntimeError(msg) from None
    score = _report_score(report)
    return unparseable_score if score is None else score


async def apylint_score(
    code: str, *, unparseable_score: float = UNPARSEABLE_SCORE
) -> float:
    """`pylint_score` in a worker thread, without blocking the event loop."""
    return await asyncio.to_thread(
        pylint_score, code, unparseable_score=unparseable_score
    )
