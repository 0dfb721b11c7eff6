"""Embeddings shared by every method of a run, each text embedded once.

Several methods index the same chunks, rules or passages and embed the same
queries; LangChain's `CacheBackedEmbeddings` keeps every vector so none of them pays
the model again. Over a `LocalFileStore` directory the vectors outlive the run, so
a later run embeds only texts it has not seen (embedding is most of an offline
run's time). Keys start with a digest of the model's identity, so two models never
share vectors.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import cast

from langchain_classic.embeddings import CacheBackedEmbeddings
from langchain_classic.storage import LocalFileStore
from langchain_core.embeddings import Embeddings
from langchain_core.stores import ByteStore, InMemoryByteStore

from langchain_tag.embeddings import (
    EmbeddingsSpec,
    LocalMiniLMEmbeddings,
    embeddings_from_spec,
)

__all__ = [
    "SharedEmbeddings",
    "cache_embeddings",
    "embedding_namespace",
    "shared_embeddings",
]

logger = logging.getLogger(__name__)


class SharedEmbeddings(CacheBackedEmbeddings):
    """`CacheBackedEmbeddings` that embeds a text repeated within one call once."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Vectors of `texts`, from the store or embedded once each."""
        unique = list(dict.fromkeys(texts))
        found = dict(zip(unique, super().embed_documents(unique), strict=True))
        return [found[text] for text in texts]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Vectors of `texts`, from the store or embedded once each."""
        unique = list(dict.fromkeys(texts))
        found = dict(zip(unique, await super().aembed_documents(unique), strict=True))
        return [found[text] for text in texts]


def embedding_namespace(embeddings: Embeddings) -> str | None:
    """A name for the model behind `embeddings`, for a persistent cache.

    None if it cannot be told (then vectors are kept in memory only). Known:
    `LocalMiniLMEmbeddings` (its model directory) and embeddings with a `model` or
    `model_name` field (most LangChain integrations).
    """
    if isinstance(embeddings, LocalMiniLMEmbeddings):
        return f"minilm:{embeddings.model_path.resolve()}"
    name = getattr(embeddings, "model", None) or getattr(embeddings, "model_name", None)
    return f"{type(embeddings).__qualname__}:{name}" if isinstance(name, str) else None


def cache_embeddings(
    embeddings: Embeddings,
    directory: str | os.PathLike[str] | None = None,
    namespace: str | None = None,
) -> SharedEmbeddings:
    """`embeddings` behind a vector cache, in memory or in a directory.

    Document and query vectors are kept apart (`documents/` and `queries/`), since
    a model may embed a query differently from the same text as a document.

    Args:
        embeddings: The model.
        directory: Where to keep vectors across runs; None keeps them in memory.
        namespace: Names the model in the keys, so vectors of different models
            never mix; required with `directory` (see `embedding_namespace`).

    Raises:
        ValueError: `directory` is given without a namespace.
        OSError: `directory` cannot be made (e.g. it is a file).
    """
    if directory is None:
        documents: ByteStore = InMemoryByteStore()
        queries: ByteStore = InMemoryByteStore()
    elif not namespace:
        msg = (
            "A persistent embedding cache needs a namespace naming the model "
            "(e.g. embedding_namespace(embeddings)), or vectors of different "
            "models would mix."
        )
        raise ValueError(msg)
    else:
        # Made now, so a path that cannot be a directory fails here, not in a run.
        Path(directory).mkdir(parents=True, exist_ok=True)
        documents = LocalFileStore(Path(directory) / "documents")
        queries = LocalFileStore(Path(directory) / "queries")
    # A digest: file store keys allow few characters, and names may hold any.
    prefix = hashlib.sha256((namespace or "").encode()).hexdigest()[:24]
    cached = SharedEmbeddings.from_bytes_store(
        embeddings,
        documents,
        namespace=f"{prefix}/",
        query_embedding_cache=queries,
        key_encoder="sha256",
    )
    # `from_bytes_store` builds `cls`; its annotation names the base class.
    return cast("SharedEmbeddings", cached)


def shared_embeddings(
    embeddings: EmbeddingsSpec = None,
    cache: str | os.PathLike[str] | None = None,
) -> SharedEmbeddings:
    """Embeddings every method of a run shares, each text embedded once.

    Args:
        embeddings: The model, or a spec naming it (see `embeddings_from_spec`:
            a local model directory, `module:attribute`, ...); default the
            offline MiniLM. Already shared embeddings are returned as they are.
        cache: A directory keeping the vectors across runs, used when the model
            can be named (see `embedding_namespace`); each model's vectors are
            keyed under its own name, so models never share vectors.

    Raises:
        ValueError: `embeddings` is a spec naming no model (see
            `embeddings_from_spec`).
    """
    if isinstance(embeddings, SharedEmbeddings):
        return embeddings
    model = embeddings_from_spec(embeddings)
    namespace = embedding_namespace(model)
    if cache is not None and namespace is None:
        logger.warning(
            "Cannot tell which model %s is, so its vectors are not kept in %s.",
            type(model).__name__,
            cache,
        )
        cache = None
    return cache_embeddings(model, cache, namespace)
