"""`tag extract DOCUMENT... -o RULEBOOK` (`cli/extract.py`): the command line."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import Rulebook, cli, extraction
from langchain_tag.testing import ExtractionFakeChatModel

# --- tag extract -o checked before the first model call -------------------------------


@pytest.mark.parametrize(
    ("option", "path", "message"),
    [
        # Before: a raw traceback after the whole extraction had run (and been paid).
        ("-o", ".", "is a directory"),
        ("-o", "doc.md/rulebook.json", "is not a directory"),
        # Before: sqlite3.OperationalError's traceback ("unable to open database").
        ("--checkpoint", "ckdir", "ckdir is a directory; pass a file path"),
        ("--checkpoint", "doc.md/ck.sqlite", "doc.md (or a folder above it) is a file"),
    ],
)
def test_tag_extract_checks_its_paths_before_any_call(
    option: str,
    path: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("doc.md").write_text("# Rules\n\nImports must be on separate lines.\n")
    Path("ckdir").mkdir()
    model = ExtractionFakeChatModel()
    monkeypatch.setattr("langchain_tag.models.default_chat_model", lambda **_: model)
    paths = (
        ["-o", path, "--no-checkpoint"]
        if option == "-o"
        else ["-o", "r.json", "--checkpoint", path]
    )
    code = cli.main(["extract", "doc.md", *paths, "-q"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert model.calls == 0


# --- unreadable answers, and a finished run run again --------------------------------

GUIDE = """\
# Imports

Imports must be on separate lines.

# Names

You should avoid single-letter names.

# Comments

