"""HumanEval's pylint score: answers pylint cannot rate score 0, as the method counts.

Blank code, code that does not parse, and a pylint report without a usable score
all get `unparseable_score` (default 0); only pylint failing to run at all (no
report) raises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_tag_experiments.evaluation import humaneval
from langchain_tag_experiments.evaluation.humaneval import (
    UNPARSEABLE_SCORE,
    apylint_score,
    pylint_score,
)

CLEAN = '''"""Arithmetic helpers."""


def add(first: int, second: int) -> int:
    """Return the sum of two integers."""
    return first + second
'''

UNPARSEABLE = [
    "def add(a, b:\n    return a + b\n",  # syntax error
    "def add(a, b):\nreturn a + b\n",  # indentation error
    "def add(a, b):\n\treturn a\n        return b\n",  # inconsistent dedent
    "x = 1\x00\n",  # NUL byte: ValueError from the parser, not SyntaxError
    "s = '\\N{NO SUCH CHARACTER NAME}'\n",  # a bad escape is a syntax error
    "x = " + "(" * 300 + ")" * 300 + "\n",  # nesting too deep for the parser
]


@pytest.fixture
def no_pylint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if pylint is started."""

    def refuse(*args: Any) -> None:
        pytest.fail(f"pylint ran: {args[:2]}")

    monkeypatch.setattr(humaneval, "_run", refuse)


def _fake_pylint(
    monkeypatch: pytest.MonkeyPatch, stdout: str, returncode: int | None = 0
) -> None:
    def run(
        name: str, code: str, argv: Callable[[Path, Path], list[str]], timeout: float
    ) -> Any:
        return humaneval._Run(returncode, 0.1, stdout, "Traceback: pylint crashed")

    monkeypatch.setattr(humaneval, "_run", run)


def _report(score: object, *messages: dict[str, str]) -> str:
    return json.dumps({"messages": list(messages), "statistics": {"score": score}})


def test_the_default_follows_the_method() -> None:
    assert UNPARSEABLE_SCORE == 0.0


@pytest.mark.usefixtures("no_pylint")
@pytest.mark.parametrize("code", ["", "   \n\n\t\n"], ids=["empty", "blank"])
def test_empty_code_scores_zero_without_pylint(code: str) -> None:
    assert pylint_score(code) == 0.0


@pytest.mark.usefixtures("no_pylint")
@pytest.mark.parametrize("code", UNPARSEABLE, ids=lambda c: repr(c)[:24])
def test_code_that_does_not_parse_scores_zero_without_pylint(code: str) -> None:
    assert pylint_score(code) == 0.0


def test_a_syntax_error_scores_zero_end_to_end() -> None:
    # With pylint really run on a clean function beside it: only parsing decides.
    assert pylint_score(CLEAN) == 10.0
    assert pylint_score(CLEAN + "\ndef broken(:\n    pass\n") == 0.0


@pytest.mark.parametrize(
    "report",
    [
        _report("An exception occurred while rating: division by zero"),
        _report(None),
        json.dumps({"messages": []}),
        _report(7.5, {"type": "error", "symbol": "syntax-error"}),
        _report(7.5, {"type": "fatal", "symbol": "astroid-error"}),
        _report(math.nan),
    ],
    ids=["rating-failed", "null", "no-statistics", "syntax", "fatal", "nan"],
)
def test_a_report_without_a_usable_score_scores_zero(
    monkeypatch: pytest.MonkeyPatch, report: str
) -> None:
    _fake_pylint(monkeypatch, report, returncode=2)
    assert pylint_score(CLEAN) == 0.0


def test_a_negative_score_counts_as_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pylint(monkeypatch, _report(-12.5))
    assert pylint_score(CLEAN) == 0.0
    _fake_pylint(monkeypatch, _report(8.25))
    assert pylint_score(CLEAN) == 8.25


@pytest.mark.parametrize(
    ("stdout", "returncode", "message"),
    [
        ("", 32, "pylint gave no report"),
        ("", None, "did not finish"),
    ],
    ids=["crash", "timeout"],
)
def test_pylint_failing_to_run_still_raises(
    monkeypatch: pytest.MonkeyPatch, stdout: str, returncode: int | None, message: str
) -> None:
    _fake_pylint(monkeypatch, stdout, returncode)
    with pytest.raises(RuntimeError, match=message):
        pylint_score(CLEAN)


def test_unparseable_score_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert math.isnan(pylint_score("", unparseable_score=math.nan))
    assert math.isnan(pylint_score(UNPARSEABLE[0], unparseable_score=math.nan))
    _fake_pylint(monkeypatch, _report("An exception occurred while rating"))
    assert pylint_score(CLEAN, unparseable_score=-1.0) == -1.0
    _fake_pylint(monkeypatch, _report(9.0))
    assert pylint_score(CLEAN, unparseable_score=math.nan) == 9.0


@pytest.mark.usefixtures("no_pylint")
async def test_apylint_score_scores_unparseable_code_zero() -> None:
    assert await apylint_score(UNPARSEABLE[0]) == 0.0
    assert await apylint_score("") == 0.0
    assert math.isnan(await apylint_score("", unparseable_score=math.nan))
