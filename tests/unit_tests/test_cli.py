"""`tag` itself (`cli.main`): what every command shares, such as a closed stdout."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from langchain_tag import cli
from langchain_tag.learning.verdict_log import SQLiteVerdictLog, VerdictRecord

TAG = [sys.executable, "-m", "langchain_tag.cli"]
TIMEOUT = 60


def _verdict_log(path: Path, records: int) -> Path:
    log = SQLiteVerdictLog(path)
    log.append(
        VerdictRecord(
            input_digest=f"d{i}",
            text="x" * 500,
            rule_id="R-1",
            rule_hash="h",
            applies=True,
        )
        for i in range(records)
    )
    log.flush()
    log.close()
    return path


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    # Before: `tag verdicts export | head -1` ended in a BrokenPipeError traceback.
    log = _verdict_log(tmp_path / "log.sqlite", 400)  # ~250 kB: more than a pipe holds
    process = subprocess.Popen(  # noqa: S603 - our own command
        [*TAG, "verdicts", "export", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    assert process.stdout.readline().startswith(b'{"id":1,')
    process.stdout.close()  # as `head -1` does
    err = process.stderr.read().decode()
    status = process.wait(TIMEOUT)
    assert err == ""
    assert status == 141


def test_a_reader_gone_before_the_last_flush_is_quiet_too(tmp_path: Path) -> None:
    # Output smaller than the buffer is written at exit, by the interpreter's flush:
    # before, "Exception ignored ... BrokenPipeError" and status 120.
    log = _verdict_log(tmp_path / "log.sqlite", 1)
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        done = subprocess.run(  # noqa: S603 - our own command
            [*TAG, "verdicts", "stats", str(log)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=buffered,
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr.decode() == ""
    assert done.returncode == 141


def test_broken_pipe_in_a_command_is_its_status_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def handler(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("langchain_tag.cli.verdicts.verdicts_command", handler)
    assert cli.main(["verdicts", "stats"]) == 141
    assert capsys.readouterr().err == ""


def test_a_missing_extra_is_one_line_naming_the_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a traceback (`tag eval` without the `local` extra's MiniLM).
    def handler(args: argparse.Namespace) -> int:
        msg = "The offline MiniLM model is not installed. Install it with `pip ...`"
        raise ImportError(msg)

    monkeypatch.setattr("langchain_tag.cli.verdicts.verdicts_command", handler)
    assert cli.main(["verdicts", "stats"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tag verdicts: error: The offline MiniLM model is not")
    assert "Traceback" not in err


def test_a_command_of_a_package_not_installed_says_where_it_comes_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_plugins", list)  # no langchain-tag-experiments
    assert cli.main(["eval", "nba", "--offline"]) == 2
    assert "comes with langchain-tag-experiments" in capsys.readouterr().err


def test_sigterm_ends_a_command_as_an_interrupt_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: status -15 and no message (only SIGINT said "interrupted").
    parser = cli.build_parser()
    reached: list[str] = []

    def killed(args: argparse.Namespace) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at the next step
        reached.append("after the signal")
        return 0

    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    args = parser.parse_args(["verdicts", "stats", "v.sqlite"])
    monkeypatch.setattr(args, "handler", killed, raising=False)
    monkeypatch.setattr(parser, "parse_args", lambda argv: args)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["verdicts"]) == 143
    assert reached == []
    assert (
        "tag verdicts: terminated; run the same command again"
        in capsys.readouterr().err
    )
    assert signal.getsignal(signal.SIGTERM) == before  # put back


def _options(
    parser: argparse.ArgumentParser, name: str
) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                found += _options(sub, f"{name} {command}")
        else:
            found.append((name, action))
    return found


def test_every_option_says_what_it_does() -> None:
    # Before: run --max-concurrency, extract --max-section-tokens --faithfulness,
    # demo --prefilter-k (and others) had no help text.
    silent = [
        (name, action.option_strings or action.dest)
        for name, action in _options(cli.build_parser(), "tag")
        if not action.help
    ]
    assert silent == []


def test_tag_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("tag ")


@pytest.mark.parametrize("command", ["run", "extract", "demo"])
def test_an_empty_model_name_is_refused(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--model", "", "x"])
    assert done.value.code == 2
    assert "--model: must name a model" in capsys.readouterr().err
