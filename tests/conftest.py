"""Shared fixtures: the project's test fixtures and the optional real data."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_tag_experiments.data import shared_data_dir

from langchain_tag import Rulebook

__all__ = ["FIXTURES", "data_dir", "pep8_rulebook", "shared_data_dir"]

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def data_dir() -> Path:
    """The real data set directory; skips the test when it is absent."""
    found = shared_data_dir()
    if found is None:
        pytest.skip(
            "real data not found: set TAG_DATA_DIR or place shared/data beside the "
            "repository (CI does)"
        )
    return found


@pytest.fixture
def pep8_rulebook() -> Rulebook:
    """Nine hand-written PEP 8 rules with verbatim sources (tests/fixtures)."""
    return Rulebook.load(FIXTURES / "pep8_rulebook.json")
