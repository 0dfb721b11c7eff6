"""`tag run RULEBOOK "input"`: match, execute, and report what it cost."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import cli
from langchain_tag.testing import RuleAwareFakeChatModel

RULEBOOK = str(Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json")
SNIPPET = "from os import *\nsquare = lambda x: x * x\n"


@pytest.fixture(autouse=True)
def fake_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def model(**kwargs: Any) -> RuleAwareFakeChatModel:
        return RuleAwareFakeChatModel(logprobs=True, confidence=0.75)

    monkeypatch.setattr("langchain_tag.models.default_chat_model", model)


def test_run_prints_matches_answer_and_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", RULEBOOK, SNIPPET, "--logprobs"]) == 0
    out = capsys.readouterr().out
    assert "matched 2 of 9 rules:" in out
    assert "PEP8-IMPORT-WILDCARD" in out
    assert "PEP8-LAMBDA-ASSIGN" in out
    assert "0.750" in out  # the logprob score of each match
    assert "[PEP8-IMPORT-WILDCARD] Replace the wildcard import" in out  # the answer
    assert "LLM calls: 9 judgments + 1 execution" in out


def test_run_reads_standard_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("x = lambda: 0\n"))
    assert cli.main(["run", RULEBOOK, "-", "-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "matched 1 of 9 rules:" in out
    assert "PEP8-LAMBDA-ASSIGN" in out


def test_run_with_nothing_applicable(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", RULEBOOK, "print('hello')"]) == 0
    assert "matched 0 of 9 rules:\n  (none)" in capsys.readouterr().out


def test_run_errors_name_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", str(tmp_path / "missing.json"), "x"]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert cli.main(["run", RULEBOOK, "x", "--template", "haiku"]) == 2
    assert "Unknown template 'haiku'" in capsys.readouterr().err
