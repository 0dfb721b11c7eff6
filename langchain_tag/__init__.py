"""Task-Aligned Retrieval (TAG) for LangChain.

Retrieve the rules whose condition an input satisfies, judged pairwise by an LLM that
never sees the rules' actions, instead of the passages most similar to the input.
"""

from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache, VerdictCache
from langchain_tag.cascade import CascadeJudge, CascadeStats
from langchain_tag.execution import (
    CODE_TEMPLATE,
    GENERIC_TEMPLATE,
    NBA_TEMPLATE,
    NPOV_TEMPLATE,
    ActionOnlyExecutor,
    ExecutionTemplate,
    NBAVerdict,
    NPOVResult,
    format_actions,
)
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
    from langchain_tag.baselines import (
        AllRulesRetriever,
        ChunkApplicabilityRetriever,
        ChunkRetriever,
        NoRetrieval,
        RelevanceReranker,
        RuleSimilarityRetriever,
        chunk_retriever,
        llm_chain_filter_retriever,
        split_into_chunks,
    )
    from langchain_tag.extraction import (
        ExtractionReport,
        aextract_rules,
        build_extraction_graph,
        extract_rules,
    )
    from langchain_tag.prefilter import (
        BM25Scorer,
        DenseScorer,
        HybridScorer,
        SimilarityPrefilter,
        SimilarityScorer,
        build_prefilter,
    )
    from langchain_tag.query_graph import QueryContext, build_query_graph
    from langchain_tag.store import RuleStore, SyncReport

# Extraction pulls in LangGraph and the baselines Chroma; load them on first use, not
# on `import langchain_tag`.
_LAZY = {
    "AllRulesRetriever": "langchain_tag.baselines",
    "ChunkApplicabilityRetriever": "langchain_tag.baselines",
    "ChunkRetriever": "langchain_tag.baselines",
    "NoRetrieval": "langchain_tag.baselines",
    "RelevanceReranker": "langchain_tag.baselines",
    "RuleSimilarityRetriever": "langchain_tag.baselines",
    "chunk_retriever": "langchain_tag.baselines",
    "llm_chain_filter_retriever": "langchain_tag.baselines",
    "split_into_chunks": "langchain_tag.baselines",
    "BM25Scorer": "langchain_tag.prefilter",
    "DenseScorer": "langchain_tag.prefilter",
    "HybridScorer": "langchain_tag.prefilter",
    "SimilarityPrefilter": "langchain_tag.prefilter",
    "SimilarityScorer": "langchain_tag.prefilter",
    "build_prefilter": "langchain_tag.prefilter",
    "RuleStore": "langchain_tag.store",
    "SyncReport": "langchain_tag.store",
    "ExtractionReport": "langchain_tag.extraction",
    "QueryContext": "langchain_tag.query_graph",
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
    "CODE_TEMPLATE",
    "CONDITION_PROFILE",
    "GENERIC_TEMPLATE",
    "NBA_PROFILE",
    "NBA_TEMPLATE",
    "NPOV_TEMPLATE",
    "ActionOnlyExecutor",
    "AllRulesRetriever",
    "ApplicabilityJudge",
    "BM25Scorer",
    "CascadeJudge",
    "CascadeStats",
    "ChunkApplicabilityRetriever",
    "ChunkRetriever",
    "DenseScorer",
    "ExecutionTemplate",
    "ExtractionReport",
    "HybridScorer",
    "InMemoryVerdictCache",
    "JudgmentError",
    "MatchResult",
    "ModelNotConfiguredError",
    "NBAVerdict",
    "NPOVResult",
    "NoRetrieval",
    "QueryContext",
    "RelevanceReranker",
    "RetryPolicy",
    "Rule",
    "RuleLineage",
    "RuleRelation",
    "RuleSchemaProfile",
    "RuleSimilarityRetriever",
    "RuleStore",
    "Rulebook",
    "RulebookError",
    "SQLiteVerdictCache",
    "SimilarityPrefilter",
    "SimilarityScorer",
    "SourceDocument",
    "SourceSpan",
    "SyncReport",
    "TAGRetriever",
    "UnreliableMatchWarning",
    "Verdict",
    "VerdictCache",
    "__version__",
    "aextract_rules",
    "build_extraction_graph",
    "build_prefilter",
    "build_query_graph",
    "chunk_retriever",
    "constraint_profile",
    "default_chat_model",
    "extract_rules",
    "format_actions",
    "llm_chain_filter_retriever",
    "split_into_chunks",
]
