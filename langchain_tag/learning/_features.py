"""What the learned prefilter sees of an input: hashed word n-grams, then TF-IDF.

- **Hashing** (`FeatureHashing`): word 1-2-grams counted into 2**20 buckets, the
  scheme of scikit-learn's `HashingVectorizer`, so the verdict log that keeps no
  text (`HashedFeatures`) and the learner agree on every row.
- **TF-IDF** (`tf_idf_matrix`): sublinear TF weighted with the training inputs'
  document frequencies, rows L2-normalised (scikit-learn's `TfidfTransformer`);
  buckets seen in fewer than `min_df` training inputs are dropped.
  `tf_idf_row` applies the trained weighting to one input at selection time.

Both need scikit-learn and SciPy (the `learned` extra); importing this module
does not.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "FeatureHashing",
    "HashedFeatures",
    "hashed_rows",
    "tf_idf_matrix",
    "tf_idf_row",
]

Floats = npt.NDArray[np.float64]

_EXTRA_HINT = (
    "The learned prefilter hashes its features with scikit-learn: install the "
    "`learned` extra (`pip install 'langchain-tag[learned]'`)."
)


class HashedFeatures(BaseModel):
    """An input as hashed word n-gram counts: what the learner needs of it, no text.

    The sparse row `HashingVectorizer(**FeatureHashing(...).vectorizer_options())`
    gives for the text: bucket indices (ascending) and term counts.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheme: str = Field(description="`FeatureHashing.scheme` of the hashing used.")
    indices: tuple[int, ...]
    counts: tuple[int, ...]

    @model_validator(mode="after")
    def _consistent(self) -> HashedFeatures:
        if len(self.indices) != len(self.counts):
            msg = (
                f"{len(self.indices)} indices but {len(self.counts)} counts: "
                "each bucket needs its count"
            )
            raise ValueError(msg)
        if any(b <= a for a, b in zip(self.indices, self.indices[1:], strict=False)):
            msg = "indices must be strictly ascending"
            raise ValueError(msg)
        if any(c < 1 for c in self.counts):
            msg = "counts must be at least 1"
            raise ValueError(msg)
        return self


class FeatureHashing(BaseModel):
    """How inputs become hashed features: word n-grams counted into buckets.

    The scheme is scikit-learn's `HashingVectorizer` (signed 32-bit MurmurHash3,
    no alternate sign, no normalisation), so a row is the same wherever it is
    computed: by the verdict log that keeps no text, or by the learner at training
    and selection time. Changing any field changes `scheme`, and features hashed
    under another scheme are refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_features: int = Field(default=2**20, ge=2**10, le=2**26)
    """Buckets; at 2**20 two n-grams of one rulebook's inputs rarely collide."""
    ngram_max: int = Field(default=2, ge=1, le=3)
    """Longest word n-gram counted (1: words only)."""
    token_pattern: str = r"(?u)\b\w+\b"  # noqa: S105 - a regex, not a secret
    """What a word is; single characters count, so "3-year" keeps its "3"."""
    lowercase: bool = True

    @property
    def scheme(self) -> str:
        """A short fingerprint of these settings, stored with hashed features."""
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return "hv1-" + hashlib.sha256(payload.encode()).hexdigest()[:16]

    def vectorizer_options(self) -> dict[str, Any]:
        """The `HashingVectorizer` arguments that reproduce this hashing."""
        return {
            "n_features": self.n_features,
            "ngram_range": (1, self.ngram_max),
            "token_pattern": self.token_pattern,
            "lowercase": self.lowercase,
            "alternate_sign": False,
            "norm": None,
        }

    def hash_matrix(self, texts: Sequence[str]) -> Any:
        """The hashed counts of `texts`, one CSR row each (a SciPy sparse matrix).

        Raises:
            ImportError: scikit-learn (the `learned` extra) is not installed.
        """
        return _vectorizer(self).transform(texts)

    def hash(self, text: str) -> HashedFeatures:
        """The hashed counts of one text."""
        row = self.hash_matrix([text])
        row.sort_indices()
        return HashedFeatures(
            scheme=self.scheme,
            indices=tuple(int(i) for i in row.indices),
            counts=tuple(round(float(c)) for c in row.data),
        )


