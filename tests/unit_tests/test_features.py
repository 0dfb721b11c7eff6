"""Features: scikit-learn's hashing, TF-IDF for training and for one input."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse  # type: ignore[import-untyped]
from sklearn.feature_extraction.text import (  # type: ignore[import-untyped]
    HashingVectorizer,
)

from langchain_tag.learning._features import (
    FeatureHashing,
    HashedFeatures,
    hashed_rows,
    tf_idf_matrix,
    tf_idf_row,
)


def test_hashing_is_sklearns_hashing_vectorizer() -> None:
    hashing = FeatureHashing()
    text = "A 3-year contract, a 3-year CONTRACT; trigger-001."
    features = hashing.hash(text)
    row = HashingVectorizer(**hashing.vectorizer_options()).transform([text])
    row.sort_indices()
    assert features.indices == tuple(row.indices.tolist())
    assert features.counts == tuple(int(c) for c in row.data)
    assert features.scheme == hashing.scheme
    assert FeatureHashing(ngram_max=1).scheme != hashing.scheme
    assert sum(features.counts) == 10 + 9  # 10 words ("a", "3", "year", ...), 9 pairs


def test_hashed_features_are_checked() -> None:
    with pytest.raises(ValueError, match="ascending"):
        HashedFeatures(scheme="s", indices=(3, 1), counts=(1, 1))
    with pytest.raises(ValueError, match="each bucket needs its count"):
        HashedFeatures(scheme="s", indices=(1,), counts=())


TEXTS = [
    "alpha trigger-001 beta beta gamma",
    "beta gamma delta trigger-002",
    "alpha alpha delta epsilon",
    "gamma trigger-001 epsilon zeta",
    "eta theta iota",
]


def test_texts_and_hashed_features_make_the_same_rows() -> None:
    hashing = FeatureHashing()
    mixed: list[str | HashedFeatures] = [TEXTS[0], hashing.hash(TEXTS[1]), TEXTS[2]]
    rows = hashed_rows(hashing, mixed)
    expected = hashing.hash_matrix([TEXTS[0], TEXTS[1], TEXTS[2]])
    assert (rows != expected).nnz == 0
    other = FeatureHashing(ngram_max=1).hash(TEXTS[0])
    with pytest.raises(ValueError, match="scheme"):
        hashed_rows(hashing, [TEXTS[1], other])


def test_tf_idf_is_the_documented_formula() -> None:
    """Sublinear TF, smoothed IDF, L2 rows; one row at a time agrees."""
    hashing = FeatureHashing()
    counts = hashed_rows(hashing, TEXTS)
    columns, idf, matrix = tf_idf_matrix(counts.copy(), 2)
    dense = counts[:, columns].toarray()
    df = (dense > 0).sum(axis=0)
    assert df.min() >= 2  # min_df: n-grams of one input are dropped
    assert idf == pytest.approx(np.log((1 + len(TEXTS)) / (1 + df)) + 1)
    tf = np.where(dense > 0, 1 + np.log(np.where(dense > 0, dense, 1)), 0.0)
    expected = tf * idf
    norms = np.linalg.norm(expected, axis=1, keepdims=True)
    expected = np.divide(expected, norms, out=np.zeros_like(expected), where=norms > 0)
    assert sparse.issparse(matrix)
    assert matrix.toarray() == pytest.approx(expected)
    for text, dense_row in zip(TEXTS, expected, strict=True):
        row = hashing.hash_matrix([text])
        row.sort_indices()
        values = tf_idf_row(columns, idf, np.asarray(row.indices), row.data)
        if values is None:  # no kept n-gram: a zero row
            assert not dense_row.any()
            continue
        positions, weights = values
        one = np.zeros(len(columns))
        one[positions] = weights
        assert one == pytest.approx(dense_row)
