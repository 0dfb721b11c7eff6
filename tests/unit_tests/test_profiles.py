"""Profiles of rule schemas (`matching/profiles.py`): what the judge sees of them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from langchain_tag import Rule, Rulebook, TAGRetriever
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.matching.profiles import (
    CONDITION_PROFILE,
    NBA_PROFILE,
    RuleSchemaProfile,
    YesNoOutput,
    profile_for,
    schema_profile,
)
from langchain_tag.rule_schemas import (
    CONDITION_SCHEMA,
    NBA_SCHEMA,
    RuleSchema,
    SchemaField,
)
from langchain_tag.testing import RuleAwareFakeChatModel

CONTRACT = RuleSchema(
    name="contract",
    fields=(
        SchemaField(name="party", description="Who is bound.", side="judge"),
        SchemaField(
            name="trigger", description="The event that starts it.", side="judge"
        ),
        SchemaField(
            name="obligation", description="What the party must do.", side="executor"
        ),
    ),
    judge_criteria=("A clause binds only the party it names.",),
)


def contract_rule(n: int, trigger: str) -> Rule:
    values = CONTRACT.rule_values(
        {
            "party": "the Supplier",
            "trigger": f"the input reports `{trigger}`",
            "obligation": f"SECRET-OBLIGATION-{n}: pay the penalty",
        }
    )
    return Rule(rule_id=f"C-{n}", name=f"Clause {n}", tags=("delivery",), **values)


def test_the_built_in_schemas_keep_their_profiles() -> None:
    assert schema_profile(CONDITION_SCHEMA) is CONDITION_PROFILE
    assert schema_profile(NBA_SCHEMA) is NBA_PROFILE


def test_a_user_schema_is_judged_by_its_judge_side_fields() -> None:
    profile = schema_profile(CONTRACT)
    assert profile.rule_fields == ("rule_id", "name", "party", "trigger", "tags")
    assert profile.schema_fields == ("party", "trigger")
    assert "- party: Who is bound." in profile.system_prompt
    assert "- A clause binds only the party it names." in profile.system_prompt
    assert "obligation" not in profile.system_prompt
    rule = contract_rule(1, "late delivery")
    assert profile.judged_fields(rule) == [
        ("rule_id", "C-1"),
        ("name", "Clause 1"),
        ("party", "the Supplier"),
        ("trigger", "the input reports `late delivery`"),
        ("tags", "delivery"),
    ]


@pytest.mark.parametrize(
    "options", [{}, {"rationale": True}, {"rules_per_call": 2}], ids=str
)
def test_the_judge_never_sees_the_executor_side(options: dict[str, object]) -> None:
    llm = RuleAwareFakeChatModel()
    judge = ApplicabilityJudge(llm=llm, profile=schema_profile(CONTRACT), **options)
    rules = [contract_rule(1, "late delivery"), contract_rule(2, "a price change")]
    verdicts = judge.judge_rules("Our shipment came as a late delivery.", rules)
    assert [v.applies for v in verdicts] == [True, False]
    assert llm.prompts
    assert all("SECRET-OBLIGATION" not in prompt for prompt in llm.prompts)
    assert all("the Supplier" in prompt for prompt in llm.prompts)


def test_two_schemas_sharing_a_name_keep_their_verdicts_apart() -> None:
    reworded = CONTRACT.model_copy(
        update={"judge_criteria": ("A clause binds every party.",)}
    )
    rule = contract_rule(1, "late delivery")
    keys = {
        ApplicabilityJudge(
            llm=RuleAwareFakeChatModel(), profile=schema_profile(schema)
        ).cache_key("late delivery", rule)
        for schema in (CONTRACT, reworded)
    }
    assert len(keys) == 2
    assert schema_profile(CONTRACT).name.startswith("schema:contract:")


def test_a_profile_reads_only_the_schema_fields_it_declares() -> None:
    with pytest.raises(ValidationError, match=r"unknown rule fields .*'party'"):
        RuleSchemaProfile(
            name="typo",
            system_prompt="s",
            output_instruction="o",
            rule_fields=("rule_id", "party"),
            output_schema=YesNoOutput,
        )


def test_a_rulebook_is_judged_by_the_profile_of_its_schema() -> None:
    plain = Rulebook.from_rules(
        [Rule(rule_id="R", name="n", condition="c", action="a")]
    )
    assert profile_for(plain) is CONDITION_PROFILE
    contracts = Rulebook(rules=[contract_rule(1, "late")], rule_schema=CONTRACT)
    assert profile_for(contracts) == schema_profile(CONTRACT)
    nba = Rulebook(rules=[], rule_schema=NBA_SCHEMA)
    assert profile_for(nba) is NBA_PROFILE
    # The retriever judges a rulebook by its schema unless given a judge.
    llm = RuleAwareFakeChatModel()
    retriever = TAGRetriever.from_rulebook(contracts, llm=llm)
    assert isinstance(retriever.judge, ApplicabilityJudge)
    assert retriever.judge.profile == schema_profile(CONTRACT)
    docs = retriever.invoke("It was a late delivery.")
    assert [d.metadata["rule_id"] for d in docs] == ["C-1"]
    assert docs[0].page_content == "obligation: SECRET-OBLIGATION-1: pay the penalty"
    assert all("SECRET-OBLIGATION" not in p for p in llm.prompts)


def test_a_rulebook_with_its_schema_survives_a_round_trip(tmp_path: object) -> None:
    rulebook = Rulebook(rules=[contract_rule(1, "late")], rule_schema=CONTRACT)
    again = Rulebook.from_json(rulebook.model_dump_json())
    assert again == rulebook
    assert again.rule_schema == CONTRACT