@functools.lru_cache(maxsize=8)
def _vectorizer(hashing: FeatureHashing) -> Any:
    try:
        from sklearn.feature_extraction.text import (  # type: ignore[import-untyped]  # noqa: PLC0415 - optional extra
            HashingVectorizer,
        )
    except ImportError as error:
        raise ImportError(_EXTRA_HINT) from error
    return HashingVectorizer(**hashing.vectorizer_options())


def hashed_rows(hashing: FeatureHashing, inputs: Sequence[str | HashedFeatures]) -> Any:
    """One CSR matrix of hashed counts for texts and pre-hashed rows, in order.

    Raises:
        ValueError: Pre-hashed features use another scheme than `hashing`.
        ImportError: scikit-learn (the `learned` extra) is not installed.
    """
    from scipy import sparse  # type: ignore[import-untyped]  # noqa: PLC0415 - with sklearn

    texts = [x for x in inputs if isinstance(x, str)]
    hashed = hashing.hash_matrix(texts) if texts else sparse.csr_matrix((0, 0))
    hashed.sort_indices()
    indices: list[npt.NDArray[Any]] = []
    counts: list[npt.NDArray[Any]] = []
    next_text = 0
    for item in inputs:
        if isinstance(item, str):
            start, end = hashed.indptr[next_text], hashed.indptr[next_text + 1]
            indices.append(hashed.indices[start:end])
            counts.append(hashed.data[start:end])
            next_text += 1
            continue
        if item.scheme != hashing.scheme:
            msg = (
                f"An example's features were hashed under scheme {item.scheme!r}, "
                f"this prefilter uses {hashing.scheme!r}: give the prefilter the "
                "verdict log's FeatureHashing, or train from texts."
            )
            raise ValueError(msg)
        indices.append(np.asarray(item.indices))
        counts.append(np.asarray(item.counts))
    indptr = np.cumsum([0, *(len(row) for row in indices)])
    return sparse.csr_matrix(
        (
            np.concatenate([np.zeros(0), *counts]).astype(np.float64),
            np.concatenate([np.zeros(0), *indices]).astype(np.int64),
            indptr,
        ),
        shape=(len(inputs), hashing.n_features),
    )


def tf_idf_matrix(
    counts: Any, min_df: int
) -> tuple[npt.NDArray[np.int64], Floats, Any]:
    """Columns kept (>= `min_df` inputs), their IDF, and the unit TF-IDF rows.

    scikit-learn's `TfidfTransformer` with sublinear TF and smoothed IDF:
    `(1 + ln tf) * (ln((1 + n) / (1 + df)) + 1)`, rows L2-normalised; an input
    with no kept feature stays a zero row (only the bias scores it).
    """
    from scipy import sparse  # noqa: PLC0415 - with sklearn
    from sklearn.feature_extraction.text import (  # noqa: PLC0415 - optional extra
        TfidfTransformer,
    )

    counts.sum_duplicates()
    buckets, df = np.unique(counts.indices, return_counts=True)
    columns = buckets[df >= min_df].astype(np.int64)
    if not len(columns) or not counts.shape[0]:
        return (
            columns,
            np.zeros(len(columns)),
            sparse.csr_matrix((counts.shape[0], len(columns))),
        )
    transformer = TfidfTransformer(
        norm="l2", use_idf=True, smooth_idf=True, sublinear_tf=True
    )
    matrix = transformer.fit_transform(counts[:, columns].astype(np.float64))
    return columns, np.asarray(transformer.idf_, dtype=np.float64), matrix


def tf_idf_row(
    columns: npt.NDArray[np.int64],
    idf: Floats,
    indices: npt.NDArray[Any],
    counts: npt.NDArray[Any],
) -> tuple[npt.NDArray[np.int64], Floats] | None:
    """Positions among `columns` and unit TF-IDF weights of one row, or None.

    What `TfidfTransformer.transform` gives for one row (sublinear TF, the
    training IDF, L2 norm), hand-written because it runs on every selection and is
    faster for one row: 13 us vs 774 us for `transform` (NBA model, 901 columns),
    10 us vs 782 us (ObliQA, 2,225), measured on the datasets of
    `benchmarks/bench_learned_prefilter.py`.
    """
    positions = np.searchsorted(columns, indices)
    inside = positions < len(columns)
    inside[inside] = columns[positions[inside]] == indices[inside]
    if not inside.any():
        return None
    kept = positions[inside]
    values = (1.0 + np.log(counts[inside].astype(np.float64))) * idf[kept]
    return kept, values / np.linalg.norm(values)
