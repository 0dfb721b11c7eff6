"""The learned prefilter's file: round trip, refusals, older formats."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from langchain_tag.learning.learned_prefilter import LearnedPrefilter
from tests.unit_tests.test_learned_prefilter import (
    QUIET_TEXT,
    RULE_IDS,
    RULES,
    examples,
    make_inputs,
    train_prefilter,
)


@pytest.fixture(scope="module")
def trained() -> LearnedPrefilter:
    return train_prefilter()


# --- persistence ---------------------------------------------------------------------


def test_save_and_load_round_trip(trained: LearnedPrefilter, tmp_path: Path) -> None:
    path = trained.save(tmp_path / "models" / "prefilter.npz")
    assert [p.name for p in path.parent.iterdir()] == ["prefilter.npz"]  # no temp
    loaded = LearnedPrefilter.load(path, RULES)
    assert loaded.report == trained.report
    for text, _ in make_inputs(20, seed=9):
        assert loaded.select(text) == trained.select(text)
        assert loaded.margins(text) == pytest.approx(trained.margins(text), abs=1e-5)
    with np.load(path, allow_pickle=False) as arrays:  # nothing pickled inside
        assert set(arrays.files) >= {"header", "weights", "options", "chosen"}


def test_loading_refuses_what_is_not_a_saved_model(
    trained: LearnedPrefilter, tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="not a saved learned prefilter"):
        LearnedPrefilter.load(garbage, RULES)
    path = trained.save(tmp_path / "model.npz")
    with zipfile.ZipFile(path) as archive:
        kept = {n: archive.read(n) for n in archive.namelist() if n != "bias.npy"}
    truncated = tmp_path / "truncated.npz"
    with zipfile.ZipFile(truncated, "w") as archive:
        for name, data in kept.items():
            archive.writestr(name, data)
    with pytest.raises(ValueError, match="not a saved learned prefilter"):
        LearnedPrefilter.load(truncated, RULES)


def test_an_untrained_prefilter_has_nothing_to_save(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not trained"):
        LearnedPrefilter(RULES).save(tmp_path / "x.npz")


# --- re-thresholding on load ---------------------------------------------------------


@pytest.mark.parametrize("target", [0.8, 0.99, 1.0])
def test_loading_at_another_target_re_thresholds(
    trained: LearnedPrefilter, tmp_path: Path, target: float
) -> None:
    """Before, `load(..., target_recall=x)` kept the saved thresholds silently."""
    path = trained.save(tmp_path / "model.npz")
    loaded = LearnedPrefilter.load(path, RULES, target_recall=target)
    refitted = LearnedPrefilter(RULES, target_recall=target)
    refitted.fit(examples(make_inputs(200, seed=1)))
    assert loaded.target_recall == target
    assert loaded.report is not None
    assert refitted.report is not None
    assert loaded.report.target_recall == target
    assert loaded.report.rules == refitted.report.rules
    assert loaded.report.expected_recall == pytest.approx(
        refitted.report.expected_recall
    )
    for text, _ in make_inputs(30, seed=9):
        assert loaded.select(text) == refitted.select(text)
    assert trained.report is not None
    saved = trained.report.expected_judged
    if target > trained.target_recall:
        assert loaded.report.expected_judged > saved
    else:
        assert loaded.report.expected_judged <= saved
    if target == 1.0:  # a recall target of one skips nothing
        assert loaded.select(QUIET_TEXT) == RULE_IDS


def test_a_model_without_options_refuses_another_target(
    trained: LearnedPrefilter, tmp_path: Path
) -> None:
    """A version-1 file loads as it was; it cannot be re-thresholded."""
    assert trained.report is not None
    path = trained.save(tmp_path / "model.npz")
    with np.load(path, allow_pickle=False) as arrays:
        header = json.loads(bytes(arrays["header"]).decode())
        kept = np.flatnonzero(arrays["chosen"] > 0)
        offsets, chosen = arrays["offsets"], arrays["chosen"]
        thresholds = arrays["options"][offsets[:-1] + chosen, 0][kept]
        old = {
            "columns": arrays["columns"],
            "idf": arrays["idf"],
            "weights": arrays["weights"][:, kept],
            "bias": arrays["bias"][kept],
            "thresholds": thresholds,
        }
    header = {
        **{
            k: v
            for k, v in header.items()
            if k not in {"trained_rules", "yes_rate_total"}
        },
        "version": 1,
        "rule_ids": [header["rule_ids"][i] for i in kept],
        "rule_hashes": [header["rule_hashes"][i] for i in kept],
    }
    v1 = tmp_path / "v1.npz"
    with v1.open("wb") as out:
        np.savez_compressed(
            out, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **old
        )
    loaded = LearnedPrefilter.load(v1, RULES)
    for text, _ in make_inputs(20, seed=9):
        assert loaded.select(text) == trained.select(text)
    same = LearnedPrefilter.load(v1, RULES, target_recall=trained.report.target_recall)
    assert same.select(QUIET_TEXT) == trained.select(QUIET_TEXT)
    with pytest.raises(ValueError, match=r"v1\.npz.*re-threshold.*Train it again"):
        LearnedPrefilter.load(v1, RULES, target_recall=0.99)


def test_a_file_saved_before_internal_targets_loads(
    trained: LearnedPrefilter, tmp_path: Path
) -> None:
    path = trained.save(tmp_path / "model.npz")
    loaded = LearnedPrefilter.load(path, RULES)
    assert loaded.report is not None
    assert loaded.report.internal_target == 0.95
    with np.load(path, allow_pickle=False) as arrays:
        header = json.loads(bytes(arrays["header"]).decode())
        saved = {name: arrays[name] for name in arrays.files if name != "header"}
    del header["report"]["internal_target"], header["report"]["skipped"]
    older = tmp_path / "older.npz"
    np.savez(
        older, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **saved
    )
    report = LearnedPrefilter.load(older, RULES).report
    assert report is not None
    assert (report.internal_target, report.skipped) == (0.95, 0)
    assert LearnedPrefilter.load(older, RULES).select(QUIET_TEXT) == trained.select(
        QUIET_TEXT
    )
