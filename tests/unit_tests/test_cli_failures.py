"""`cli.failures`: one line for a run's failed judgments, not a warning per rule."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import Rulebook, cli
from langchain_tag.cli.failures import SHOWN, FailedJudgments, failed_judgments
from langchain_tag.errors import UnreliableMatchWarning
from langchain_tag.matching import Verdict
from langchain_tag.matching.verdicts import warn_failures
from langchain_tag.testing import RuleAwareFakeChatModel

RULEBOOK = Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json"
SNIPPET = "from os import *\nsquare = lambda x: x * x\n"
FAILING = ("PEP8-IMPORT-SEPARATE", "PEP8-IMPORT-WILDCARD")


def failing_judge(**_: Any) -> RuleAwareFakeChatModel:
    """A judge whose answers for `FAILING`'s rules cannot be read."""
    return RuleAwareFakeChatModel(faults={r: ["Perhaps."] * 5 for r in FAILING})


def failed(*rule_ids: str) -> list[Verdict]:
    return [Verdict(rule_id=r, applies=False, error="boom") for r in rule_ids]


def test_tag_run_prints_one_line_for_its_failed_judgments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: an UnreliableMatchWarning per judge call, with a Python source line
    # (under pytest: kept by pytest, and nothing on stderr).
    monkeypatch.setattr("langchain_tag.models.default_chat_model", failing_judge)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreliableMatchWarning)  # none escapes
        argv = ["run", str(RULEBOOK), SNIPPET, "--on-error", "not_applicable"]
        assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        (
            "tag run: warning: 2 judgments failed and were treated as not "
            "applicable (--on-error not_applicable); rules: PEP8-IMPORT-SEPARATE, "
            "PEP8-IMPORT-WILDCARD."
        )
    ]
    assert "matched 1 of 9 rules" in captured.out


def test_tag_run_without_failures_prints_no_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: RuleAwareFakeChatModel(),
    )
    argv = ["run", str(RULEBOOK), SNIPPET, "--on-error", "not_applicable"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().err == ""


def test_the_line_replaces_the_default_warning_format(tmp_path: Path) -> None:
    # Outside pytest's warning capture: what a user's terminal shows.
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        "import langchain_tag.models\n"
        "from langchain_tag import cli\n"
        "from langchain_tag.testing import RuleAwareFakeChatModel\n"
        f"faults = {{r: ['Perhaps.'] * 5 for r in {FAILING!r}}}\n"
        "langchain_tag.models.default_chat_model = (\n"
        "    lambda **_: RuleAwareFakeChatModel(faults=faults)\n"
        ")\n"
        "sys.exit(cli.main(sys.argv[1:]))\n",
        encoding="utf-8",
    )
    argv = ["run", str(RULEBOOK), SNIPPET, "--on-error", "not_applicable"]
    done = subprocess.run(  # noqa: S603 - this interpreter, a script written here
        [sys.executable, str(script), *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tag run: warning: 2 judgments failed")
    assert "UnreliableMatchWarning" not in done.stderr  # no warnings.warn format


def test_each_warning_is_counted_and_other_warnings_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run() -> None:
        # The same text twice (two inputs, one rule) counts twice.
        warn_failures(failed("R-1"), 4)
        warn_failures(failed("R-1"), 4)
        warn_failures(failed("R-2", "R-3"), 4)
        warnings.warn("other", DeprecationWarning, stacklevel=1)

    with (
        pytest.warns(DeprecationWarning, match="other"),
        failed_judgments("eval") as found,
    ):
        run()
    assert found.count == 4
    assert list(found.rule_ids) == ["R-1", "R-2", "R-3"]
    assert capsys.readouterr().err == (
        "tag eval: warning: 4 judgments failed and were treated as not applicable; "
        "rules: R-1, R-2, R-3.\n"
    )


def test_the_line_is_printed_when_the_run_raises(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run() -> None:
        with failed_judgments("run"):
            warn_failures(failed("R-1"), 1)
            raise RuntimeError

    with pytest.raises(RuntimeError):
        run()
    assert capsys.readouterr().err == (
        "tag run: warning: 1 judgment failed and was treated as not applicable; "
        "rules: R-1.\n"
    )


def test_many_rules_are_cut_and_counted() -> None:
    found = FailedJudgments()
    ids = [f"R-{i:02d}" for i in range(SHOWN + 3)]
    for rule_id in ids:
        found.add(_warning(rule_id))
    line = found.summary("run")
    assert line is not None
    assert ", ".join(ids[:SHOWN]) + " and 3 more." in line
    assert ids[SHOWN] not in line


def test_the_warning_carries_every_failed_rule() -> None:
    # The message names the first ten rules, then "..."; the warning holds all.
    ids = [f"R-{i:02d}" for i in range(12)]
    warning = _warning(*ids)
    assert str(warning).endswith("R-09 .... Their verdicts carry the error.")
    assert (warning.rule_ids, warning.total) == (tuple(ids), 20)
    # Before: the line was read back from that message, so it could only say
    # "and others".
    found = FailedJudgments()
    found.add(warning)
    assert found.count == 12
    assert found.summary("run") == (
        "tag run: warning: 12 judgments failed and were treated as not applicable; "
        f"rules: {', '.join(ids[:SHOWN])} and 4 more."
    )


def test_a_warning_that_names_no_rule_is_shown_as_it_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Not a judge's: a message only, nothing to count.
    with (
        pytest.warns(UnreliableMatchWarning, match="something else failed"),
        failed_judgments("run") as found,
    ):
        warnings.warn("something else failed", UnreliableMatchWarning, stacklevel=1)
    assert found.count == 0
    assert capsys.readouterr().err == ""


def _warning(*rule_ids: str) -> UnreliableMatchWarning:
    with pytest.warns(UnreliableMatchWarning) as caught:
        warn_failures(failed(*rule_ids), 20)
    [warned] = caught
    assert isinstance(warned.message, UnreliableMatchWarning)
    return warned.message


def test_rulebook_fixture_has_the_failing_rules() -> None:
    ids = {rule.rule_id for rule in Rulebook.load(RULEBOOK).rules}
    assert set(FAILING) <= ids
