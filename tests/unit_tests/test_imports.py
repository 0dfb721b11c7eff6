"""The public API is small and deliberate."""

import langchain_tag

EXPECTED_ALL = [
    "ActionOnlyExecutor",
    "ApplicabilityJudge",
    "CODE_TEMPLATE",
    "CONDITION_PROFILE",
    "ExecutionTemplate",
    "ExtractionReport",
    "GENERIC_TEMPLATE",
    "InMemoryVerdictCache",
    "JudgmentError",
    "MatchResult",
    "ModelNotConfiguredError",
    "NBAVerdict",
    "NBA_PROFILE",
    "NBA_TEMPLATE",
    "NPOVResult",
    "NPOV_TEMPLATE",
    "QueryContext",
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
    "build_extraction_graph",
    "build_query_graph",
    "constraint_profile",
    "default_chat_model",
    "extract_rules",
    "format_actions",
]


def test_all_imports() -> None:
    assert sorted(langchain_tag.__all__) == sorted(EXPECTED_ALL)
    for name in langchain_tag.__all__:
        assert getattr(langchain_tag, name) is not None
