"""`tag run RULEBOOK "input"`: match, execute, and report what it cost."""

from __future__ import annotations

import io
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from langchain_tag import Rule, Rulebook, cli
from langchain_tag.models import default_chat_model
from langchain_tag.rule_schemas import RuleSchema, SchemaField
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

    assert cli.main(["run", path, "x", "--on-error", "not_applicable"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("tag run: warning: 1 judgment failed")  # one line, no warning
    assert "matched 0 of 1 rules" in out
    assert "1 judgment(s) failed and were treated as not applicable" in out


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends


@pytest.mark.usefixtures("loopback", "clock")
def test_a_refused_connection_is_named_as_such(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "transient (a rate limit or a timeout)" for a server not listening.
    monkeypatch.setattr("langchain_tag.models.default_chat_model", default_chat_model)
    monkeypatch.setattr(time, "sleep", lambda _: None)  # the retries' waits
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{_closed_port()}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert cli.main(["run", RULEBOOK, "x"]) == 2
    err = capsys.readouterr().err
    assert "the failure is transient (cannot connect to http://127.0.0.1:" in err
    assert "(connection refused)" in err
    assert "a rate limit or a timeout" not in err


def test_a_malformed_base_url_is_refused_before_any_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: ~10 s of retries, then "transient (a rate limit or a timeout)".
    monkeypatch.setattr("langchain_tag.models.default_chat_model", default_chat_model)
    monkeypatch.setenv("OPENAI_BASE_URL", "not a url")
    assert cli.main(["run", RULEBOOK, "x"]) == 2
    err = capsys.readouterr().err
    assert "OPENAI_BASE_URL='not a url' is not an http(s) URL" in err


class BadRequestError(Exception):
    """A provider's refusal of the request (HTTP 400): no retry helps."""

    status_code = 400


def test_a_failed_execution_is_not_advised_an_option_for_judgments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The executor's prompt is no judge prompt: its faults are listed under "".
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: RuleAwareFakeChatModel(faults={"": [BadRequestError("no")]}),
    )
    assert cli.main(["run", RULEBOOK, SNIPPET]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "tag run: error: no answer: the model failed after its retries "
        "(BadRequestError: no). Nothing was assumed about any rule; the error is "
        "not transient, so asking again fails the same way: fix its cause."
    )
    # --on-error flags judgments that failed; it does nothing for the execution.
    assert "--on-error" not in line


# --- what `tag run` refuses before any model call ------------------------------------


@pytest.fixture
def models(monkeypatch: pytest.MonkeyPatch) -> list[RuleAwareFakeChatModel]:
    """Every model `tag run` makes, to check that none was called."""
    made: list[RuleAwareFakeChatModel] = []

    def model(**kwargs: Any) -> RuleAwareFakeChatModel:
        made.append(RuleAwareFakeChatModel())
        return made[-1]

    monkeypatch.setattr("langchain_tag.models.default_chat_model", model)
    return made


def _stdin(monkeypatch: pytest.MonkeyPatch, raw: bytes) -> None:
    """Standard input holding `raw`, as a terminal or pipe gives it: bytes below."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw)))


@pytest.mark.parametrize("text", ["", "  \n\t"])
def test_blank_input_is_refused_in_one_line(
    text: str,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: a real model, asked to execute nothing on nothing, answered nothing:
    # a traceback and status 1 (the fake went on: "matched 0 of 9", one paid call).
    assert cli.main(["run", RULEBOOK, text]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "tag run: error: the input is empty or blank: there is nothing to match. "
        'Pass the text to check, or "-" to read it from standard input.\n'
    )
    assert sum(m.calls for m in models) == 0


def test_blank_standard_input_is_refused(
    models: list[RuleAwareFakeChatModel],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _stdin(monkeypatch, b"\n\n")
    assert cli.main(["run", RULEBOOK, "-"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tag run: error: standard input is empty or blank")
    assert sum(m.calls for m in models) == 0


def test_a_rulebook_without_rules_is_refused(
    tmp_path: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: "matched 0 of 0 rules", and the executor was still called (and paid).
    path = Rulebook(rules=[]).save(tmp_path / "empty.json")
    assert cli.main(["run", str(path), "x = 1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tag run: error: {path}: the rulebook holds no rules")
    assert "tag extract" in err
    assert err.count("\n") == 1
    assert sum(m.calls for m in models) == 0


def test_latin1_standard_input_is_refused_naming_line_and_fix(
    models: list[RuleAwareFakeChatModel],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: "holds a lone surrogate '\udce9' at position 10" (or a decode error
    # naming neither the input nor the line), depending on the locale.
    _stdin(monkeypatch, "x = 1\n# café\n".encode("latin-1"))
    assert cli.main(["run", RULEBOOK, "-"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "tag run: error: standard input: is not UTF-8 text "
        "(byte 0xe9 at offset 11, line 2)."
    )
    assert "save it as UTF-8" in err
    assert sum(m.calls for m in models) == 0


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\xef\xbb\xbf" + SNIPPET.encode(), id="utf-8-bom"),
        pytest.param(SNIPPET.encode("utf-16"), id="utf-16-bom"),
    ],
)
def test_marked_standard_input_is_read(
    raw: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, raw)
    assert cli.main(["run", RULEBOOK, "-"]) == 0
    out = capsys.readouterr().out
    assert "matched 2 of 9 rules:" in out
    assert "\ufeff" not in out


def test_run_judges_a_rulebook_by_the_schema_it_was_extracted_in(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    schema = RuleSchema(
        name="contract",
        fields=(
            SchemaField(name="party", description="Who is bound.", side="judge"),
            SchemaField(name="trigger", description="What starts it.", side="judge"),
            SchemaField(name="obligation", description="What to do.", side="executor"),
        ),
    )
    rules = [
        Rule(
            rule_id=f"C-{n}",
            name=f"Clause {n}",
            **schema.rule_values(
                {
                    "party": "the Buyer",
                    "trigger": f"the input reports `{word}`",
                    "obligation": f"SECRET-{n}: pay within 30 days",
                }
            ),
        )
        for n, word in enumerate(("an invoice", "a return"))
    ]
    path = tmp_path / "contract.rulebook.json"
    Rulebook(rules=rules, rule_schema=schema).save(path)
    judge = RuleAwareFakeChatModel()
    monkeypatch.setattr("langchain_tag.models.default_chat_model", lambda **_: judge)
    assert cli.main(["run", str(path), "We received an invoice today."]) == 0
    assert "matched 1 of 2 rules:" in capsys.readouterr().out
    judged = [p for p in judge.prompts if "applicability judge" in p]
    assert len(judged) == 2
    assert all("- party: Who is bound." in p for p in judged)
    assert all("SECRET" not in p for p in judged)
    # --profile still chooses another profile.
    judge.reset()
    assert cli.main(["run", str(path), "an invoice", "--profile", "condition"]) == 0
    assert not any("- party: Who is bound." in p for p in judge.prompts)


@pytest.mark.filterwarnings("ignore:The class `OpenAIClassifier` is in beta")
def test_run_with_a_decision_model(
    loopback: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from langchain_tag.testing.decisions import FakeDecisionsServer  # noqa: PLC0415

    with FakeDecisionsServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        command = ["run", RULEBOOK, SNIPPET, "--decision-model", "gpt-6-luna"]
        assert cli.main([*command, "--decision-threshold", "0.9"]) == 0
    assert server.request_count == 1
    out = capsys.readouterr().out
    assert "matched 2 of 9 rules:" in out
    assert "0.930" in out  # the decision model's probability is the score
    assert "[PEP8-IMPORT-WILDCARD] Replace the wildcard import" in out
