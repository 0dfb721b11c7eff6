"""The curated NPOV rulebook and the policy it was written from, as shipped.

`npov.rulebook.json` is written by hand from `npov-policy.md` (our paraphrase of the
ideas of Wikipedia's NPOV policy, not its text). These tests hold it to what an
extracted rulebook must satisfy: phase-5 faithfulness at the recorded offsets,
independent names, 1-3 tags, conditions separate from actions.
"""

from __future__ import annotations

import hashlib
import re

import pytest

from langchain_tag.extraction.verification import (
    FaithfulnessChecker,
    FaithfulnessMode,
    independence,
)
from langchain_tag.resources import curated_rulebook, document_name, resource_text
from langchain_tag.rules import FORMAT_VERSION, Rulebook

_SLUG = re.compile(r"npov-[a-z0-9]+(?:-[a-z0-9]+)*")
_MIN_WORDS = 3_000


@pytest.fixture(scope="module")
def rulebook() -> Rulebook:
    return curated_rulebook("npov")


@pytest.fixture(scope="module")
def policy() -> str:
    return resource_text(document_name("npov"))


def test_rulebook_loads(rulebook: Rulebook) -> None:
    assert rulebook.format_version == FORMAT_VERSION
    assert rulebook.domain
    assert "neutral point of view" in rulebook.domain.casefold()
    assert 40 <= len(rulebook) <= 65
    rulebook.check()  # unique ids, relations to rules of the rulebook


def test_labelled_curated_not_extracted(rulebook: Rulebook) -> None:
    curated = rulebook.diagnostics["curated"]
    assert curated["document"] == "npov-policy.md" == document_name("npov")
    assert "not extracted" in curated["note"]


def test_documents_describe_the_shipped_policy(rulebook: Rulebook, policy: str) -> None:
    [document] = rulebook.documents
    assert document.sha256 == hashlib.sha256(policy.encode("utf-8")).hexdigest()
    assert document.n_chars == len(policy)
    assert {rule.source_document_id for rule in rulebook.rules} == {
        document.document_id
    }


def test_source_text_is_verbatim_at_recorded_offsets(
    rulebook: Rulebook, policy: str
) -> None:
    for rule in rulebook.rules:
        assert rule.source is not None, rule.rule_id
        assert rule.source_text.strip(), rule.rule_id
        assert policy[rule.source.start : rule.source.end] == rule.source_text, (
            rule.rule_id
        )


@pytest.mark.parametrize("mode", ["corrected", "literal"])
def test_phase5_faithfulness_passes_for_every_rule(
    rulebook: Rulebook, policy: str, mode: FaithfulnessMode
) -> None:
    checker = FaithfulnessChecker(policy, mode=mode)
    for rule in rulebook.rules:
        result = checker.check(rule.source_text)
        assert result.faithful, rule.rule_id
        assert result.exact, rule.rule_id


def test_recorded_verification_matches_a_fresh_check(
    rulebook: Rulebook, policy: str
) -> None:
    recorded = rulebook.diagnostics["verification"]
    checker = FaithfulnessChecker(policy)
    faithful = sum(checker.check(rule.source_text).faithful for rule in rulebook.rules)
    assert recorded["checked"] == recorded["faithful"] == faithful == len(rulebook)
    assert recorded["faithfulness"] == 1.0
    assert recorded["unfaithful_removed"] == []
    assert recorded["independence"] == 1.0
    coverage = recorded["coverage"]
    assert 0 < coverage["covered"] <= coverage["spans"]
    assert len(coverage["uncovered_sentences"]) == (
        coverage["spans"] - coverage["covered"]
    )


def test_names_and_ids_are_independent(rulebook: Rulebook) -> None:
    result = independence([rule.name for rule in rulebook.rules])
    assert result.ratio == 1.0
    assert result.shared_names == {}
    ids = [rule.rule_id for rule in rulebook.rules]
    assert len(set(ids)) == len(ids)
    assert all(_SLUG.fullmatch(rule_id) for rule_id in ids), ids


def test_rule_shape(rulebook: Rulebook) -> None:
    for rule in rulebook.rules:
        assert 1 <= len(rule.tags) <= 3, rule.rule_id
        assert len(set(rule.tags)) == len(rule.tags), rule.rule_id
        assert 3 <= len(rule.name.split()) <= 8, rule.rule_id
        assert rule.lineage.normative_type is not None, rule.rule_id


def test_conditions_do_not_carry_the_action(rulebook: Rulebook) -> None:
    # The judge sees the condition but never the action: keep them apart.
    for rule in rulebook.rules:
        condition = " ".join(rule.condition.split()).casefold()
        action = " ".join(rule.action.split()).casefold()
        assert condition != action, rule.rule_id
        assert action not in condition, rule.rule_id


def test_policy_is_a_disclosed_paraphrase(policy: str) -> None:
    opening = " ".join(policy[:1_000].split())
    assert opening.startswith("# ")
    assert 'paraphrases the ideas of Wikipedia\'s "Neutral point of view"' in opening
    assert "written for langchain-tag" in opening
    assert "not Wikipedia's text" in opening
    assert "CC BY-SA" in opening
    assert len(policy.split()) >= _MIN_WORDS
    assert len(re.findall(r"^## ", policy, flags=re.MULTILINE)) >= 5
