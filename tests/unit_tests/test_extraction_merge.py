"""Phase 4's merge policy: only duplicates become one rule unless told otherwise.

The method merges pairs judged `duplicate` (same condition and action) and keeps
subsumptions, overlaps and conflicts as two rules with their relation recorded.
`ExtractionSettings.merge="preferred"` restores the old behaviour: any pair the
model marked `preferred_action: "merge"` is merged too, transitively.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document

from langchain_tag import cli
from langchain_tag.extraction import (
    ExtractionReport,
    ExtractionSettings,
    extract_rules,
)
from langchain_tag.extraction.graph import _merge_duplicates
from langchain_tag.extraction.phases import DraftRule, RelationRecord
from langchain_tag.extraction.run import run_id_for
from langchain_tag.rules import Rulebook
from langchain_tag.testing import ExtractionFakeChatModel

# --- phase 4 applied, on its own ------------------------------------------------------


def _draft(letter: str) -> DraftRule:
    return DraftRule(
        draft_id=f"d#0000/A-{letter}/R-1",
        document_id="d",
        section_id="d#0000",
        name=f"rule {letter}",
        condition=f"condition {letter}",
        action=f"action {letter}",
        source_text=f"source {letter}",
        tags=("t",),
        span_ids=(f"d#0000/S-{letter}",),
        atomic_ids=(f"d#0000/A-{letter}",),
    )


A, B, C = (_draft(x) for x in "ABC")


def _relation(
    i: DraftRule, j: DraftRule, relationship: str, action: str
) -> RelationRecord:
    return RelationRecord.model_validate(
        {
            "rule_i": i.draft_id,
            "rule_j": j.draft_id,
            "relationship": relationship,
            "preferred_action": action,
            "explanation": f"{relationship} {action}",
        }
    )


DUPLICATE_AB = _relation(A, B, "duplicate", "merge")
SUBSUMPTION_BC = _relation(B, C, "subsumption", "merge")


def _by_id(rules: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["draft_id"]: rule for rule in rules}


def test_default_merges_duplicates_only_and_records_the_other_relation() -> None:
    assert ExtractionSettings().merge == "duplicates"
    rules, merges = _merge_duplicates([A, B, C], [DUPLICATE_AB, SUBSUMPTION_BC])
    assert merges == 1
    by_id = _by_id(rules)
    assert set(by_id) == {A.draft_id, C.draft_id}
    ab, c = by_id[A.draft_id], by_id[C.draft_id]
    assert ab["merged"] == [B.draft_id]
    assert ab["span_ids"] == [*A.span_ids, *B.span_ids]
    assert c["merged"] == []
    # The subsumption B-C is kept, on both rules: B now stands for A's group.
    (ab_link,) = ab["links"]
    (c_link,) = c["links"]
    assert ab_link == {
        "relationship": "subsumption",
        "preferred_action": "merge",
        "explanation": "subsumption merge",
        "other": C.draft_id,
    }
    assert c_link["other"] == A.draft_id
    assert c_link["relationship"] == "subsumption"
    assert c_link["preferred_action"] == "merge"


def test_preferred_policy_is_the_old_transitive_merge() -> None:
    rules, merges = _merge_duplicates(
        [A, B, C], [DUPLICATE_AB, SUBSUMPTION_BC], "preferred"
    )
    assert merges == 2
    (abc,) = rules
    assert abc["draft_id"] == A.draft_id
    assert abc["merged"] == [B.draft_id, C.draft_id]
    assert abc["links"] == []


def test_a_chain_of_merge_marked_overlaps_collapses_only_under_preferred() -> None:
    chain = [_relation(A, B, "overlap", "merge"), _relation(B, C, "overlap", "merge")]
    rules, merges = _merge_duplicates([A, B, C], chain)
    assert merges == 0
    by_id = _by_id(rules)
    assert len(by_id) == 3
    assert {link["other"] for link in by_id[B.draft_id]["links"]} == {
        A.draft_id,
        C.draft_id,
    }
    collapsed, merges = _merge_duplicates([A, B, C], chain, "preferred")
    assert (len(collapsed), merges) == (1, 2)


def test_duplicates_of_duplicates_join_one_group() -> None:
    duplicate_bc = _relation(B, C, "duplicate", "keep_both")
    rules, merges = _merge_duplicates([A, B, C], [DUPLICATE_AB, duplicate_bc])
    assert merges == 2
    (abc,) = rules
    assert abc["merged"] == [B.draft_id, C.draft_id]


def test_an_unknown_merge_policy_is_refused() -> None:
    with pytest.raises(ValueError, match=r"merge must be one of 'duplicates'"):
        ExtractionSettings(merge="everything")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="merge must be one of"):
        extract_rules(
            ["Lines must be short."],
            llm=ExtractionFakeChatModel(),
            merge="all",
            checkpoint=None,
        )


# --- end to end -----------------------------------------------------------------------

DUPLICATES = """\
# Imports

