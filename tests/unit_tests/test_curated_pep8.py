"""The curated PEP 8 rulebook shipped in `langchain_tag.resources`.

Written by hand, not extracted: these tests hold it to the rule record of the method
and to phase 5's checks against the shipped PEP 8 text.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from langchain_tag.extraction.verification import (
    FaithfulnessChecker,
    check_faithfulness,
    independence,
)
from langchain_tag.resources import curated_rulebook, document_name, resource_text
from langchain_tag.rules import Rulebook

DOCUMENT = "pep-0008.rst"


@pytest.fixture(scope="module")
def rulebook() -> Rulebook:
    return curated_rulebook("pep8")


@pytest.fixture(scope="module")
def pep8() -> str:
    return resource_text(DOCUMENT)


def test_it_loads_and_is_labelled_curated(rulebook: Rulebook) -> None:
    assert 60 <= len(rulebook) <= 90
    assert rulebook.domain == "PEP 8 — Style Guide for Python Code"
    curated = rulebook.diagnostics["curated"]
    assert curated["document"] == DOCUMENT == document_name("pep8")
    assert "not extracted by an LLM" in curated["note"]
    rulebook.check()  # unique ids, no dangling relations


def test_it_records_the_shipped_document(rulebook: Rulebook, pep8: str) -> None:
    (document,) = rulebook.documents
    assert document.document_id == "pep-0008"
    assert document.source == DOCUMENT
    assert document.n_chars == len(pep8)
    assert document.sha256 == hashlib.sha256(pep8.encode("utf-8")).hexdigest()


def test_every_source_is_verbatim_at_its_offsets(rulebook: Rulebook, pep8: str) -> None:
    for rule in rulebook.rules:
        assert rule.source is not None, rule.rule_id
        assert rule.source.document_id == "pep-0008"
        assert rule.source_text.strip(), rule.rule_id
        assert pep8[rule.source.start : rule.source.end] == rule.source_text
    starts = [rule.source.start for rule in rulebook.rules if rule.source]
    assert starts == sorted(starts)  # in document order


def test_phase_5_faithfulness_passes(rulebook: Rulebook, pep8: str) -> None:
    for mode in ("corrected", "literal"):
        checker = FaithfulnessChecker(pep8, mode=mode)
        results = [checker.check(rule.source_text) for rule in rulebook.rules]
        assert all(r.faithful and r.exact for r in results), mode
    # The reference implementation agrees (one rule: it is slow).
    assert check_faithfulness(
        rulebook.rules[0].source_text, pep8, method="reference"
    ).exact
    figures = rulebook.diagnostics["verification"]
    assert figures["checked"] == figures["faithful"] == figures["exact"]
    assert figures["faithful"] == len(rulebook)
    assert figures["faithfulness"] == 1.0
    assert figures["unfaithful_removed"] == []


def test_names_are_unique_and_distinctive(rulebook: Rulebook) -> None:
    result = independence([rule.name for rule in rulebook.rules])
    assert result.ratio == 1.0
    assert result.shared_names == {}
    assert rulebook.diagnostics["verification"]["independence"] == 1.0
    for rule in rulebook.rules:
        assert re.fullmatch(r"pep8-[a-z0-9]+(-[a-z0-9]+)*", rule.rule_id)
        assert 3 <= len(rule.name.split()) <= 8, rule.name


def test_every_rule_is_operational(rulebook: Rulebook) -> None:
    for rule in rulebook.rules:
        assert 1 <= len(rule.tags) <= 3, rule.rule_id
        assert len(set(rule.tags)) == len(rule.tags)
        assert rule.condition.strip() != rule.action.strip()
        assert rule.lineage.normative_type is not None


@pytest.mark.requires_data
def test_the_shipped_pep8_is_the_shared_one(data_dir: Path, pep8: str) -> None:
    shared = (data_dir / "pep8" / DOCUMENT).read_bytes()
    assert pep8.encode("utf-8") == shared
