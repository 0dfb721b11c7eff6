"""`tag run RULEBOOK "input"`: match, execute, and report what it cost."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from langchain_tag import Rule, Rulebook, cli
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-k", "-1"], "argument -k: must be an integer >= 0, got '-1'"),
        (["-k", "1.5"], "argument -k: must be an integer >= 0, got '1.5'"),
        (
            ["--max-concurrency", "0"],
            "argument --max-concurrency: must be an integer >= 1, got '0'",
        ),
        (["--score-threshold", "2"], "argument --score-threshold: must be a number"),
    ],
)
def test_tag_run_names_the_bad_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: `-k -1` printed "matched 0 of 9" and exited 0; `--max-concurrency 0`
    # said "max_workers must be greater than 0".
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", RULEBOOK, "x", *argv])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


UNREADABLE = Rule(
    rule_id="R-1", name="Anything", condition="The input is text", action="Act"
)


def test_tag_run_advice_fits_the_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: "try again later" for an answer that cannot be read (deterministic at
    # temperature 0), and JudgmentError's advice named an option `tag run` lacked.
    path = str(Rulebook(rules=[UNREADABLE]).save(tmp_path / "r.json"))
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: FakeListChatModel(responses=["Perhaps."] * 4),
    )
    assert cli.main(["run", path, "x"]) == 2
    error = capsys.readouterr().err
    assert "try again later" not in error
    assert "--on-error not_applicable" in error

    with pytest.warns(UserWarning, match="judgments failed"):
        assert cli.main(["run", path, "x", "--on-error", "not_applicable"]) == 0
    out = capsys.readouterr().out
    assert "matched 0 of 1 rules" in out
    assert "1 judgment(s) failed and were treated as not applicable" in out