Imports should be grouped by origin, and `import *` must never be used in a module.
Reviewers must reject code that uses `import *` in any module they are asked to read.

# Naming

Function names should be lowercase in new code, for example `parse_record`.
Function names should be lowercase in old code too, as in `read_file`.
"""
"""Two rules with one condition (a duplicate) and two with one name (an overlap)."""


class MergeHappyFakeChatModel(ExtractionFakeChatModel):
    """The extraction fake, but it asks for every overlap to be merged."""

    def _relations(self, prompt: str, user: str) -> dict[str, Any]:
        found = super()._relations(prompt, user)
        for relation in found["relations"]:
            relation["preferred_action"] = "merge"
        return found


def _report(rulebook: Rulebook) -> ExtractionReport:
    return ExtractionReport.model_validate(rulebook.diagnostics)


def _document() -> Document:
    return Document(page_content=DUPLICATES, metadata={"source": "dups.md"})


def test_extract_rules_keeps_a_merge_marked_overlap_as_two_related_rules() -> None:
    rulebook = extract_rules(
        [_document()], llm=MergeHappyFakeChatModel(), checkpoint=None
    )
    report = _report(rulebook)
    assert report.duplicates_merged == 1
    assert len(rulebook) == 3
    overlapping = [r for r in rulebook.rules if r.relations]
    assert len(overlapping) == 2
    for rule in overlapping:
        (relation,) = rule.relations
        assert relation.relationship == "overlap"
        assert relation.preferred_action == "merge"


def test_extract_rules_merge_preferred_and_resume_with_another_policy(
    tmp_path: Path,
) -> None:
    database = tmp_path / "run.sqlite"
    first = MergeHappyFakeChatModel()
    rulebook = extract_rules([_document()], llm=first, checkpoint=database)
    assert len(rulebook) == 3
    assert first.calls > 0

    # Same documents and checkpoint, another policy: not the finished run, and
    # every model answer comes from the store.
    again = MergeHappyFakeChatModel()
    merged = extract_rules(
        [_document()], llm=again, checkpoint=database, merge="preferred"
    )
    assert again.calls == 0
    assert len(merged) == 2
    assert _report(merged).duplicates_merged == 2
    assert not any(r.relations for r in merged.rules)
    (overlap_rule,) = [r for r in merged.rules if r.name.startswith("Function names")]
    assert len(overlap_rule.lineage.merged_rule_ids) == 1

    settings = ExtractionSettings(llm=again)
    other = ExtractionSettings(llm=again, merge="preferred")
    assert run_id_for([_document()], "instruction", settings) != run_id_for(
        [_document()], "instruction", other
    )


@pytest.mark.parametrize(("flag", "rules"), [([], 3), (["--merge", "preferred"], 2)])
def test_cli_extract_merge_option(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: list[str],
    rules: int,
) -> None:
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: MergeHappyFakeChatModel(),
    )
    source = tmp_path / "dups.md"
    source.write_text(DUPLICATES, encoding="utf-8")
    out = tmp_path / "rules.json"
    argv = ["extract", str(source), "-o", str(out), "--no-checkpoint", "-q", *flag]
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert len(Rulebook.load(out)) == rules


def test_cli_extract_refuses_an_unknown_merge_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["extract", "x.md", "-o", "out.json", "--merge", "all"])
    assert "invalid choice: 'all'" in capsys.readouterr().err
