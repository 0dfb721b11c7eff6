"""`HashingFakeEmbeddings`: texts sharing words get similar vectors, without a model."""

from __future__ import annotations

import hashlib
import math
import re
import threading

from langchain_core.embeddings import Embeddings


class HashingFakeEmbeddings(Embeddings):
    """Bag-of-words hashing embeddings: deterministic, fast, and similarity meaningful.

    Each lower-cased word adds one to a dimension chosen by its hash, and vectors are
    unit length, so texts sharing words are close in cosine distance. It counts the
    embedding calls and texts embedded, so tests can check what was (re-)embedded.
    """

    def __init__(self, size: int = 512) -> None:
        """Embed into `size` dimensions."""
        self.size = size
        self.document_calls = 0
        self.documents_embedded = 0
        self._lock = threading.Lock()

    def _vector(self, text: str) -> list[float]:
        vector = [0.0] * self.size
        for word in re.findall(r"[a-z]+", text.lower()):
            digest = hashlib.sha256(word.encode()).digest()
            vector[int.from_bytes(digest[:4], "big") % self.size] += 1.0
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        return [v / norm for v in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents, counting the call and the texts."""
        with self._lock:
            self.document_calls += 1
            self.documents_embedded += len(texts)
        return [self._vector(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        """Embed a query (not counted)."""
        return self._vector(text)
