"""Tests for the rulebook model and its file: round trip, validation, load, save."""

from __future__ import annotations

import hashlib
import json
import re
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from langchain_tag import rules as rules_module
from langchain_tag.errors import RulebookError
from langchain_tag.rule_schemas import NBA_SCHEMA
from langchain_tag.rules import (
    FORMAT_VERSION,
    Rule,
    Rulebook,
    RuleLineage,
    RuleRelation,
    SourceDocument,
    SourceSpan,
)

POLICY_TEXT = (
    "Refunds over 500 EUR need a manager's approval. "
    "Invoices for customers in the EU must show the VAT number. "
    "Café loyalty cards are exempt. ☕"
)
FAQ_TEXT = "Q: Can I pay by card? A: Yes, every major card is accepted."


def _rule_dict(rule_id: str, **overrides: Any) -> dict[str, Any]:
    """The JSON form of a minimal valid rule, with `overrides` applied."""
    rule: dict[str, Any] = {
        "rule_id": rule_id,
        "name": f"Rule {rule_id} for refunds",
        "condition": f"The request matches case {rule_id}.",
        "action": f"Handle case {rule_id}.",
    }
    rule.update(overrides)
    return rule


def _write_json(path: Path, data: Any) -> Path:
    """Write `data` as JSON to `path` (bypassing Rulebook.save) and return `path`."""
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def _load_error(path: Path) -> str:
    """Load `path`, which must fail, and return the RulebookError message."""
    with pytest.raises(RulebookError) as info:
        Rulebook.load(path)
    assert info.value.path == path
    message = str(info.value)
    assert str(path) in message
    return message


def _tmp_files(directory: Path) -> list[Path]:
    """Leftover temporary files of the atomic save in `directory`."""
    return sorted(directory.glob(".*.tmp"))


@pytest.fixture
def full_rulebook() -> Rulebook:
    """Three related rules that between them set every field of the model."""
    policy = SourceDocument.from_text(
        "refund-policy", POLICY_TEXT, source="docs/refund-policy.md"
    )
    faq = SourceDocument.from_text("faq", FAQ_TEXT)
    approval = Rule(
        rule_id="refund-approval",
        name="Manager approval for large refunds",
        condition="A refund of more than 500 EUR is requested.",
        action="Route the refund to a manager for approval.",
        source_text="Refunds over 500 EUR need a manager's approval.",
        tags=("refunds", "approval"),
        source=SourceSpan(document_id="refund-policy", start=0, end=48),
        lineage=RuleLineage(
            span_ids=("span-1",),
            atomic_ids=("atomic-1", "atomic-2"),
            normative_type="requirement",
            merged_rule_ids=("refund-approval-dup",),
        ),
        relations=(
            RuleRelation(
                relationship="conflict",
                other_rule_id="loyalty-exemption",
                preferred_action="manual_review",
                explanation="Loyalty refunds may skip approval.",
            ),
            RuleRelation(relationship="overlap", other_rule_id="card-payments"),
        ),
        applies_when="The refund amount is known and above 500 EUR.",
        constraint="amount_eur > 500",
        violation_check="The refund was issued without a manager's sign-off.",
        does_not_apply_to="Store-credit refunds.",
        metadata={
            "priority": 1,
            "jurisdiction": "EU",
            "weights": [0.5, 1.25],
            "owner": {"team": "finance", "on_call": None, "active": True},
        },
    )
    exemption = Rule(
        rule_id="loyalty-exemption",
        name="Café loyalty cards are exempt",
        condition="The customer pays with a café loyalty card ☕.",
        action="Skip the VAT-number check.",
        source_text="Café loyalty cards are exempt. ☕",
        tags=("vat",),
        source=SourceSpan(document_id="refund-policy", start=107, end=139),
        lineage=RuleLineage(normative_type="exception"),
        relations=(
            RuleRelation(
                relationship="subsumption",
                other_rule_id="refund-approval",
                preferred_action="keep_both",
            ),
        ),
        metadata={"priority": 2},
    )
    cards = Rule(
        rule_id="card-payments",
        name="Major cards are accepted",
        condition="The customer asks whether they can pay by card.",
        action="Confirm that every major card is accepted.",
        source=SourceSpan(document_id="faq", start=0, end=len(FAQ_TEXT)),
        relations=(
            RuleRelation(
                relationship="duplicate",
                other_rule_id="refund-approval",
                preferred_action="merge",
            ),
        ),
    )
    return Rulebook(
        domain="billing",
        rules=[approval, exemption, cards],
        documents=[policy, faq],
        diagnostics={
            "phase_counts": {"spans": 4, "atomic": 5, "rules": 3},
            "elapsed_s": 12.75,
            "warnings": ["span-3 had no action"],
            "model": "gpt-test",
            "deduplicated": True,
        },
    )


