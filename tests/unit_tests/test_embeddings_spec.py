"""`embeddings_from_spec`: which embedding model a run uses, never downloading one.

The method used BGE embeddings; the default here is the offline MiniLM, and a spec
(a local model directory, a cached Hugging Face id, or `module:attribute`) picks
another (`shared_embeddings`, the harness's cached embeddings, takes the same spec).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from langchain_core.embeddings import Embeddings

from langchain_tag.embeddings import (
    LocalMiniLMEmbeddings,
    bundled_minilm_path,
    embeddings_from_spec,
)
from langchain_tag.testing import HashingFakeEmbeddings

FAKE_SPEC = "langchain_tag.testing.embeddings:HashingFakeEmbeddings"


class NamedFakeEmbeddings(Embeddings):
    """A fake 'model' named `model_name`, whose vectors say which model made them."""

    def __init__(self, model_name: str, value: float) -> None:
        self.model_name = model_name
        self.value = value
        self.embedded = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.embedded += len(texts)
        return [[self.value, float(len(text))] for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return [self.value, -1.0]


def fake_factory() -> Embeddings:
    """A factory `module:attribute` may name."""
    return NamedFakeEmbeddings("factory-model", 3.0)


FAKE_INSTANCE = NamedFakeEmbeddings("instance-model", 4.0)


def failing_factory() -> Embeddings:
    msg = "no API key"
    raise RuntimeError(msg)


def _model_dir(root: Path, name: str = "model") -> Path:
    """A directory that looks like a model (it is never loaded)."""
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}", encoding="utf-8")
    return directory


def _minilm_copy(root: Path) -> Path:
    """The bundled MiniLM as another directory: its files linked, not copied."""
    copy = root / "minilm-copy"
    for source in bundled_minilm_path().rglob("*"):
        target = copy / source.relative_to(bundled_minilm_path())
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
    return copy


# --- what a spec names ----------------------------------------------------------------


def test_no_spec_is_the_offline_minilm() -> None:
    for spec in (None, "", "  "):
        model = embeddings_from_spec(spec)
        assert isinstance(model, LocalMiniLMEmbeddings)
        assert model.model_path == bundled_minilm_path()
    assert isinstance(embeddings_from_spec(), LocalMiniLMEmbeddings)


def test_an_embeddings_instance_is_itself() -> None:
    model = HashingFakeEmbeddings()
    assert embeddings_from_spec(model) is model


def test_a_local_directory_is_loaded_from_disk() -> None:
    path = bundled_minilm_path()
    for spec in (str(path), path):
        model = embeddings_from_spec(spec)
        assert isinstance(model, LocalMiniLMEmbeddings)
        assert model.model_path == path
    vector = embeddings_from_spec(str(path)).embed_query("Use four spaces.")
    assert len(vector) == 384
    assert math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-5)
    assert vector == pytest.approx(
        LocalMiniLMEmbeddings().embed_query("Use four spaces.")
    )


def test_a_home_relative_directory_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    directory = _model_dir(tmp_path, "bge")
    model = embeddings_from_spec("~/bge")
    assert isinstance(model, LocalMiniLMEmbeddings)
    assert model.model_path == directory


def test_a_model_in_the_local_hugging_face_cache_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants  # noqa: PLC0415

    repo = tmp_path / "hub" / "models--BAAI--bge-small-en-v1.5"
    snapshot = _model_dir(repo / "snapshots", "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123", encoding="utf-8")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    model = embeddings_from_spec("BAAI/bge-small-en-v1.5")
    assert isinstance(model, LocalMiniLMEmbeddings)
    assert model.model_path.resolve() == snapshot.resolve()
    with pytest.raises(ValueError, match="Nothing is downloaded"):
        embeddings_from_spec("BAAI/bge-large-en-v1.5")  # not in the cache


def test_module_attribute_names_a_class_a_factory_or_an_instance() -> None:
    made = embeddings_from_spec(FAKE_SPEC)
    assert isinstance(made, HashingFakeEmbeddings)
    again = embeddings_from_spec(FAKE_SPEC)
    assert made is not again
    assert made.embed_query("wildcard import") == again.embed_query("wildcard import")
    assert made.embed_documents(["a", "b"]) == again.embed_documents(["a", "b"])

    factory = embeddings_from_spec(f"{__name__}:fake_factory")
    assert isinstance(factory, NamedFakeEmbeddings)
    assert factory.model_name == "factory-model"
    assert embeddings_from_spec(f"{__name__}:FAKE_INSTANCE") is FAKE_INSTANCE


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-org/no-such-model", "no such directory, not `module:attribute`"),
        ("not a model", "pass the directory of a local sentence-transformers model"),
        ("langchain_tag.no_such_module:Model", "cannot be imported"),
        ("langchain_tag.testing.embeddings:NoSuchClass", "has no attribute"),
        ("os:sep", "is a str, not a LangChain Embeddings"),
        ("builtins:dict", r"dict\(\) returned a dict, not a LangChain Embeddings"),
        (f"{__name__}:failing_factory", "calling failing_factory.. failed"),
    ],
)
def test_a_bad_spec_says_what_to_pass(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        embeddings_from_spec(spec)
    assert repr(spec) in str(caught.value)  # the error names the spec


def test_a_file_or_an_empty_directory_is_not_a_model(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ValueError, match="is a file; pass the model's directory"):
        embeddings_from_spec(str(weights))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no model"):
        embeddings_from_spec(str(tmp_path / "empty"))


def test_a_spec_of_another_type_is_refused() -> None:
    with pytest.raises(TypeError, match="got int"):
        embeddings_from_spec(42)  # type: ignore[arg-type]
