"""Task-Aligned Retrieval (TAG) for LangChain.

Retrieve the rules whose condition an input satisfies, judged pairwise by an LLM that
never sees the rules' actions, instead of the passages most similar to the input.
"""

from importlib import metadata

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

try:
    __version__ = metadata.version(__package__ or __name__)
except metadata.PackageNotFoundError:
    __version__ = ""
del metadata

__all__ = [
    "CONDITION_PROFILE",
    "NBA_PROFILE",
    "ApplicabilityJudge",
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
    "constraint_profile",
    "default_chat_model",
]
