"""Documents and curated rulebooks shipped with the package.

- `pep-0008.rst`: PEP 8 as published (public domain), the demo's and HumanEval's
  instruction document.
- `npov-policy.md`: a neutral-point-of-view policy written for this project. It
  paraphrases the ideas of Wikipedia's NPOV policy in our own words; it is not
  Wikipedia's text (which is not available offline).
- `pep8.rulebook.json`, `npov.rulebook.json`: rulebooks written by hand from those
  documents (labelled `curated` in their diagnostics, never presented as
  extracted), every `source_text` checked by extraction's phase-5 verification
  against the document.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal

from langchain_tag.rules import Rulebook

__all__ = ["CuratedName", "curated_rulebook", "document_name", "resource_text"]

CuratedName = Literal["pep8", "npov"]
"""The curated rulebooks shipped: PEP 8 and the NPOV policy."""

_DOCUMENTS: dict[CuratedName, str] = {
    "pep8": "pep-0008.rst",
    "npov": "npov-policy.md",
}


def resource_text(name: str) -> str:
    """The text of a file shipped in `langchain_tag/resources`.

    Raises:
        FileNotFoundError: No such resource (the message lists them).
    """
    folder = resources.files(__name__)
    found = folder.joinpath(name)
    if not found.is_file():
        shipped = sorted(
            entry.name
            for entry in folder.iterdir()
            if entry.is_file() and not entry.name.endswith(".py")
        )
        msg = f"No resource {name!r} in langchain_tag.resources; shipped: {shipped}"
        raise FileNotFoundError(msg)
    return found.read_text(encoding="utf-8")


def curated_rulebook(name: CuratedName) -> Rulebook:
    """A curated rulebook shipped with the package (`pep8` or `npov`).

    Curated means written by hand from the document, not extracted by an LLM; its
    `diagnostics["curated"]` says so and names the document.
    """
    if name not in _DOCUMENTS:
        msg = f"No curated rulebook {name!r}; choose one of {sorted(_DOCUMENTS)}."
        raise ValueError(msg)
    return Rulebook.model_validate_json(resource_text(f"{name}.rulebook.json"))


def document_name(name: CuratedName) -> str:
    """The shipped document a curated rulebook was written from."""
    return _DOCUMENTS[name]