# --- round trip ---------------------------------------------------------------


def test_round_trip_preserves_every_field(
    full_rulebook: Rulebook, tmp_path: Path
) -> None:
    path = full_rulebook.save(tmp_path / "rulebook.json")

    assert path == tmp_path / "rulebook.json"
    loaded = Rulebook.load(path)
    assert loaded == full_rulebook
    assert loaded.model_dump() == full_rulebook.model_dump()
    assert loaded.format_version == FORMAT_VERSION
    assert loaded.domain == "billing"
    approval = loaded.rules[0]
    assert approval.source == SourceSpan(document_id="refund-policy", start=0, end=48)
    assert approval.source_document_id == "refund-policy"
    assert approval.lineage.atomic_ids == ("atomic-1", "atomic-2")
    assert approval.lineage.normative_type == "requirement"
    assert approval.tags == ("refunds", "approval")
    assert [r.other_rule_id for r in approval.relations] == [
        "loyalty-exemption",
        "card-payments",
    ]
    assert approval.relations[0].preferred_action == "manual_review"
    assert approval.constraint == "amount_eur > 500"
    assert approval.does_not_apply_to == "Store-credit refunds."
    assert approval.metadata["owner"] == {
        "team": "finance",
        "on_call": None,
        "active": True,
    }
    assert loaded.rules[1].condition.endswith("loyalty card ☕.")
    assert loaded.rules[2].lineage == RuleLineage()
    assert (
        loaded.documents[0].sha256
        == hashlib.sha256(POLICY_TEXT.encode("utf-8")).hexdigest()
    )
    assert loaded.documents[0].source == "docs/refund-policy.md"
    assert loaded.documents[1].source is None
    assert loaded.diagnostics["elapsed_s"] == 12.75
    assert loaded.diagnostics["phase_counts"] == {"spans": 4, "atomic": 5, "rules": 3}
    assert [r.content_hash() for r in loaded.rules] == [
        r.content_hash() for r in full_rulebook.rules
    ]


def test_save_load_save_is_byte_identical(
    full_rulebook: Rulebook, tmp_path: Path
) -> None:
    first = full_rulebook.save(tmp_path / "first.json")
    second = Rulebook.load(first).save(tmp_path / "second.json")

    first_bytes = first.read_bytes()
    assert first_bytes == second.read_bytes()
    assert first_bytes.endswith(b"}\n")
    assert "☕".encode() in first_bytes  # written as UTF-8, not \u escapes
    assert json.loads(first_bytes)["format_version"] == FORMAT_VERSION


def test_save_creates_missing_parent_directories(
    full_rulebook: Rulebook, tmp_path: Path
) -> None:
    path = full_rulebook.save(tmp_path / "a" / "b" / "rulebook.json")

    assert Rulebook.load(path) == full_rulebook
    assert _tmp_files(path.parent) == []


def test_load_accepts_str_path_and_older_files_without_optional_keys(
    tmp_path: Path,
) -> None:
    path = _write_json(tmp_path / "old.json", {"rules": [_rule_dict("only")]})

    loaded = Rulebook.load(str(path))

    assert loaded.format_version == FORMAT_VERSION
    assert loaded.domain is None
    assert loaded.documents == []
    assert loaded.diagnostics == {}
    assert loaded.rules[0].lineage == RuleLineage()


def test_equality_does_not_depend_on_lookups(
    full_rulebook: Rulebook, tmp_path: Path
) -> None:
    loaded = Rulebook.load(full_rulebook.save(tmp_path / "rulebook.json"))
    assert loaded == full_rulebook

    assert full_rulebook.get("card-payments") is not None

    assert loaded == full_rulebook


