"""Task-Aligned Retrieval (TAG) for LangChain.

Retrieve the rules whose condition an input satisfies, judged pairwise by an LLM that
never sees the rules' actions, instead of the passages most similar to the input.

The method's stages are sub-packages: `extraction` (documents -> rulebook),
`matching` (the judge, the cascade, prefilters and the rule store), `learning` (the
verdict log and the prefilter learned from it) and `execution` (the action-only
executor). `engine` runs the online stage once for every face: `retrievers`
(`TAGRetriever`), `middleware` (`TAGMiddleware`) and `query_graph`
(`build_query_graph`). This module re-exports those faces, the rulebook types, the
extraction entry points and `TAGError`; everything else is imported from its
sub-package (`langchain_tag.matching.ApplicabilityJudge`, ...).
"""

import warnings
from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_tag.errors import RulebookError, TAGError
    from langchain_tag.extraction import (
        aextract_rules,
        build_extraction_graph,
        extract_rules,
    )
    from langchain_tag.middleware import TAGMiddleware
    from langchain_tag.query_graph import build_query_graph
    from langchain_tag.retrievers import TAGRetriever
    from langchain_tag.rules import Rule, Rulebook

# Loaded on first use: importing everything costs about a second (LangGraph, the
# OpenAI-compatible judge), which `tag --help` and `import langchain_tag.rules`
# would otherwise pay.
_LAZY = {
    "Rule": "langchain_tag.rules",
    "Rulebook": "langchain_tag.rules",
    "RulebookError": "langchain_tag.errors",
    "TAGError": "langchain_tag.errors",
    "TAGMiddleware": "langchain_tag.middleware",
    "TAGRetriever": "langchain_tag.retrievers",
    "aextract_rules": "langchain_tag.extraction",
    "build_extraction_graph": "langchain_tag.extraction",
    "build_query_graph": "langchain_tag.query_graph",
    "extract_rules": "langchain_tag.extraction",
}

_MOVED = {
    "ActionOnlyExecutor": "langchain_tag.execution",
    "ApplicabilityJudge": "langchain_tag.matching",
    "CascadeJudge": "langchain_tag.matching",
    "JudgmentError": "langchain_tag.errors",
    "MatchResult": "langchain_tag.engine",
    "ModelNotConfiguredError": "langchain_tag.errors",
    "Verdict": "langchain_tag.matching",
}
"""Names the top level had in 0.1: still found, with a warning naming their home."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name in _MOVED:
        warnings.warn(
            f"`from langchain_tag import {name}` is deprecated and will stop working "
            f"in 0.3: import it from {_MOVED[name]} (the top level keeps the faces, "
            "the rulebook types, extraction and TAGError).",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(_MOVED[name]), name)
    msg = f"module 'langchain_tag' has no attribute {name!r}"
    raise AttributeError(msg)


try:
    __version__ = metadata.version(__package__ or __name__)
except metadata.PackageNotFoundError:
    __version__ = ""
del metadata

__all__ = [
    "Rule",
    "Rulebook",
    "RulebookError",
    "TAGError",
    "TAGMiddleware",
    "TAGRetriever",
    "__version__",
    "aextract_rules",
    "build_extraction_graph",
    "build_query_graph",
    "extract_rules",
]
