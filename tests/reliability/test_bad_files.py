"""Bad files: hand-edited rulebooks, wrong encodings, unreadable files, killed saves.

Complements `tests/unit_tests/test_rules.py` (missing, empty, truncated, non-UTF-8,
future-version files; duplicate ids and dangling relations): here, fields of the
wrong type as a hand edit leaves them, UTF-16 and UTF-32 files and byte-order marks
for rulebooks and for the documents `tag extract` reads, files that cannot be read,
and a writer killed again and again in the middle of a save.
"""

from __future__ import annotations

import json
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import Rule, Rulebook, RulebookError, cli
from langchain_tag import rules as rules_module
from langchain_tag.testing import ExtractionFakeChatModel
from tests.reliability.report import ReliabilityReport

GUIDE = """\
# Guide

Imports should be on separate lines, as in `import os`.
Wildcard imports such as `from os import *` must never be used.
"""


def _rulebook(n: int = 3, domain: str = "style") -> Rulebook:
    return Rulebook(
        domain=domain,
        rules=[
            Rule(
                rule_id=f"R-{i}",
                name=f"Rule {i} of the guide",
                condition=f"The input contains `case-{i}`",
                action=f"Handle case {i}",
                tags=("imports",),
            )
            for i in range(n)
        ],
    )


def _load_error(path: Path) -> str:
    with pytest.raises(RulebookError) as caught:
        Rulebook.load(path)
    message = str(caught.value)
    assert str(path) in message
    return message


# --- hand-edited rulebooks ------------------------------------------------------------


def _set(rule: int, field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["rules"][rule][field] = value

    return edit


HAND_EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "tags written as a string": (_set(1, "tags", "imports"), "rules[1].tags"),
    "name removed": (
        lambda data: data["rules"][2].pop("name"),
        "rules[2].name (rule_id 'R-2'): Field required",
    ),
    "condition set to null": (_set(0, "condition", None), "rules[0].condition"),
    "number where text goes": (_set(1, "applies_when", 5), "rules[1].applies_when"),
    "unknown relationship": (
        _set(0, "relations", [{"relationship": "enemy", "other_rule_id": "R-1"}]),
        "rules[0].relations[0].relationship",
    ),
    "relations as an object": (
        _set(0, "relations", {"other_rule_id": "R-1"}),
        "rules[0].relations",
    ),
    "offsets as words": (
        _set(2, "source", {"document_id": "d", "start": "ten", "end": 20}),
        "rules[2].source.start (rule_id 'R-2')",
    ),
    "metadata as a list": (_set(0, "metadata", ["a"]), "rules[0].metadata"),
    "rules as an object": (
        lambda data: data.update(rules={"R-0": data["rules"][0]}),
        "field rules: Input should be a valid list",
    ),
    "rule id of spaces": (_set(1, "rule_id", "   "), "rules[1].rule_id"),
}


@pytest.mark.parametrize("case", sorted(HAND_EDITS))
def test_hand_edited_rulebooks_name_the_field_and_the_fix(
    case: str, tmp_path: Path
) -> None:
    edit, expected = HAND_EDITS[case]
    path = _rulebook().save(tmp_path / "rulebook.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    message = _load_error(path)
    assert expected in message
    assert "Correct the named field" in message


@pytest.mark.parametrize(
    ("case", "edit", "expected"),
    [
        ("trailing comma", lambda t: t.replace('"style"', '"style",,'), "line 3"),
        ("comment", lambda t: "// my rules\n" + t, "line 1, column 1"),
        ("single quotes", lambda t: t.replace('"domain"', "'domain'"), "line 3"),
    ],
)
def test_hand_edited_json_syntax_gives_line_and_column(
    case: str, edit: Callable[[str], str], expected: str, tmp_path: Path
) -> None:
    path = _rulebook().save(tmp_path / "rulebook.json")
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    message = _load_error(path)
    assert "is not valid JSON" in message
    assert expected in message
    assert "Fix the JSON by hand at that position" in message


@pytest.mark.parametrize(
    ("encoding", "named"),
    [
        ("utf-16-le", "UTF-16LE"),
        ("utf-16-be", "UTF-16BE"),
        ("utf-32", "UTF-32"),
    ],
)
def test_rulebooks_in_wide_encodings_name_the_encoding(
    encoding: str, named: str, tmp_path: Path
) -> None:
    path = tmp_path / "rulebook.json"
    path.write_bytes(_rulebook().model_dump_json(indent=2).encode(encoding))
    message = _load_error(path)
    assert f"is {named} text, not UTF-8" in message
    assert f"iconv -f {named} -t UTF-8" in message


def test_documents_in_utf16_with_a_byte_order_mark_are_read(
    tmp_path: Path, extract: Callable[[Path], tuple[int, str]]
) -> None:
    # UTF-16 says what it is in its mark: nothing is guessed.
    path = tmp_path / "guide.md"
    path.write_bytes(GUIDE.encode("utf-16"))
    code, err = extract(path)
    assert code == 0, err


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_byte_order_mark_and_crlf_are_accepted(newline: str, tmp_path: Path) -> None:
    rulebook = _rulebook()
    text = rulebook.model_dump_json(indent=2).replace("\n", newline)
    path = tmp_path / "rulebook.json"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert Rulebook.load(path) == rulebook


def test_unreadable_rulebook_says_to_check_permissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root, for whom chmod blocks nothing: the OS's refusal is faked.
    path = _rulebook().save(tmp_path / "rulebook.json")

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    message = _load_error(path)
    assert "cannot be read (Permission denied)" in message
    assert "Check its permissions" in message


# --- documents for `tag extract` -----------------------------------------------------


@pytest.fixture
def extract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[[Path], tuple[int, str]]:
    """Run `tag extract` on one file with the fake extractor: (exit code, stderr)."""
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model", lambda **_: ExtractionFakeChatModel()
    )

    def run(path: Path) -> tuple[int, str]:
        out = tmp_path / "out.json"
        code = cli.main(["extract", str(path), "-o", str(out), "--no-checkpoint", "-q"])
        return code, capsys.readouterr().err

    return run


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [
        ("utf-16-le", "UTF-16LE text, not UTF-8. Convert it first, e.g. `iconv -f"),
        ("utf-32", "UTF-32 text, not UTF-8"),
        ("latin-1", "not UTF-8 text (byte 0xe9 at offset"),
    ],
)
def test_documents_in_other_encodings_are_refused_with_the_fix(
    encoding: str,
    expected: str,
    tmp_path: Path,
    extract: Callable[[Path], tuple[int, str]],
) -> None:
    path = tmp_path / "guide.md"
    path.write_bytes(GUIDE.replace("Imports", "Café imports").encode(encoding))
    code, err = extract(path)
    assert code == 2
    assert err.startswith(f"tag extract: error: {path}: ")
    assert expected in err
    assert "Traceback" not in err


