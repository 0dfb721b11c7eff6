"""Task-Aligned Retrieval (TAG) for LangChain.

Retrieve the rules whose condition an input satisfies, judged pairwise by an LLM that
never sees the rules' actions, instead of the passages most similar to the input.
"""

from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache, VerdictCache
from langchain_tag.matching import (
    CONDITION_PROFILE,
    NBA_PROFILE,
    ApplicabilityJudge,
    JudgmentError,
    RetryPolicy,
    RuleSchemaProfile,
    UnreliableMatchWarning,
    Verdict,
    constraint_profile,
)
from langchain_tag.models import ModelNotConfiguredError, default_chat_model
from langchain_tag.retriever import MatchResult, TAGRetriever
from langchain_tag.rules import (
    Rule,
    Rulebook,
    RulebookError,
    RuleLineage,
    RuleRelation,
    SourceDocument,
    SourceSpan,
)

if TYPE_CHECKING:
    from langchain_tag.extraction import (
        ExtractionReport,
        aextract_rules,
        extract_rules,
    )

# Extraction pulls in LangGraph; load it on first use, not on `import langchain_tag`.
_LAZY = {
    "ExtractionReport": "langchain_tag.extraction",
    "aextract_rules": "langchain_tag.extraction",
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
    "CONDITION_PROFILE",
    "NBA_PROFILE",
    "ApplicabilityJudge",
    "ExtractionReport",
    "InMemoryVerdictCache",
    "JudgmentError",
    "MatchResult",
    "ModelNotConfiguredError",
    "RetryPolicy",
    "Rule",
    "RuleLineage",
    "RuleRelation",
    "RuleSchemaProfile",
    "Rulebook",
    "RulebookError",
    "SQLiteVerdictCache",
    "SourceDocument",
    "SourceSpan",
    "TAGRetriever",
    "UnreliableMatchWarning",
    "Verdict",
    "VerdictCache",
    "__version__",
    "aextract_rules",
    "constraint_profile",
    "default_chat_model",
    "extract_rules",
]
