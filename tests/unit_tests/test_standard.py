"""LangChain's standard retriever tests, run offline against a content-aware fake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_tag import Rulebook, TAGRetriever
from langchain_tag.testing import RuleAwareFakeChatModel

RULEBOOK = Rulebook.load(
    Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json"
)


class TestTAGRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[TAGRetriever]:
        return TAGRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"rulebook": RULEBOOK, "llm": RuleAwareFakeChatModel()}

    @property
    def retriever_query_example(self) -> str:
        # Satisfies four rules, so k=1 and k=3 are both exercised.
        return (
            "from os import *\n"
            "square = lambda x: x * x\n"
            "if value == None or flag == True:\n"
            "    pass\n"
        )