Comments must be complete sentences.
"""
GARBAGE = "I am sorry, I cannot help with that."


@pytest.fixture
def extract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    """Run `tag extract` on GUIDE with `model`: (status, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    Path("guide.md").write_text(GUIDE, encoding="utf-8")

    def run(model: ExtractionFakeChatModel, *options: str) -> tuple[int, str, str]:
        monkeypatch.setattr(
            "langchain_tag.models.default_chat_model", lambda **_: model
        )
        argv = ["extract", "guide.md", "-o", "rules.json", "--checkpoint", "ck.sqlite"]
        # Small sections: one per heading, so that one answer loses one section.
        argv += ["--max-section-tokens", "20", "--max-concurrency", "1", "-q"]
        code = cli.main([*argv, *options])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_no_readable_answer_is_an_error_not_an_empty_rulebook(
    extract: Callable[..., tuple[int, str, str]],
) -> None:
    # Before: exit 0, "wrote 0 rules", and faithfulness, coverage and independence
    # 1.000 over 0 spans.
    garbage = ExtractionFakeChatModel(faults={"spans": [GARBAGE] * 3})
    code, out, err = extract(garbage)
    assert code == 2
    assert "faithfulness (corrected): n/a (nothing to check" in out
    assert "coverage: n/a (no span" in out
    assert "independence: n/a (no rule)" in out
    assert "1.000" not in out
    assert "wrote" not in out
    assert err == (
        "tag extract: error: no rule extracted: 3 model answer(s) could not be read "
        "(spans: malformed_json=3), so 3 section(s) were not read. Run the same "
        "command again to ask only those again: the answers already paid for are "
        "kept in ck.sqlite. If the same answers come back, use a stronger --model."
        " Nothing was written to rules.json.\n"
    )
    assert not Path("rules.json").exists()

    healthy = ExtractionFakeChatModel()
    code, out, err = extract(healthy)
    assert (code, err) == (0, "")
    assert healthy.calls > 0
    assert "wrote 3 rules to rules.json" in out


def test_unreadable_answers_that_leave_spans_uncovered_are_an_error(
    extract: Callable[..., tuple[int, str, str]],
) -> None:
    # The second section's rules, then their re-extraction, cannot be read.
    model = ExtractionFakeChatModel(faults={"rules": [None, GARBAGE, None, GARBAGE]})
    code, out, err = extract(model)
    assert code == 2
    assert "coverage: 0.667" in out
    assert err.startswith(
        "tag extract: error: incomplete: 2 model answer(s) could not be read "
        "(rules: malformed_json=1; recovery: malformed_json=1), so 1 span(s) were "
        "left without a rule. Run the same command again"
    )
    assert not Path("rules.json").exists()

    # Run again, the model as bad: only the two unreadable answers are asked again.
    again = ExtractionFakeChatModel(faults={"rules": [GARBAGE, GARBAGE]})
    code, out, err = extract(again, "--allow-incomplete")
    assert again.calls == 2
    assert code == 0
    assert (
        "wrote 2 rules to rules.json (incomplete: 1 span(s) were left without a rule)"
        in out
    )
    assert "warning: incomplete" in err


def test_unreadable_answers_that_lose_nothing_are_a_warning(
    extract: Callable[..., tuple[int, str, str]],
) -> None:
    # Re-extraction recovers the rules of the answer that could not be read.
    model = ExtractionFakeChatModel(faults={"rules": [None, GARBAGE]})
    code, out, err = extract(model)
    assert code == 0
    assert "wrote 3 rules to rules.json\n" in out
    assert err.startswith(
        "tag extract: warning: 1 model answer(s) could not be read (rules: "
        "malformed_json=1). Run the same command again to ask only those again"
    )


def test_a_lost_section_is_an_error(
    extract: Callable[..., tuple[int, str, str]],
) -> None:
    model = ExtractionFakeChatModel(faults={"spans": [None, GARBAGE]})
    code, _, err = extract(model)
    assert code == 2
    assert "so 1 section(s) were not read" in err


def test_a_finished_run_run_again_says_it_made_no_call(
    extract: Callable[..., tuple[int, str, str]],
) -> None:
    # Before: the second run printed the stored "LLM calls: 10 made" as its own.
    first = ExtractionFakeChatModel()
    code, out, _ = extract(first)
    assert code == 0
    assert f"LLM calls: {first.calls} made, 0 reused" in out

    again = ExtractionFakeChatModel()
    code, out, _ = extract(again)
    assert code == 0
    assert again.calls == 0
    assert out.startswith(
        "reused the finished extraction stored in ck.sqlite (same documents, "
        "domain, model and settings): this run made 0 LLM calls.\n"
    )
    assert "Stored extraction report (instruction)" in out
    assert f"LLM calls when it ran: {first.calls} made, 0 reused" in out
    assert f"LLM calls: {first.calls} made" not in out
    assert "wrote 3 rules to rules.json" in out


def test_only_extraction_says_that_it_returned_a_stored_run(
    extract: Callable[..., tuple[int, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the command took a run that reported no progress for a reused one.
    real = extraction.extract_rules

    def without_progress(*args: Any, on_progress: Any = None, **kwargs: Any) -> Any:
        return real(*args, **kwargs)  # the graph runs; no progress is reported

    monkeypatch.setattr("langchain_tag.extraction.extract_rules", without_progress)
    model = ExtractionFakeChatModel()
    code, out, _ = extract(model)
    assert code == 0
    assert model.calls > 0
    assert "reused the finished extraction" not in out
    assert out.startswith("Extraction report (instruction)")


@pytest.mark.parametrize("run_async", [False, True])
def test_extract_rules_calls_on_stored_only_for_a_stored_run(
    tmp_path: Path, *, run_async: bool
) -> None:
    def run(model: ExtractionFakeChatModel) -> tuple[Rulebook, int]:
        told: list[None] = []
        options: dict[str, Any] = {
            "llm": model,
            "checkpoint": tmp_path / "ck.sqlite",
            "on_stored": lambda: told.append(None),
        }
        rulebook = (
            asyncio.run(extraction.aextract_rules([GUIDE], **options))
            if run_async
            else extraction.extract_rules([GUIDE], **options)
        )
        return rulebook, len(told)

    first, told = run(ExtractionFakeChatModel())
    assert told == 0  # the graph ran
    again = ExtractionFakeChatModel()
    assert run(again) == (first, 1)  # returned as stored, the same rulebook
    assert again.calls == 0


def test_a_run_estimated_above_max_calls_stops_before_any_call(
    extract: Callable[..., tuple[int, str, str]],
) -> None:
    # Before: a real run announced no cost and had no overall cap.
    model = ExtractionFakeChatModel()
    code, _, err = extract(model, "--max-calls", "2")
    assert code == 2
    assert "more than --max-calls 2; nothing was called" in err
    assert model.calls == 0
    assert not Path("rules.json").exists()
    code, _, _ = extract(model, "--max-calls", "0")  # no cap
    assert code == 0
    assert model.calls > 0
