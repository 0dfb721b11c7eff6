"""Shared fixtures: the project's test fixtures and the optional real data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from langchain_tag import Rulebook

FIXTURES = Path(__file__).parent / "fixtures"
REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path | None:
    """`TAG_DATA_DIR`, else `../shared/data` beside the repository, if it exists."""
    configured = os.environ.get("TAG_DATA_DIR")
    candidate = Path(configured) if configured else REPO_ROOT.parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


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
