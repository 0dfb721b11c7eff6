"""Extraction into a rule schema (`ExtractionSettings.rule_schema`, phase 3).

Phase 3 asks for the schema's fields and reads them; the rulebook records the
schema, its rules carry the judge-side fields and their action the executor side.
Everything runs on `ExtractionFakeChatModel`, which answers in the fields a phase-3
prompt asks for.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document

from langchain_tag import cli
from langchain_tag.errors import RuleSchemaError
from langchain_tag.extraction import ExtractionReport, extract_rules, prompts
from langchain_tag.extraction.phases import AtomicRecord, read_rules, rule_messages
from langchain_tag.matching.profiles import NBA_PROFILE, profile_for, schema_profile
from langchain_tag.rule_schemas import (
    CONDITION_SCHEMA,
    NBA_SCHEMA,
    SIDE_KEY,
    RuleSchema,
)
from langchain_tag.rules import Rulebook
from langchain_tag.testing import ExtractionFakeChatModel

GUIDE = """\
# Deliveries

The Supplier must deliver within `10 days` of an order.
The Buyer shall pay each invoice within `30 days`; late payments accrue interest.

# Returns

Goods should never be returned without a `return number`.
"""

CONTRACT: dict[str, Any] = {
    "title": "contract",
    "properties": {
        "party": {"type": "string", "description": "Who is bound.", SIDE_KEY: "judge"},
        "trigger": {
            "type": "string",
            "description": "The event that starts the obligation.",
            SIDE_KEY: "judge",
        },
        "exceptions": {
            "type": ["string", "null"],
            "description": "Cases the clause excludes.",
            SIDE_KEY: "judge",
        },
        "obligation": {
            "type": "string",
            "description": "What the party must do.",
            SIDE_KEY: "executor",
        },
    },
    "required": ["party", "trigger", "obligation"],
}
CONTRACT_SCHEMA = RuleSchema.from_json_schema(CONTRACT)


def extract(schema: Any = CONDITION_SCHEMA, **kwargs: Any) -> Rulebook:
    kwargs.setdefault("checkpoint", None)
    kwargs.setdefault("llm", ExtractionFakeChatModel())
    return extract_rules(
        [Document(GUIDE, metadata={"source": "terms.md"})],
        rule_schema=schema,
        **kwargs,
    )


def test_the_condition_schema_is_todays_extraction_byte_for_byte() -> None:
    assert prompts.operationalisation_system(CONDITION_SCHEMA) is (
        prompts.OPERATIONALISATION_SYSTEM
    )
    unit = AtomicRecord(
        atomic_id="d#0001/A-001",
        span_id="d#0001/S-001",
        section_id="d#0001",
        document_id="d",
        text="Wildcard imports must never be used.",
        original_text="Wildcard imports must never be used.",
    )
    assert rule_messages([unit], "PEP 8") == rule_messages(
        [unit], "PEP 8", CONDITION_SCHEMA
    )
    default, named = extract(), extract("condition")
    assert default.rules == named.rules
    assert default.rule_schema is None  # files read as before
    assert all(not r.fields and r.applies_when is None for r in default.rules)


def test_nba_schema_writes_the_fields_the_nba_matcher_reads() -> None:
    fake = ExtractionFakeChatModel()
    rulebook = extract("nba", llm=fake)
    assert rulebook.rule_schema == NBA_SCHEMA
    assert profile_for(rulebook) is NBA_PROFILE
    assert len(rulebook) == 4
    for rule in rulebook.rules:
        assert rule.applies_when
        assert rule.constraint
        assert rule.violation_check
        assert rule.does_not_apply_to is None  # optional, the fake leaves it null
        assert rule.condition == rule.applies_when
        assert rule.action.startswith("Apply: ")
        assert rule.source_text in GUIDE
        assert rule.source is not None
        assert GUIDE[rule.source.start : rule.source.end] == rule.source_text
    phase_3 = [p for p in fake.prompts if "You turn atomic normative units" in p]
    assert phase_3
    assert all('"violation_check": "..."' in p for p in phase_3)
    assert all("applies_when, constraint, violation_check" in p for p in phase_3)


def test_a_user_schema_keeps_its_executor_side_in_the_action() -> None:
    rulebook = extract(CONTRACT_SCHEMA)
    assert rulebook.rule_schema == CONTRACT_SCHEMA
    assert len(rulebook) == 4
    profile = schema_profile(CONTRACT_SCHEMA)
    for rule in rulebook.rules:
        assert set(rule.fields) == {"party", "trigger"}  # exceptions left null
        assert rule.condition == (
            f"party: {rule.fields['party']}; trigger: {rule.fields['trigger']}"
        )
        assert rule.action.startswith("obligation: ")
        judged = " ".join(value for _, value in profile.judged_fields(rule))
        assert "obligation" not in judged
    # Saved and read back, the rulebook keeps its schema and is judged by it.
    again = Rulebook.from_json(rulebook.model_dump_json())
    assert profile_for(again) == profile


def test_a_rule_missing_a_required_field_is_dropped_and_counted() -> None:
    units = [
        AtomicRecord(
            atomic_id=f"d#0001/A-00{n}",
            span_id="d#0001/S-001",
            section_id="d#0001",
            document_id="d",
            text="Pay within 30 days.",
            original_text="Pay within 30 days.",
        )
        for n in (1, 2)
    ]
    answer = json.dumps(
        {
            "rules": [
                {
                    "atomic_id": "A-001",
                    "rule_name": "Pay invoices",
                    "party": "the Buyer",
                    "trigger": "an invoice arrives",
                    "exceptions": None,
                    "obligation": "pay within 30 days",
                },
                {
                    "atomic_id": "A-002",
                    "rule_name": "Pay invoices again",
                    "party": "the Buyer",
                    "trigger": " ",
                    "obligation": "pay within 30 days",
                },
            ]
        }
    )
    tally: Counter[str] = Counter()
    drafts = read_rules(answer, units, {}, tally, CONTRACT_SCHEMA)
    assert [d.name for d in drafts] == ["Pay invoices"]
    assert drafts[0].fields == {
        "fields": {"party": "the Buyer", "trigger": "an invoice arrives"}
    }
    assert tally["invalid_item:trigger"] == 1


def test_another_schema_reuses_phases_1_and_2_and_asks_phase_3_again(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "run.sqlite"
    first = ExtractionFakeChatModel()
    condition = extract(llm=first, checkpoint=checkpoint)
    second = ExtractionFakeChatModel()
    nba = extract("nba", llm=second, checkpoint=checkpoint)
    assert nba.rule_schema == NBA_SCHEMA != condition.rule_schema
    asked = Counter(p.split("\n", 1)[0][:40] for p in second.prompts)
    # Spans and atomic units come from the store; phase 3 (and phase 4, whose
    # rules changed) are asked again.
    assert all(
        "normative units" in p or "operational rules" in p for p in second.prompts
    )
    assert sum(asked.values()) < first.calls
    report = ExtractionReport.model_validate(nba.diagnostics)
    assert report.phases["spans"].calls == 0
    assert report.phases["spans"].stored_answers > 0


def test_tag_extract_schema_option(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("terms.md").write_text(GUIDE, encoding="utf-8")
    Path("contract.json").write_text(json.dumps(CONTRACT), encoding="utf-8")
    model = ExtractionFakeChatModel()
    monkeypatch.setattr("langchain_tag.models.default_chat_model", lambda **_: model)
    argv = ["extract", "terms.md", "--no-checkpoint", "-q"]
    assert cli.main([*argv, "-o", "c.json", "--schema", "contract.json"]) == 0
    assert Rulebook.load("c.json").rule_schema == CONTRACT_SCHEMA
    assert cli.main([*argv, "-o", "n.json", "--schema", "nba"]) == 0
    assert Rulebook.load("n.json").rule_schema == NBA_SCHEMA
    capsys.readouterr()

    # A bad schema is refused before any call, naming the file and the property.
    bad = json.loads(json.dumps(CONTRACT))
    del bad["properties"]["party"][SIDE_KEY]
    Path("bad.json").write_text(json.dumps(bad), encoding="utf-8")
    calls = model.calls
    assert cli.main([*argv, "-o", "b.json", "--schema", "bad.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tag extract: error: Rule schema bad.json: property 'party'")
    assert err.count("\n") == 1
    assert model.calls == calls
    assert not Path("b.json").exists()
    assert cli.main([*argv, "-o", "b.json", "--schema", "nab"]) == 2
    assert (
        "no built-in schema has this name (condition, nba)" in capsys.readouterr().err
    )


def test_settings_refuse_an_unknown_schema_before_any_call() -> None:
    model = ExtractionFakeChatModel()
    with pytest.raises(RuleSchemaError, match="'nab'"):
        extract("nab", llm=model)
    assert model.calls == 0