# --- validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("   ", "must not be blank"),
        ("", "String should have at least 1 character"),
    ],
)
def test_load_blank_condition_names_field_and_rule(
    tmp_path: Path, condition: str, expected: str
) -> None:
    path = _write_json(
        tmp_path / "blank.json",
        {
            "format_version": FORMAT_VERSION,
            "rules": [_rule_dict("fine"), _rule_dict("blank", condition=condition)],
        },
    )

    message = _load_error(path)

    assert "field rules[1].condition (rule_id 'blank'): " in message
    assert expected in message
    assert "Correct the named field" in message
    assert "'fine'" not in message


def test_load_unknown_field_names_the_typo(tmp_path: Path) -> None:
    typo = _rule_dict("typo")
    typo["conditon"] = typo.pop("condition")
    path = _write_json(tmp_path / "typo.json", {"rules": [_rule_dict("ok"), typo]})

    message = _load_error(path)

    assert "field rules[1].conditon (rule_id 'typo'): unknown field" in message
    assert "field rules[1].condition (rule_id 'typo'): Field required" in message
    assert "allowed fields" in message


def test_load_span_end_before_start_names_the_span(tmp_path: Path) -> None:
    bad = _rule_dict("span", source={"document_id": "doc", "start": 40, "end": 10})
    path = _write_json(tmp_path / "span.json", {"rules": [_rule_dict("ok"), bad]})

    message = _load_error(path)

    assert "field rules[1].source (rule_id 'span'): " in message
    assert "end (10) is before start (40)" in message


def test_load_nested_invalid_field_gives_full_path(tmp_path: Path) -> None:
    bad = _rule_dict(
        "rel", relations=[{"relationship": "enemy", "other_rule_id": "rel"}]
    )
    path = _write_json(tmp_path / "nested.json", {"rules": [bad]})

    message = _load_error(path)

    assert "field rules[0].relations[0].relationship (rule_id 'rel'): " in message
    assert "'duplicate', 'subsumption', 'overlap' or 'conflict'" in message


def test_load_invalid_document_is_named_without_a_rule_id(tmp_path: Path) -> None:
    path = _write_json(
        tmp_path / "doc.json",
        {
            "rules": [_rule_dict("ok")],
            "documents": [{"document_id": "d", "sha256": "abc", "n_chars": 3}],
        },
    )

    message = _load_error(path)

    assert "field documents[0].sha256: " in message
    assert "rule_id" not in message


def test_load_reports_at_most_five_problems(tmp_path: Path) -> None:
    rules = [_rule_dict(f"r{i}", action=" ") for i in range(7)]
    path = _write_json(tmp_path / "many.json", {"rules": rules})

    message = _load_error(path)

    assert "rules[4].action (rule_id 'r4')" in message
    assert "rules[5]" not in message
    assert "(and 2 more)" in message


def test_load_duplicate_rule_ids_names_the_id(tmp_path: Path) -> None:
    path = _write_json(
        tmp_path / "dup.json",
        {"rules": [_rule_dict("a"), _rule_dict("b"), _rule_dict("a")]},
    )

    message = _load_error(path)

    assert "rule_id: 'a' is used by more than one rule (first at rules[0])" in message
    assert "re-run extraction" in message


def test_load_relation_to_missing_rule_names_both_ids(tmp_path: Path) -> None:
    dangling = _rule_dict(
        "has-relation",
        relations=[{"relationship": "conflict", "other_rule_id": "ghost"}],
    )
    path = _write_json(
        tmp_path / "dangling.json", {"rules": [_rule_dict("ok"), dangling]}
    )

    message = _load_error(path)

    assert (
        "rule 'has-relation' has a conflict relation to 'ghost', which is not in "
        "the rulebook" in message
    )


def test_load_duplicate_rule_ids_names_the_field_path(tmp_path: Path) -> None:
    path = _write_json(
        tmp_path / "dup.json",
        {"rules": [_rule_dict("a"), _rule_dict("b"), _rule_dict("a")]},
    )

    message = _load_error(path)

    assert "rules[2].rule_id" in message


def test_load_relation_to_missing_rule_names_the_field_path(tmp_path: Path) -> None:
    dangling = _rule_dict(
        "has-relation",
        relations=[{"relationship": "conflict", "other_rule_id": "ghost"}],
    )
    path = _write_json(
        tmp_path / "dangling.json", {"rules": [_rule_dict("ok"), dangling]}
    )

    message = _load_error(path)

    assert "rules[1].relations[0].other_rule_id" in message


