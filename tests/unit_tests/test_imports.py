"""The public API is small and deliberate."""

import langchain_tag

EXPECTED_ALL = [
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


def test_all_imports() -> None:
    assert sorted(langchain_tag.__all__) == sorted(EXPECTED_ALL)
    for name in langchain_tag.__all__:
        assert getattr(langchain_tag, name) is not None
