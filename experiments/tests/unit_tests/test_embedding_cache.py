"""`shared_embeddings`: the harness's embeddings, cached on disk, one namespace each.

It takes the spec `embeddings_from_spec` takes (`tests/unit_tests/
test_embeddings_spec.py`), and never lets two models share cached vectors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_tag_experiments.evaluation.embedding_cache import (
    SharedEmbeddings,
    embedding_namespace,
    shared_embeddings,
)

from langchain_tag.embeddings import (
    LocalMiniLMEmbeddings,
    bundled_minilm_path,
    embeddings_from_spec,
)
from langchain_tag.testing import HashingFakeEmbeddings
from tests.unit_tests.test_embeddings_spec import (
    FAKE_SPEC,
    NamedFakeEmbeddings,
    _minilm_copy,
    _model_dir,
)

# --- the shared, cached embeddings ----------------------------------------------------


def test_shared_embeddings_take_the_same_spec(tmp_path: Path) -> None:
    shared = shared_embeddings(FAKE_SPEC)
    assert isinstance(shared, SharedEmbeddings)
    assert isinstance(shared.underlying_embeddings, HashingFakeEmbeddings)
    assert shared_embeddings(shared) is shared
    default = shared_embeddings()
    assert isinstance(default.underlying_embeddings, LocalMiniLMEmbeddings)
    local = shared_embeddings(str(bundled_minilm_path()))
    assert isinstance(local.underlying_embeddings, LocalMiniLMEmbeddings)
    with pytest.raises(ValueError, match="Nothing is downloaded"):
        shared_embeddings("no-such-org/no-such-model", cache=tmp_path)


def test_each_model_has_its_own_namespace(tmp_path: Path) -> None:
    default = embeddings_from_spec(None)
    other_dir = embeddings_from_spec(str(_model_dir(tmp_path, "bge")))
    same_dir = embeddings_from_spec(str(bundled_minilm_path()))
    names = {
        embedding_namespace(model)
        for model in (default, other_dir, NamedFakeEmbeddings("a", 1.0))
    }
    assert None not in names
    assert len(names) == 3
    assert embedding_namespace(same_dir) == embedding_namespace(default)


def test_models_never_share_cached_vectors(tmp_path: Path) -> None:
    cache = tmp_path / "vectors"
    first = NamedFakeEmbeddings("model-a", 1.0)
    second = NamedFakeEmbeddings("model-b", 2.0)
    assert shared_embeddings(first, cache).embed_documents(["rule"]) == [[1.0, 4.0]]
    assert shared_embeddings(second, cache).embed_documents(["rule"]) == [[2.0, 4.0]]
    assert second.embedded == 1  # not model-a's vector from the cache
    # Each model finds its own vectors again.
    again = NamedFakeEmbeddings("model-a", 9.0)
    assert shared_embeddings(again, cache).embed_documents(["rule"]) == [[1.0, 4.0]]
    assert again.embedded == 0


def test_local_models_are_cached_under_their_own_directory(tmp_path: Path) -> None:
    cache = tmp_path / "vectors"
    copy = _minilm_copy(tmp_path)
    default = shared_embeddings(None, cache)
    other = shared_embeddings(str(copy), cache)
    assert embedding_namespace(default.underlying_embeddings) != embedding_namespace(
        other.underlying_embeddings
    )
    (vector,) = default.embed_documents(["Use four spaces."])
    (same,) = other.embed_documents(["Use four spaces."])
    assert same == pytest.approx(vector)  # the same model, under another name
    namespaces = list((cache / "documents").iterdir())
    assert len(namespaces) == 2  # one key prefix per model, none shared