def test_in_memory_validation_raises_pydantic_errors() -> None:
    with pytest.raises(ValidationError, match="used by more than one rule"):
        Rulebook.from_rules([_rule_dict("x"), _rule_dict("x")])
    with pytest.raises(ValidationError, match="'nowhere', which is not in"):
        Rulebook.from_rules(
            [
                _rule_dict(
                    "x",
                    relations=[{"relationship": "overlap", "other_rule_id": "nowhere"}],
                )
            ]
        )
    with pytest.raises(ValidationError, match="end \\(1\\) is before start \\(2\\)"):
        SourceSpan(document_id="d", start=2, end=1)
    with pytest.raises(ValidationError, match="must not be blank"):
        Rule(**_rule_dict("x", name="\t\n"))


def test_from_json_without_path_names_no_file() -> None:
    with pytest.raises(RulebookError) as info:
        Rulebook.from_json('{"rules": [{"rule_id": "x"}]}')

    assert info.value.path is None
    assert str(info.value).startswith("Rulebook: invalid field rules[0].name")


# --- load errors ----------------------------------------------------------------


def test_load_missing_file(tmp_path: Path) -> None:
    message = _load_error(tmp_path / "nope.json")

    assert "file not found" in message
    assert "tag extract" in message


def test_load_directory(tmp_path: Path) -> None:
    directory = tmp_path / "rulebook.json"
    directory.mkdir()

    message = _load_error(directory)

    assert "is a directory, not a file" in message
    assert "Pass the rulebook JSON file" in message


@pytest.mark.parametrize("content", [b"", b"  \n\t\n"])
def test_load_empty_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.json"
    path.write_bytes(content)

    message = _load_error(path)

    assert "is empty" in message
    assert "restore a backup or re-run extraction" in message