def test_binary_documents_are_refused(
    tmp_path: Path, extract: Callable[[Path], tuple[int, str]]
) -> None:
    path = tmp_path / "guide.tar"  # an archive header: valid UTF-8, but NUL-padded
    path.write_bytes(b"guide.md" + b"\x00" * 92 + b"0000644\x00" + GUIDE.encode())
    code, err = extract(path)
    assert code == 2
    assert f"{path}: contains NUL bytes (at offset 8), so it is not a text file" in err


def test_a_document_with_a_byte_order_mark_is_read_without_it(
    tmp_path: Path, extract: Callable[[Path], tuple[int, str]]
) -> None:
    path = tmp_path / "guide.md"
    path.write_bytes(b"\xef\xbb\xbf" + GUIDE.encode("utf-8"))
    assert extract(path) == (0, "")
    rulebook = Rulebook.load(tmp_path / "out.json")
    assert rulebook.documents[0].n_chars == len(GUIDE)
    for rule in rulebook.rules:
        assert rule.source is not None
        assert GUIDE[rule.source.start : rule.source.end] == rule.source_text


def test_unreadable_document_is_named(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extract: Callable[[Path], tuple[int, str]],
) -> None:
    path = tmp_path / "guide.md"
    path.write_text(GUIDE, encoding="utf-8")

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    code, err = extract(path)
    assert code == 2
    assert f"{path}: cannot be read (Permission denied)." in err


# --- a writer killed mid-save, again and again ---------------------------------------

# The writer imports rules.py on its own: importing the `langchain_tag` package costs
# seconds, too slow to pay once per kill.
_WRITER = """
import importlib.util
import sys

rules_file, target, old, new = sys.argv[1:5]
spec = importlib.util.spec_from_file_location("_tag_rules_writer", rules_file)
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
books = [module.Rulebook.load(old), module.Rulebook.load(new)]
saves = 0
while True:
    books[saves % 2].save(target)
    if saves == 0:
        print("saved", flush=True)
    saves += 1
"""
_RULES = 2000
_KILLS = 8


def _temp_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(".rulebook.json.*.tmp"))


def _run_and_kill(
    target: Path, old: Path, new: Path, delay: float
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and code
        [
            sys.executable,
            "-c",
            _WRITER,
            rules_module.__file__,
            *map(str, (target, old, new)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready, "the writer did not start"
        assert process.stdout.readline() == b"saved\n"
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    return process


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
def test_killed_writers_leave_old_or_new_rulebook_and_no_temp_files(
    tmp_path: Path, reliability_report: ReliabilityReport
) -> None:
    old_book, new_book = (
        _rulebook(_RULES, "old"),
        _rulebook(_RULES, "new"),
    )
    new_book.rules[-1] = new_book.rules[-1].model_copy(update={"action": "Changed"})
    old, new = (
        old_book.save(tmp_path / "old.json"),
        new_book.save(tmp_path / "new.json"),
    )
    target = tmp_path / "saves" / "rulebook.json"
    old_book.save(target)
    rng = random.Random(7)  # noqa: S311 - kill timing, not cryptography
    mid_save = 0
    for _ in range(_KILLS):
        _run_and_kill(target, old, new, rng.uniform(0.0, 0.15))
        loaded = Rulebook.load(target)
        assert loaded in (old_book, new_book)  # whole, and one of the two
        left = _temp_files(target.parent)
        # A killed writer leaves at most its own temporary file: the next writer's
        # first save removed the one before.
        assert len(left) <= 1
        mid_save += len(left)
    # The next save removes what the last killed writer left.
    new_book.save(target)
    assert _temp_files(target.parent) == []
    assert sorted(p.name for p in target.parent.iterdir()) == ["rulebook.json"]
    reliability_report.add_figure(
        "killed writers",
        f"{_KILLS} SIGKILLs during saves of a {_RULES}-rule rulebook, {mid_save} "
        "mid-write (temp file left); the file loaded whole as the old or the new "
        "rulebook every time; leftover temp files after the next save: 0",
    )


def test_a_live_writers_temp_file_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "rulebook.json"
    live = target.parent / ".rulebook.json.1.abcd.tmp"  # pid 1 is always alive
    dead = target.parent / ".rulebook.json.999999999.abcd.tmp"
    other = target.parent / ".other.json.999999999.abcd.tmp"
    for path in (live, dead, other):
        path.write_bytes(b"{")
    _rulebook().save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, other.name, target.name]
    )
