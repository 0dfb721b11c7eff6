"""Rule schemas (`rule_schemas.py`): built-ins, user-defined ones, and their checks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from langchain_tag.errors import RuleSchemaError
from langchain_tag.rule_schemas import (
    BUILT_IN_SCHEMAS,
    CONDITION_SCHEMA,
    NBA_SCHEMA,
    SIDE_KEY,
    RuleSchema,
    rule_schema,
)
from langchain_tag.rules import PROFILE_FIELDS, Rule


class Contract(BaseModel):
    """Contract obligations."""

    party: str = Field(
        description="Who is bound.", json_schema_extra={SIDE_KEY: "judge"}
    )
    trigger: str = Field(
        description="The event that starts the obligation.",
        json_schema_extra={SIDE_KEY: "judge"},
    )
    exceptions: str | None = Field(
        default=None,
        description="Cases the clause excludes.",
        json_schema_extra={SIDE_KEY: "judge"},
    )
    obligation: str = Field(
        description="What the party must do.", json_schema_extra={SIDE_KEY: "executor"}
    )
    deadline: str = Field(
        description="By when.", json_schema_extra={SIDE_KEY: "executor"}
    )


CONTRACT_JSON: dict[str, Any] = {
    "title": "contract",
    "description": "contract obligations",
    "type": "object",
    "properties": {
        "party": {"type": "string", "description": "Who is bound.", SIDE_KEY: "judge"},
        "trigger": {
            "type": "string",
            "description": "The event that starts the obligation.",
            SIDE_KEY: "judge",
        },
        "obligation": {
            "type": "string",
            "description": "What the party must do.",
            SIDE_KEY: "executor",
        },
    },
    "required": ["party", "trigger", "obligation"],
    "x-tag-judge-criteria": ["A clause binds only the party it names."],
}


def test_the_built_in_schemas() -> None:
    assert set(BUILT_IN_SCHEMAS) == {"condition", "nba"}
    assert [f.name for f in CONDITION_SCHEMA.judge_fields] == ["condition"]
    assert [f.name for f in CONDITION_SCHEMA.executor_fields] == ["action"]
    # The NBA schema writes the four fields the paper's NBA matcher reads.
    assert tuple(f.name for f in NBA_SCHEMA.judge_fields) == PROFILE_FIELDS
    assert [f.name for f in NBA_SCHEMA.executor_fields] == ["action"]
    assert not NBA_SCHEMA.fields[3].required  # does_not_apply_to may be null


def test_a_schema_from_a_pydantic_model() -> None:
    schema = RuleSchema.from_model(Contract)
    assert schema.name == "Contract"
    assert [(f.name, f.side, f.required) for f in schema.fields] == [
        ("party", "judge", True),
        ("trigger", "judge", True),
        ("exceptions", "judge", False),
        ("obligation", "executor", True),
        ("deadline", "executor", True),
    ]
    assert schema.fields[0].description == "Who is bound."
    assert RuleSchema.from_model(Contract, name="contracts").name == "contracts"


def test_a_schema_from_a_json_schema_file(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    path.write_text(json.dumps(CONTRACT_JSON), encoding="utf-8")
    schema = rule_schema(str(path))
    assert schema == RuleSchema.load(path)
    assert schema.name == "contract"
    assert schema.description == "contract obligations"
    assert schema.judge_criteria == ("A clause binds only the party it names.",)
    assert [f.name for f in schema.judge_fields] == ["party", "trigger"]
    # Nullable strings are text fields too.
    nullable = json.loads(json.dumps(CONTRACT_JSON))
    nullable["properties"]["trigger"]["type"] = ["string", "null"]
    assert RuleSchema.from_json_schema(nullable).fields[1].name == "trigger"


def test_schemas_by_name_or_as_given() -> None:
    assert rule_schema("condition") is CONDITION_SCHEMA
    assert rule_schema("nba") is NBA_SCHEMA
    assert rule_schema(NBA_SCHEMA) is NBA_SCHEMA
    with pytest.raises(
        RuleSchemaError, match=r"'nab': no built-in schema .*\(condition, nba\)"
    ):
        rule_schema("nab")


def _with(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(CONTRACT_JSON))
    for name, spec in changes.items():
        if spec is None:
            del data["properties"][name]
            data["required"].remove(name)
        else:
            data["properties"][name] = spec
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"title": "x"}, "has no `properties` object"),
        (
            _with(party={"type": "string", "description": "Who."}),
            f'property \'party\' needs "{SIDE_KEY}": "judge" or "executor"',
        ),
        (
            _with(party={"type": "string", SIDE_KEY: "judge"}),
            "property 'party' needs a description",
        ),
        (
            _with(party={"type": "integer", "description": "n", SIDE_KEY: "judge"}),
            "property 'party' is not a string field",
        ),
        (
            _with(party={"type": "string", "description": "who", SIDE_KEY: "both"}),
            "property 'party' needs",
        ),
        (
            _with(rule_id={"type": "string", "description": "id", SIDE_KEY: "judge"}),
            "'rule_id' is written by extraction itself",
        ),
        (
            _with(
                **{
                    "Party Name": {
                        "type": "string",
                        "description": "x",
                        SIDE_KEY: "judge",
                    }
                }
            ),
            "must be a lowercase identifier",
        ),
        (_with(obligation=None), "no required executor-side field"),
        # One field only: said by side too (before: "Tuple should have at least
        # 2 items", naming no property).
        (_with(obligation=None, trigger=None), "no required executor-side field"),
        (_with(party=None, trigger=None), "no required judge-side field"),
        (
            _with(action={"type": "string", "description": "do", SIDE_KEY: "judge"}),
            "action cannot be on the judge side",
        ),
        (
            _with(
                constraint={"type": "string", "description": "c", SIDE_KEY: "executor"}
            ),
            "constraint cannot be on the executor side",
        ),
    ],
)
def test_a_bad_schema_is_refused_naming_the_property(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(RuleSchemaError) as caught:
        RuleSchema.from_json_schema(data, where="contract.json")
    text = str(caught.value)
    assert text.startswith("Rule schema contract.json: ")
    assert message in text
    assert SIDE_KEY in text  # says how a field is declared


def test_a_bad_schema_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(RuleSchemaError, match=r"missing\.json: no such file"):
        rule_schema(str(missing))
    broken = tmp_path / "broken.json"
    broken.write_text('{"properties": ', encoding="utf-8")
    with pytest.raises(RuleSchemaError, match=r"broken\.json: is not JSON"):
        rule_schema(broken)


def test_rule_values_keep_the_executor_side_in_the_action_only() -> None:
    schema = RuleSchema.from_model(Contract)
    values = schema.rule_values(
        {
            "party": "the Supplier",
            "trigger": "a delivery is late",
            "exceptions": None,
            "obligation": "pay a 1% penalty",
            "deadline": "within 30 days",
        }
    )
    assert values == {
        "condition": "party: the Supplier; trigger: a delivery is late",
        "action": "obligation: pay a 1% penalty\ndeadline: within 30 days",
        "fields": {"party": "the Supplier", "trigger": "a delivery is late"},
    }
    rule = Rule(rule_id="R-1", name="Late delivery penalty", **values)
    assert "1%" not in json.dumps(rule.fields) + rule.condition


def test_rule_values_fill_the_rules_own_fields() -> None:
    values = NBA_SCHEMA.rule_values(
        {
            "applies_when": "a player signs with the Mid-Level Exception",
            "constraint": "at most 4 seasons",
            "violation_check": "the contract covers more than 4 seasons",
            "does_not_apply_to": "  ",
            "action": "Count the seasons.",
        }
    )
    assert values == {
        "condition": "a player signs with the Mid-Level Exception",
        "applies_when": "a player signs with the Mid-Level Exception",
        "constraint": "at most 4 seasons",
        "violation_check": "the contract covers more than 4 seasons",
        "action": "Count the seasons.",
    }
    assert CONDITION_SCHEMA.rule_values({"condition": "c", "action": "a"}) == {
        "condition": "c",
        "action": "a",
    }


def test_the_digest_follows_every_part_of_the_schema() -> None:
    schema = RuleSchema.from_model(Contract)
    assert schema.digest() == RuleSchema.from_model(Contract).digest()
    reworded = schema.model_copy(
        update={
            "fields": (
                schema.fields[0].model_copy(update={"description": "Who."}),
                *schema.fields[1:],
            )
        }
    )
    assert reworded.digest() != schema.digest()


def test_every_executor_field_reaches_the_action() -> None:
    schema = RuleSchema.from_json_schema(
        _with(
            action={"type": "string", "description": "do", SIDE_KEY: "executor"},
            deadline={"type": "string", "description": "by when", SIDE_KEY: "executor"},
        )
    )
    values = schema.rule_values(
        {
            "party": "p",
            "trigger": "t",
            "obligation": "pay",
            "action": "Pay the fee.",
            "deadline": "in 30 days",
        }
    )
    assert values["action"] == "Pay the fee.\nobligation: pay\ndeadline: in 30 days"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _with(
                model_config={"type": "string", "description": "x", SIDE_KEY: "judge"}
            ),
            "'model_config' is taken by pydantic",
        ),
        (
            {**CONTRACT_JSON, "x-tag-judge-criteria": "NO unless a party is named."},
            "`x-tag-judge-criteria` must be a list of sentences",
        ),
        ({**CONTRACT_JSON, "required": ["party", "parties"]}, "names no property"),
        (
            _with(party={"description": "who", SIDE_KEY: "judge"}),
            "'party' is not a string field (no type)",
        ),
    ],
)
def test_what_phase_3_could_not_write_is_refused(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(RuleSchemaError, match=re.escape(message)):
        RuleSchema.from_json_schema(data)


def test_a_nested_model_is_not_a_text_field() -> None:
    class Inner(BaseModel):
        amount: int

    class Nested(BaseModel):
        party: str = Field(description="who", json_schema_extra={SIDE_KEY: "judge"})
        inner: Inner = Field(description="x", json_schema_extra={SIDE_KEY: "executor"})

    with pytest.raises(RuleSchemaError, match="'inner' is not a string field"):
        RuleSchema.from_model(Nested)


def test_a_built_in_is_known_by_its_fields_not_its_wording() -> None:
    assert NBA_SCHEMA.built_in() is NBA_SCHEMA
    reworded = NBA_SCHEMA.model_copy(update={"description": "older wording"})
    assert reworded.built_in() is NBA_SCHEMA
    renamed = NBA_SCHEMA.model_copy(update={"name": "cba"})
    assert renamed.built_in() is None
    assert RuleSchema.from_model(Contract).built_in() is None
