"""Task-Aligned Retrieval (TAG) for LangChain.

Retrieve the rules whose condition an input satisfies, judged pairwise by an LLM that
never sees the rules' actions, instead of the passages most similar to the input.

The method's stages are sub-packages: `extraction` (documents -> rulebook),
`matching` (the judge, the cascade, prefilters and the rule store), `learning` (the
verdict log and the prefilter learned from it) and `execution` (the action-only
executor). `engine` runs the online stage once for every face: `retrievers`
(`TAGRetriever`) and `query_graph`. This
module re-exports the few names most programs need.
"""

from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_tag.engine import MatchResult
    from langchain_tag.errors import TAGError
    from langchain_tag.execution import ActionOnlyExecutor
    from langchain_tag.extraction import (
        aextract_rules,
        build_extraction_graph,
        extract_rules,
    )
    from langchain_tag.matching import (
        ApplicabilityJudge,
        CascadeJudge,
        JudgmentError,
        Verdict,
    )
    from langchain_tag.models import ModelNotConfiguredError
    from langchain_tag.query_graph import build_query_graph
    from langchain_tag.retrievers import TAGRetriever
    from langchain_tag.rules import Rule, Rulebook, RulebookError

# Loaded on first use: importing everything costs about a second (LangGraph, the
# OpenAI-compatible judge), which `tag --help` and `import langchain_tag.rules`
# would otherwise pay.
_LAZY = {
    "ActionOnlyExecutor": "langchain_tag.execution",
    "ApplicabilityJudge": "langchain_tag.matching",
    "CascadeJudge": "langchain_tag.matching",
    "JudgmentError": "langchain_tag.matching",
    "MatchResult": "langchain_tag.engine",
    "ModelNotConfiguredError": "langchain_tag.models",
    "Rule": "langchain_tag.rules",
    "Rulebook": "langchain_tag.rules",
    "RulebookError": "langchain_tag.rules",
    "TAGError": "langchain_tag.errors",
    "TAGRetriever": "langchain_tag.retrievers",
    "Verdict": "langchain_tag.matching",
    "aextract_rules": "langchain_tag.extraction",
    "build_extraction_graph": "langchain_tag.extraction",
    "build_query_graph": "langchain_tag.query_graph",
    "extract_rules": "langchain_tag.extraction",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    msg = f"module 'langchain_tag' has no attribute {name!r}"
    raise AttributeError(msg)


try:
    __version__ = metadata.version(__package__ or __name__)
except metadata.PackageNotFoundError:
    __version__ = ""
del metadata

__all__ = [
    "ActionOnlyExecutor",
    "ApplicabilityJudge",
    "CascadeJudge",
    "JudgmentError",
    "MatchResult",
    "ModelNotConfiguredError",
    "Rule",
    "Rulebook",
    "RulebookError",
    "TAGError",
    "TAGRetriever",
    "Verdict",
    "__version__",
    "aextract_rules",
    "build_extraction_graph",
    "build_query_graph",
    "extract_rules",
]
