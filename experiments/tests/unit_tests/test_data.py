"""`shared_data_dir`: the development data beside the checkout, from any folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_tag_experiments.data import DATA_DIR_ENV, shared_data_dir

CHECKOUT = Path(__file__).resolve().parents[3]


def test_the_data_beside_the_checkout_is_found_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: after the move to experiments/, it looked inside the checkout.
    beside = CHECKOUT.parent / "shared" / "data"
    if not beside.is_dir():
        pytest.skip(f"no shared data beside the checkout ({beside})")
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # as a notebook's kernel runs, in a copy
    found = shared_data_dir()
    assert found is not None
    assert found.resolve() == beside.resolve()  # shared/ may be a link (CI)


def test_an_explicit_directory_is_the_only_one_tried(tmp_path: Path) -> None:
    assert shared_data_dir(tmp_path) == tmp_path
    assert shared_data_dir(tmp_path / "missing") is None
