"""`tag verdicts stats|export [LOG]` (`cli/verdicts.py`): the command line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from langchain_tag import cli
from langchain_tag.learning.verdict_log import SQLiteVerdictLog
from langchain_tag.matching import Verdict
from langchain_tag.models import model_identity
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

RULES = trigger_rulebook(4)
LOCAL_MODEL = (
    "langchain_openai.chat_models.base.ChatOpenAI:{"
    '"endpoint:openai_api_base": "http://user:s3cret@gpu-box:8000/v1", '
    '"model": "qwen3-8b", "model_name": "qwen3-8b", "stream": false}'
)


def fill(path: Path, texts: list[str], *, model: str = "fake") -> Path:
    """A log at `path` with the fake judge's verdicts on every rule for `texts`."""
    log = SQLiteVerdictLog(path)
    for text in texts:
        for rule in RULES.rules:
            applies = f"trigger-{rule.rule_id[2:]}" in text
            verdict = Verdict(rule_id=rule.rule_id, applies=applies)
            log.record(text, rule, verdict, model=model)
    log.close()
    return path


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    return fill(tmp_path / "verdicts.sqlite", ["has trigger-001", "has trigger-003"])


def tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return sorted(name for (name,) in rows if not name.startswith("sqlite_"))


def columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [row[1] for row in conn.execute("PRAGMA table_info(verdict_log)")]


def drop_reasons(path: Path) -> Path:
    """Make `path` look like a log written before the `reason` column."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("ALTER TABLE verdict_log DROP COLUMN reason")
    conn.close()
    return path


def one_error_line(err: str) -> str:
    """The error message, checked to be one `tag verdicts: error:` line."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tag verdicts: error: ")
    return lines[0]


# --- reading never writes -------------------------------------------------------------


@pytest.mark.parametrize("layout", ["current", "before reasons"])
def test_stats_and_export_read_a_read_only_log_without_changing_it(
    layout: str, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the log was opened for writing, so a read-only file failed with
    # "attempt to write a readonly database" (naming no file), and a log made
    # before the `reason` column was altered (ALTER TABLE) by a mere export.
    if layout == "before reasons":
        drop_reasons(log_file)
    before = (log_file.read_bytes(), log_file.stat().st_mtime_ns, columns(log_file))
    log_file.chmod(0o444)  # blocks writes unless the tests run as root
    try:
        assert cli.main(["verdicts", "stats", str(log_file)]) == 0
        assert "verdicts   8 (position 8)" in capsys.readouterr().out
        assert cli.main(["verdicts", "export", str(log_file)]) == 0
        exported = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    finally:
        log_file.chmod(0o644)
    assert [r["id"] for r in exported] == list(range(1, 9))
    assert {r["reason"] for r in exported} == {None}
    after = (log_file.read_bytes(), log_file.stat().st_mtime_ns, columns(log_file))
    assert after == before


@pytest.mark.parametrize("action", ["stats", "export"])
def test_another_sqlite_file_is_refused_not_given_empty_tables(
    action: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the log's tables were created in it and "0 verdicts" reported.
    other = tmp_path / "cache.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE verdicts (key TEXT PRIMARY KEY, value TEXT)")
    conn.close()
    assert cli.main(["verdicts", action, str(other)]) == 2
    captured = capsys.readouterr()
    error = one_error_line(captured.err)
    assert str(other) in error
    assert "no table verdict_log" in error
    assert "its tables: verdicts" in error
    assert captured.out == ""
    assert tables(other) == ["verdicts"]


def test_a_table_typo_is_refused_and_names_the_tables_there(
    log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: an empty `verdicts_log` table was created and "0 verdicts" reported.
    before = tables(log_file)
    code = cli.main(["verdicts", "stats", str(log_file), "--table", "verdicts_log"])
    assert code == 2
    error = one_error_line(capsys.readouterr().err)
    assert "no table verdicts_log" in error
    assert "its tables: verdict_log, verdict_log_inputs" in error
    assert tables(log_file) == before


def test_a_missing_log_is_refused_and_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "verdicts.sqlite"
    assert cli.main(["verdicts", "export", str(missing)]) == 2
    assert str(missing) in one_error_line(capsys.readouterr().err)
    assert not missing.parent.exists()


def test_a_file_that_is_not_sqlite_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 100)
    assert cli.main(["verdicts", "stats", str(text)]) == 2
    assert str(text) in one_error_line(capsys.readouterr().err)
    assert text.read_text() == "not a database\n" * 100


# --- export --rule --------------------------------------------------------------------


def test_export_of_rules_the_log_does_not_hold_is_an_error(
    log_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: exit 0, nothing written and nothing said.
    target = tmp_path / "out.jsonl"
    argv = ["verdicts", "export", str(log_file), "--rule", "NOPE", "--rule", "R-9"]
    assert cli.main([*argv, "-o", str(target)]) == 2
    captured = capsys.readouterr()
    error = one_error_line(captured.err)
    assert "NOPE, R-9" in error
    assert "4 rules" in error
    assert "8 verdicts" in error
    assert "R-000" in error  # some of the ids it does hold
    assert captured.out == ""
    assert not target.exists()


def test_export_names_the_rules_it_found_nothing_for(
    log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["verdicts", "export", str(log_file), "--rule", "R-001", "--rule", "NOPE"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["rule_id"] for line in captured.out.splitlines()] == [
        "R-001",
        "R-001",
    ]
    assert "no verdicts on NOPE" in captured.err


def test_export_of_an_empty_log_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = fill(tmp_path / "empty.sqlite", [])
    assert cli.main(["verdicts", "export", str(empty)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "holds no verdicts" in captured.err


# --- stats ----------------------------------------------------------------------------


def test_stats_name_each_model_in_a_short_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: `by model` printed each model's whole JSON identity.
    path = fill(
        tmp_path / "log.sqlite",
        ["a trigger-001"],
        model=model_identity(RuleAwareFakeChatModel()),
    )
    log = SQLiteVerdictLog(path)
    rule = RULES.rules[0]
    for text in ("x", "y"):
        verdict = Verdict(rule_id="R-000", applies=False)
        log.record(text, rule, verdict, model=LOCAL_MODEL)
    log.close()
    assert cli.main(["verdicts", "stats", str(path)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "by model" in x]
    assert line == (
        "  by model   RuleAwareFakeChatModel 4; "
        "qwen3-8b @ http://user:***@gpu-box:8000/v1 2"
    )
    # --json keeps the whole identities, for scripts.
    assert cli.main(["verdicts", "stats", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["by_model"][LOCAL_MODEL] == 2