def test_load_file_cut_in_half_says_it_ends_early(
    full_rulebook: Rulebook, tmp_path: Path
) -> None:
    path = full_rulebook.save(tmp_path / "rulebook.json")
    data = path.read_bytes()
    # Cut at the last line break before the middle: the cut falls between values.
    path.write_bytes(data[: data.rindex(b"\n", 0, len(data) // 2)])

    message = _load_error(path)

    assert "is not valid JSON" in message
    assert "the file ends early: truncated?" in message
    assert "restore a backup" in message


def test_load_every_truncation_is_a_rulebook_error(tmp_path: Path) -> None:
    path = Rulebook.from_rules([_rule_dict("a", tags=["x"])]).save(tmp_path / "r.json")
    data = path.read_bytes()

    for cut in range(len(data.rstrip())):
        with pytest.raises(RulebookError) as info:
            Rulebook.from_json(data[:cut], path=path)
        message = str(info.value)
        assert str(path) in message, cut
        assert "restore a backup" in message, cut


@pytest.mark.parametrize(
    ("marker", "offset"),
    [
        pytest.param(b'"condition": "', 20, id="inside-string-value"),
        pytest.param(b'"normative_type"', 6, id="inside-key"),
        pytest.param(b"null", 2, id="inside-null"),
        pytest.param(b"true", 3, id="inside-true"),
    ],
)
def test_load_file_cut_inside_a_value_says_it_ends_early(
    full_rulebook: Rulebook, tmp_path: Path, marker: bytes, offset: int
) -> None:
    path = full_rulebook.save(tmp_path / "rulebook.json")
    data = path.read_bytes()
    path.write_bytes(data[: data.index(marker) + offset])

    message = _load_error(path)

    assert "the file ends early" in message


def test_load_invalid_json_in_the_middle_is_not_called_truncated(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"rules": [}, "domain": "x"}\n', encoding="utf-8")

    message = _load_error(path)

    assert "is not valid JSON" in message
    assert "line 1, column 12" in message
    assert "truncated" not in message


def test_load_non_utf8_file(full_rulebook: Rulebook, tmp_path: Path) -> None:
    path = full_rulebook.save(tmp_path / "latin1.json")
    text = path.read_text(encoding="utf-8")
    path.write_bytes(text.encode("latin-1", errors="replace"))
    bad_offset = text.encode("latin-1", errors="replace").index("é".encode("latin-1"))

    line = text[: text.index("é")].count("\n") + 1

    message = _load_error(path)

    # The same words as for every text file a user gives `tag` (`_text.read_text`).
    assert f"is not UTF-8 text (byte 0xe9 at offset {bad_offset}, line {line})" in (
        message
    )
    assert "save it as UTF-8" in message


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig"])
def test_load_marked_utf16_and_utf8_with_bom(
    encoding: str, full_rulebook: Rulebook, tmp_path: Path
) -> None:
    # Before: UTF-16 with its byte-order mark was refused, unlike `tag run -`'s input.
    path = tmp_path / "marked.json"
    path.write_bytes(full_rulebook.model_dump_json(indent=2).encode(encoding))
    assert Rulebook.load(path) == full_rulebook


@pytest.mark.parametrize(
    "data",
    [
        pytest.param([_rule_dict("a")], id="list"),
        pytest.param({"format_version": 1, "items": []}, id="object-without-rules"),
        pytest.param("rules", id="string"),
        pytest.param(None, id="null"),
    ],
)
def test_load_json_that_is_not_a_rulebook(tmp_path: Path, data: object) -> None:
    path = _write_json(tmp_path / "other.json", data)

    message = _load_error(path)

    assert "is JSON but not a rulebook" in message
    assert "'rules'" in message
    assert "Pass a file written by Rulebook.save" in message


def test_load_future_format_version_says_to_upgrade(tmp_path: Path) -> None:
    # A newer release may add fields: the upgrade advice must win over "unknown field".
    future_rule = _rule_dict("a", new_field_from_the_future=True)
    path = _write_json(
        tmp_path / "future.json",
        {"format_version": FORMAT_VERSION + 1, "rules": [future_rule]},
    )

    message = _load_error(path)

    assert f"has format_version {FORMAT_VERSION + 1}" in message
    assert f"reads format_version {FORMAT_VERSION} and older" in message
    assert "Upgrade langchain-tag (pip install -U langchain-tag)" in message
    assert "unknown field" not in message


@pytest.mark.parametrize("version", [0, -1])
def test_a_format_version_below_one_is_refused(version: int) -> None:
    data = Rulebook().model_dump(mode="json") | {"format_version": version}
    with pytest.raises(RulebookError, match="format_version"):
        Rulebook.from_data(data)


# --- atomic save ------------------------------------------------------------------


def test_failed_save_leaves_existing_file_intact(
    full_rulebook: Rulebook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = full_rulebook.save(tmp_path / "rulebook.json")
    before = path.read_bytes()
    newer = full_rulebook.model_copy(update={"domain": "changed", "rules": []})
    calls: list[int] = []

    def failing_fsync(fd: int) -> None:
        calls.append(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("langchain_tag.rules.os.fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left on device"):
        newer.save(path)
    monkeypatch.undo()

    assert calls  # the failure happened inside save, before the rename
    assert path.read_bytes() == before
    assert Rulebook.load(path) == full_rulebook
    assert _tmp_files(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rulebook.json"]


def test_failed_first_save_leaves_no_file(
    full_rulebook: Rulebook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("langchain_tag.rules.os.fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        full_rulebook.save(tmp_path / "rulebook.json")

    assert list(tmp_path.iterdir()) == []


def test_save_replaces_existing_file(full_rulebook: Rulebook, tmp_path: Path) -> None:
    path = full_rulebook.save(tmp_path / "rulebook.json")
    smaller = Rulebook.from_rules([_rule_dict("only")], domain="smaller")

    smaller.save(path)

    assert Rulebook.load(path) == smaller
    assert _tmp_files(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_save_keeps_the_mode_of_an_existing_file(
    full_rulebook: Rulebook, tmp_path: Path
) -> None:
    path = full_rulebook.save(tmp_path / "rulebook.json")
    path.chmod(0o644)

    full_rulebook.save(path)

    assert path.stat().st_mode & 0o777 == 0o644


# The writer imports rules.py on its own: importing the `langchain_tag` package pulls
# in langchain-core and openai (~2.5 s), too slow to pay once per kill. Its second
# save stops at a chosen point (announcing it), where the test kills it: every point
# of a save is covered, in the same order every run.
_WRITER = """
import importlib.util
import signal
import sys

rules_file, target, round_, count, kill_point = sys.argv[1:6]
spec = importlib.util.spec_from_file_location("_tag_rules_writer", rules_file)
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
rules = [
    module.Rule(
        rule_id=f"rule-{i}",
        name=f"Rule number {i} of the large rulebook",
        condition="The input mentions a refund of a large amount. " * 4,
        action="Route the request to the finance team for approval. " * 4,
        source_text="Refunds over 500 EUR need a manager's approval. " * 4,
        tags=("refunds", f"group-{i % 7}"),
        metadata={"position": i},
    )
    for i in range(int(count))
]


def save(iteration):
    module.Rulebook(
        domain=f"round-{round_}-iteration-{iteration}",
        rules=rules,
        diagnostics={"iteration": iteration},
    ).save(target)


def stop_before(owner, name, nth):
    original = getattr(owner, name)
    calls = 0

    def stopped(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == nth:
            print("stopped", flush=True)
            signal.pause()  # until the test's SIGKILL
        return original(*args, **kwargs)

    setattr(owner, name, stopped)


save(0)
print("saved", flush=True)
owner, name, nth = {
    "before-write": (module.os, "fchmod", 1),
    "before-fsync": (module.os, "fsync", 1),
    "before-rename": (module.Path, "replace", 1),
    "after-rename": (module.os, "fsync", 2),
    "before-cleanup": (module, "_remove_stale_temp_files", 1),
}[kill_point]
stop_before(owner, name, nth)
save(1)
print("not stopped", flush=True)
"""
_KILL_RULES = 3000
_KILL_POINTS = (
    "before-write",
    "before-fsync",
    "before-rename",
    "after-rename",
    "before-cleanup",
)


def _check_complete(path: Path, round_: int) -> None:
    """The file at `path` is a whole rulebook written by the writer."""
    loaded = Rulebook.load(path)
    match = re.fullmatch(rf"round-{round_}-iteration-(\d+)", loaded.domain or "")
    assert match, loaded.domain
    assert loaded.diagnostics == {"iteration": int(match.group(1))}
    assert len(loaded) == _KILL_RULES
    assert loaded.rules[-1].rule_id == f"rule-{_KILL_RULES - 1}"
    assert loaded.rules[-1].metadata == {"position": _KILL_RULES - 1}


def _read_line(process: subprocess.Popen[bytes]) -> bytes:
    """The writer's next line (unbuffered, so `select` sees every line)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 10)  # a hang guard
    return process.stdout.readline() if ready else b""


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
def test_kill_during_save_always_leaves_a_complete_file(tmp_path: Path) -> None:
    path = tmp_path / "rulebook.json"
    for round_, kill_point in enumerate(_KILL_POINTS):
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and code
            [
                sys.executable,
                "-c",
                _WRITER,
                rules_module.__file__,
                str(path),
                str(round_),
                str(_KILL_RULES),
                kill_point,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            cwd=tmp_path,
        )
        try:
            assert process.stderr is not None
            if _read_line(process) != b"saved\n" or _read_line(process) != (
                b"stopped\n"
            ):
                process.kill()
                pytest.fail(
                    f"writer did not stop {kill_point}: "
                    f"{process.stderr.read().decode()}"
                )
            process.send_signal(signal.SIGKILL)
            assert process.wait(timeout=10) == -signal.SIGKILL
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        _check_complete(path, round_)


# --- lookups and small models ------------------------------------------------------


def test_get_position_and_len(full_rulebook: Rulebook) -> None:
    assert len(full_rulebook) == 3
    assert len(Rulebook()) == 0
    assert full_rulebook.get("loyalty-exemption") is full_rulebook.rules[1]
    assert full_rulebook.get("missing") is None
    assert full_rulebook.position("refund-approval") == 0
    assert full_rulebook.position("card-payments") == 2
    with pytest.raises(KeyError, match="missing"):
        full_rulebook.position("missing")


def test_lookups_follow_edits_of_the_rules_list(full_rulebook: Rulebook) -> None:
    assert full_rulebook.position("card-payments") == 2
    new = Rule(**_rule_dict("new"))

    full_rulebook.rules.insert(0, new)

    assert full_rulebook.position("card-payments") == 3
    assert full_rulebook.get("new") is new
    assert full_rulebook.position("new") == 0

    del full_rulebook.rules[0:2]

    assert full_rulebook.get("refund-approval") is None
    assert full_rulebook.position("card-payments") == 1
    assert len(full_rulebook) == 2


def test_from_rules_accepts_rules_and_dicts() -> None:
    existing = Rule(**_rule_dict("model"))
    document = SourceDocument.from_text("doc", "text")

    rulebook = Rulebook.from_rules(
        [existing, _rule_dict("dict", tags=["a", "b"])],
        domain="mixed",
        documents=[document],
    )

    assert [r.rule_id for r in rulebook.rules] == ["model", "dict"]
    assert rulebook.rules[0] is existing
    assert isinstance(rulebook.rules[1], Rule)
    assert rulebook.rules[1].tags == ("a", "b")
    assert rulebook.domain == "mixed"
    assert rulebook.documents == [document]
    with pytest.raises(ValidationError, match="rule_id"):
        Rulebook.from_rules([{"name": "n", "condition": "c", "action": "a"}])


def test_content_hash_is_stable_and_tracks_the_action(full_rulebook: Rulebook) -> None:
    rule = full_rulebook.rules[0]
    digest = rule.content_hash()

    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert rule.content_hash() == digest
    assert rule.model_copy().content_hash() == digest
    assert rule.model_copy(deep=True).content_hash() == digest
    assert Rule.model_validate_json(rule.model_dump_json()).content_hash() == digest
    assert Rule(**rule.model_dump()).content_hash() == digest

    changed = Rule(**{**rule.model_dump(), "action": "Refuse the refund."})
    assert changed.content_hash() != digest
    assert Rule(**{**rule.model_dump(), "tags": ("refunds",)}).content_hash() != digest
    assert len({r.content_hash() for r in full_rulebook.rules}) == 3


def test_equal_rules_have_equal_content_hashes() -> None:
    first = Rule(**_rule_dict("a", metadata={"team": "finance", "priority": 1}))
    second = Rule(**_rule_dict("a", metadata={"priority": 1, "team": "finance"}))
    assert first == second

    assert first.content_hash() == second.content_hash()


def test_source_document_from_text_hashes_the_text() -> None:
    text = "Règle: pas de remboursement après 30 jours. ✔"

    document = SourceDocument.from_text("fr", text, source="https://example.com/fr")

    assert document.sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert document.n_chars == len(text)  # characters, not UTF-8 bytes
    assert document.n_chars < len(text.encode("utf-8"))
    assert document.document_id == "fr"
    assert document.source == "https://example.com/fr"
    assert SourceDocument.from_text("fr", text).source is None
    assert SourceDocument.from_text("fr", text + " ").sha256 != document.sha256
    with pytest.raises(ValidationError, match="sha256"):
        SourceDocument(document_id="x", sha256="ABC", n_chars=1)


def test_models_are_frozen(full_rulebook: Rulebook) -> None:
    rule = full_rulebook.rules[0]

    with pytest.raises(ValidationError, match="frozen") as info:
        rule.action = "Do something else."  # type: ignore[misc]
    assert info.value.errors()[0]["type"] == "frozen_instance"
    assert rule.action == "Route the refund to a manager for approval."
    assert rule.source is not None
    with pytest.raises(ValidationError, match="frozen"):
        rule.source.end = 1  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        rule.lineage.normative_type = None  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        rule.relations[0].other_rule_id = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        full_rulebook.documents[0].n_chars = 0  # type: ignore[misc]


def test_rules_reject_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="conditon"):
        Rule(**_rule_dict("x", conditon="typo"))


def test_fields_added_later_are_written_only_when_used(tmp_path: Path) -> None:
    # Files of rulebooks that use none of them read as before in earlier releases.
    plain = Rulebook.from_rules(
        [Rule(rule_id="R-1", name="n", condition="c", action="a")]
    )
    path = plain.save(tmp_path / "plain.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert "rule_schema" not in data
    assert "fields" not in data["rules"][0]
    assert "pages" not in data["rules"][0]["lineage"]
    assert Rulebook.load(path) == plain
    # Used, they are written and read back; a built-in schema may be named.
    used = Rulebook.model_validate(
        {
            "rule_schema": "nba",
            "rules": [
                {
                    "rule_id": "R-1",
                    "name": "n",
                    "condition": "c",
                    "action": "a",
                    "fields": {"party": "p"},
                    "lineage": {"pages": [2]},
                }
            ],
        }
    )
    assert used.rule_schema is NBA_SCHEMA
    again = Rulebook.load(used.save(tmp_path / "used.json"))
    assert again == used
    assert again.rules[0].lineage.pages == (2,)
    assert again.rules[0].fields == {"party": "p"}
