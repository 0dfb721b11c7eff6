"""The learned prefilter's file: an `.npz` of arrays and one JSON header.

Read with `allow_pickle=False` (nothing executable), written atomically. Version
2 keeps every rule's skipping options, to re-threshold on load; version 1 (one
threshold per rule) still loads, as it was trained.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from pydantic import ValidationError

from langchain_tag.learning._features import FeatureHashing
from langchain_tag.learning._fit_records import FitReport
from langchain_tag.learning._training import TrainedModel
from langchain_tag.rules import Rulebook, _atomic_write_bytes

__all__ = ["FORMAT_VERSION", "read_model", "write_model"]

FORMAT_VERSION = 2
"""Version of the saved-model file format this release writes (it reads 1 and 2;
version 2 keeps every rule's skipping options, to re-threshold on load)."""

_FORMAT_NAME = "langchain-tag-learned-prefilter"
_ARRAYS = {
    1: ("columns", "idf", "weights", "bias", "thresholds"),
    2: ("columns", "idf", "weights", "bias", "options", "offsets", "chosen"),
}


def write_model(model: TrainedModel, path: str | os.PathLike[str]) -> Path:
    """Write `model` to `path` atomically; returns the path written."""
    header = {
        "format": _FORMAT_NAME,
        "version": FORMAT_VERSION,
        "hashing": model.hashing.model_dump(mode="json"),
        "rule_ids": list(model.rule_ids),
        "rule_hashes": list(model.rule_hashes),
        "trained_rules": dict(model.trained_rules),
        "yes_rate_total": model.yes_rate_total,
        "report": model.report.model_dump(mode="json"),
    }
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
        columns=model.columns,
        idf=model.idf,
        weights=model.weights,
        bias=model.bias,
        options=model.options,
        offsets=model.offsets,
        chosen=model.chosen,
    )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(target, buffer.getvalue())
    return target


def read_model(path: str | os.PathLike[str], rulebook: Rulebook) -> TrainedModel:
    """The model saved at `path` (`rulebook`: the rules of a version-1 file).

    Raises:
        ValueError: The file is not a saved learned prefilter, is of an unknown
            version, or is corrupt; the message names the file.
    """
    arrays = _read_arrays(path)
    header = arrays.pop("header")
    try:
        hashing = FeatureHashing.model_validate(header["hashing"])
        report = FitReport.model_validate(header["report"])
        options = (
            _options_v1(header, arrays, report, rulebook)
            if header["version"] == 1
            else {
                "options": arrays["options"].astype(np.float64),
                "offsets": arrays["offsets"].astype(np.int64),
                "chosen": arrays["chosen"].astype(np.int64),
                "yes_rate_total": float(header["yes_rate_total"]),
                "trained_rules": MappingProxyType(dict(header["trained_rules"])),
            }
        )
        model = TrainedModel(
            hashing=hashing,
            columns=arrays["columns"].astype(np.int64),
            idf=arrays["idf"].astype(np.float64),
            rule_ids=tuple(header["rule_ids"]),
            rule_hashes=tuple(header["rule_hashes"]),
            weights=arrays["weights"].astype(np.float32),
            bias=arrays["bias"].astype(np.float64),
            report=report,
            **options,
        )
    except (KeyError, TypeError, ValueError, ValidationError) as error:
        msg = f"{path}: a malformed learned-prefilter header ({error})."
        raise ValueError(msg) from error
    _check_shapes(model, path)
    return model


def _read_arrays(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header (as a dict) and the arrays of a saved model, checked for format."""
    try:
        with np.load(Path(path), allow_pickle=False) as arrays:
            header = json.loads(bytes(arrays["header"]).decode())
            version = header.get("version")
            names = (
                _ARRAYS.get(version, ()) if header.get("format") == _FORMAT_NAME else ()
            )
            loaded: dict[str, Any] = {name: np.asarray(arrays[name]) for name in names}
    except (OSError, KeyError, ValueError, AttributeError, zipfile.BadZipFile) as error:
        msg = f"{path}: not a saved learned prefilter ({error})."
        raise ValueError(msg) from error
    if not loaded:
        msg = (
            f"{path}: format {header.get('format')!r} version {version!r}; "
            f"this release reads versions 1 to {FORMAT_VERSION}. Train again."
        )
        raise ValueError(msg)
    loaded["header"] = header
    return loaded


def _options_v1(
    header: dict[str, Any],
    arrays: dict[str, Any],
    report: FitReport,
    rulebook: Rulebook,
) -> dict[str, Any]:
    """A version-1 file's skipping options: one threshold per rule, no YES rate."""
    rule_ids = header["rule_ids"]
    thresholds = arrays["thresholds"].astype(np.float64)
    options = []
    for rule_id, threshold in zip(rule_ids, thresholds.tolist(), strict=True):
        fit = report.rules[rule_id]
        options += [
            (-math.inf, 0.0, 0.0),
            (threshold, fit.expected_miss, fit.expected_skip),
        ]
    trained = {rule.rule_id: rule.content_hash() for rule in rulebook.rules}
    trained.update(zip(rule_ids, header["rule_hashes"], strict=True))
    return {
        "options": np.asarray(options, dtype=np.float64).reshape(-1, 3),
        "offsets": np.arange(0, 2 * len(rule_ids) + 1, 2, dtype=np.int64),
        "chosen": np.ones(len(rule_ids), dtype=np.int64),
        "yes_rate_total": None,
        "trained_rules": MappingProxyType(trained),
    }


def _check_shapes(model: TrainedModel, path: str | os.PathLike[str]) -> None:
    d, r = len(model.columns), len(model.rule_ids)
    expected = {
        "idf": (model.idf.shape, (d,)),
        "weights": (model.weights.shape, (d, r)),
        "bias": (model.bias.shape, (r,)),
        "offsets": (model.offsets.shape, (r + 1,)),
        "chosen": (model.chosen.shape, (r,)),
        "options": (model.options.shape, (len(model.options), 3)),
        "rule_hashes": ((len(model.rule_hashes),), (r,)),
    }
    for name, (shape, wanted) in expected.items():
        if shape != wanted:
            msg = f"{path}: {name} has shape {shape}, expected {wanted}."
            raise ValueError(msg)
    sizes = np.diff(model.offsets)
    if (
        r
        and (
            model.offsets[0] != 0
            or model.offsets[-1] != len(model.options)
            or (sizes < 1).any()
            or (model.chosen < 0).any()
            or (model.chosen >= sizes).any()
        )
    ) or any(rule_id not in model.report.rules for rule_id in model.rule_ids):
        msg = f"{path}: inconsistent skipping options."
        raise ValueError(msg)
