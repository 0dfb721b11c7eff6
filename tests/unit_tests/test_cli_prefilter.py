"""`tag prefilter train RULEBOOK [LOG] -o MODEL` (`cli/prefilter.py`)."""

from __future__ import annotations

import argparse
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import cli
from langchain_tag.cli import prefilter as prefilter_cli
from langchain_tag.cli.errors import number_in, probability
from langchain_tag.learning.learned_prefilter import LearnedPrefilter
from langchain_tag.learning.verdict_log import SQLiteVerdictLog
from langchain_tag.matching import Verdict
from langchain_tag.testing import trigger_rulebook

RULES = trigger_rulebook(4)
FILLER = ("alpha", "beta", "gamma", "delta", "epsilon")


@pytest.fixture
def rulebook(tmp_path: Path) -> Path:
    return RULES.save(tmp_path / "rules.json")


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    """A log with enough of the fake judge's verdicts to learn every rule from."""
    path = tmp_path / "verdicts.sqlite"
    log = SQLiteVerdictLog(path)
    for i in range(40):
        text = f"{FILLER[i % 5]} {FILLER[(i * 3) % 5]} trigger-{i % 3:03d} n{i}"
        for rule in RULES.rules:
            applies = f"trigger-{rule.rule_id[2:]}" in text
            log.record(text, rule, Verdict(rule_id=rule.rule_id, applies=applies))
    log.close()
    return path


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the command gets as far as training."""

    def fit(*args: Any, **kwargs: Any) -> None:
        msg = "trained before the arguments were checked"
        raise AssertionError(msg)

    monkeypatch.setattr(LearnedPrefilter, "fit", fit)


def one_error_line(err: str) -> str:
    """The error message, checked to be one `tag prefilter: error:` line."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tag prefilter: error: ")
    return lines[0]


def tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return sorted(name for (name,) in rows if not name.startswith("sqlite_"))


# --- -o checked before anything is loaded or trained ----------------------------------


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("models", "is a directory; name the file, e.g. models/prefilter.npz"),
        (
            "rules.json/prefilter.npz",
            "cannot be created: rules.json is not a directory",
        ),
    ],
)
@pytest.mark.usefixtures("no_training")
def test_train_checks_the_output_path_first(
    output: str,
    message: str,
    rulebook: Path,
    log_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: it trained, then ended in a traceback (IsADirectoryError, ...).
    monkeypatch.chdir(rulebook.parent)
    Path("models").mkdir()
    argv = ["prefilter", "train", "rules.json", str(log_file), "-o", output]
    assert cli.main(argv) == 2
    error = one_error_line(capsys.readouterr().err)
    assert f"-o {output}: {message}" in error
    assert error.endswith("Nothing was trained.")


def test_train_reports_a_model_file_it_cannot_write(
    rulebook: Path,
    log_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def save(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LearnedPrefilter, "save", save)
    model = tmp_path / "prefilter.npz"
    argv = ["prefilter", "train", str(rulebook), str(log_file), "-o", str(model)]
    assert cli.main(argv) == 2
    error = one_error_line(capsys.readouterr().err)
    assert f"-o {model}: cannot be written (No space left on device)" in error


# --- --target-recall ------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-0.5", "1.01", "nan", "inf", "most"])
def test_target_recall_outside_its_range_is_an_argparse_error(
    value: str, rulebook: Path, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: 0 passed the parser, and the prefilter's pydantic dump followed.
    argv = ["prefilter", "train", str(rulebook), str(log_file), "-o", "m.npz"]
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--target-recall", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "validation error" not in err
    assert f"argument --target-recall: must be a number in (0, 1], got {value!r}" in err


def test_target_recall_of_one_is_accepted() -> None:
    argv = ["prefilter", "train", "r.json", "-o", "m.npz", "--target-recall", "1"]
    assert cli.build_parser().parse_args(argv).target_recall == 1.0


@pytest.mark.parametrize("value", ["0", "1e-9", "0.5", "1", "1.0000001"])
def test_target_recall_range_is_the_prefilters(value: str) -> None:
    try:
        prefilter_cli.target_recall(value)
    except argparse.ArgumentTypeError:
        parsed = False
    else:
        parsed = True
    try:
        LearnedPrefilter(RULES, target_recall=float(value))
    except ValueError:
        accepted = False
    else:
        accepted = True
    assert parsed == accepted


# --- the log is read, never written ---------------------------------------------------


def test_train_reads_the_log_without_changing_it(
    rulebook: Path, log_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a log made before the `reason` column was altered by training on it
    # (and a read-only one failed with "attempt to write a readonly database").
    with sqlite3.connect(log_file) as conn:
        conn.execute("ALTER TABLE verdict_log DROP COLUMN reason")
    conn.close()
    before = (log_file.read_bytes(), log_file.stat().st_mtime_ns)
    model = tmp_path / "prefilter.npz"
    log_file.chmod(0o444)  # blocks writes unless the tests run as root
    try:
        argv = ["prefilter", "train", str(rulebook), str(log_file), "-o", str(model)]
        assert cli.main(argv) == 0
    finally:
        log_file.chmod(0o644)
    assert "trained on 160 verdicts" in capsys.readouterr().out
    assert LearnedPrefilter.load(model, RULES).fitted
    assert (log_file.read_bytes(), log_file.stat().st_mtime_ns) == before


@pytest.mark.usefixtures("no_training")
def test_train_refuses_a_file_without_the_log_and_a_table_typo(
    rulebook: Path, log_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: empty tables were created in either, and "not enough verdicts" said.
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    model = tmp_path / "prefilter.npz"
    argv = ["prefilter", "train", str(rulebook)]
    assert cli.main([*argv, str(other), "-o", str(model)]) == 2
    error = one_error_line(capsys.readouterr().err)
    assert f"{other} holds no table verdict_log" in error
    assert "its tables: notes" in error
    assert tables(other) == ["notes"]

    code = cli.main([*argv, str(log_file), "-o", str(model), "--table", "verdicts"])
    assert code == 2
    error = one_error_line(capsys.readouterr().err)
    assert f"{log_file} holds no table verdicts" in error
    assert tables(log_file) == [
        "verdict_log",
        "verdict_log_inputs",
        "verdict_log_skipped",
    ]
    assert not model.exists()


@pytest.mark.parametrize(
    ("parse", "value", "ok"),
    [
        (probability, "0", True),
        (probability, "1", True),
        (probability, "1.5", False),
        (probability, "nan", False),
        (prefilter_cli.target_recall, "0", False),
        (prefilter_cli.target_recall, "1e-9", True),
        (prefilter_cli.target_recall, "1", True),
    ],
)
def test_one_range_type_words_both_ranges(
    parse: Callable[[str], float], value: str, *, ok: bool
) -> None:
    # Before: --target-recall had a near copy of `probability`; both are now
    # `number_in`, which words the range as closed or open.
    if ok:
        assert parse(value) == float(value)
        return
    interval = "[0, 1]" if parse is probability else "(0, 1]"
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(value)
    assert str(refused.value) == f"must be a number in {interval}, got {value!r}"


def test_number_in_words_any_range() -> None:
    between = number_in(-1.0, 2.5, low_open=True)
    assert between("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError, match=r"in \(-1, 2\.5\], got '-1'"):
        between("-1")
