"""Every Python block of README.md runs, in order, as a reader pasting them would.

The blocks run in one namespace, in a temporary working folder, with
`OPENAI_BASE_URL` pointing at a loopback fake that serves chat completions and
decisions (`FakeDecisionsServer`), so `ChatOpenAI(...)` and `OpenAIClassifier(...)`
take their real clients with fake answers. What README leaves to the reader (their
model `llm`, their documents `docs`, a `snippet`, ...) is in `reader_objects`;
the files it names as examples are made in `reader_files`, and the one placeholder
path (`path/to/model.gguf`) becomes the bundled SmolLM2. Nothing else is changed:
a block that no longer runs fails here, naming its line in README.md.

The server is on loopback, which is why this is an integration test (unit tests
have sockets disabled).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.tools import tool
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_openai import ChatOpenAI

from langchain_tag.testing import HashingFakeEmbeddings, JudgeAndExtractorFakeChatModel
from langchain_tag.testing.decisions import FakeDecisionsServer
from tests.integration_tests.servers import LOCAL_MODEL_PACKAGES, skip_unless_installed
from tests.unit_tests.test_documents import PAGE_1, PAGE_2, write_pdf

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
EXCERPT = REPO / "notebooks" / "data" / "pep8_excerpt.rst"
SNIPPET = "from os.path import *\n\nif x == None:\n    print(join('a', 'b'))\n"
GGUF_PLACEHOLDER = "path/to/model.gguf"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """The Python blocks of `markdown`, each with the line its code starts on."""
    return [
        (markdown.count("\n", 0, found.start(1)) + 1, found.group(1))
        for found in _BLOCK.finditer(markdown)
    ]


def test_python_blocks_are_found_with_their_lines() -> None:
    text = (
        "# T\n\n```python\nx = 1\n```\n\ntext\n\n"
        "```bash\nls\n```\n```python\ny = 2\n```\n"
    )
    assert python_blocks(text) == [(4, "x = 1\n"), (13, "y = 2\n")]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDecisionsServer]:
    """Chat and decisions on loopback; the environment points the clients at it."""
    with FakeDecisionsServer(chat_model=JudgeAndExtractorFakeChatModel()) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        yield fake


@pytest.fixture
def reader_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working folder, holding the example files README's blocks open."""
    monkeypatch.chdir(tmp_path)
    write_pdf(tmp_path / "handbook.pdf", [PAGE_1, PAGE_2])
    return tmp_path


def reader_objects() -> dict[str, Any]:
    """What README's blocks take from the reader's own code."""
    docs = [
        Document(
            page_content=EXCERPT.read_text(encoding="utf-8"),
            metadata={"source": EXCERPT.name},
        )
    ]
    llm = ChatOpenAI(model="gpt-4o-mini")
    vector_store = InMemoryVectorStore(HashingFakeEmbeddings())
    vector_store.add_documents(docs)

    @tool
    def search(query: str) -> str:
        """Search the team's code for `query`."""
        return "no results"

    def format_docs(documents: list[Document]) -> str:
        return "\n\n".join(d.page_content for d in documents)

    return {
        "docs": docs,
        "llm": llm,
        "model": llm,
        "judge_llm": llm,
        "small_model": ChatOpenAI(model="gpt-4o-mini", logprobs=True),
        "big_model": ChatOpenAI(model="gpt-4.1"),
        "snippet": SNIPPET,
        "snippets": [SNIPPET, "import os\nimport sys\n"],
        "text": SNIPPET,
        "vector_store": vector_store,
        "chroma_store": chroma_store(docs),
        "search": search,
        "format_docs": format_docs,
        "prompt": ChatPromptTemplate.from_template(
            "Context:\n{context}\n\nQuestion: {question}"
        ),
        "RunnablePassthrough": RunnablePassthrough,
        "StrOutputParser": StrOutputParser,
    }


def chroma_store(docs: list[Document]) -> Any:
    """An in-memory Chroma holding `docs`, as `from_vectorstore` expects to find.

    Chroma keeps one in-memory client per process, refusing another with other
    settings: this one has the settings every test's in-memory client has.
    """
    import chromadb  # noqa: PLC0415
    from chromadb.config import Settings  # noqa: PLC0415
    from langchain_chroma import Chroma  # noqa: PLC0415

    store = Chroma(
        collection_name="readme",
        embedding_function=HashingFakeEmbeddings(),
        client=chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False)),
    )
    store.add_documents(docs)
    return store


def test_every_readme_block_runs_in_order(
    server: FakeDecisionsServer, reader_files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    skip_unless_installed(LOCAL_MODEL_PACKAGES)
    from langchain_tag.local_model import smollm2_model_path  # noqa: PLC0415

    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 10, "README's Python blocks were not found"
    namespace: dict[str, Any] = {"__name__": "readme", **reader_objects()}
    placeholder_seen = False
    for line, given in blocks:
        code = given.replace(GGUF_PLACEHOLDER, str(smollm2_model_path()))
        placeholder_seen |= code != given
        # A failure's traceback names the block by its line: `README.md:<line>`.
        exec(compile(textwrap.dedent(code), f"README.md:{line}", "exec"), namespace)  # noqa: S102
    assert placeholder_seen, f"README names no {GGUF_PLACEHOLDER}: update this test"
    # The quickstart prints its match: the fake judge said YES over HTTP.
    assert "PEP8-IMPORT-WILDCARD" in capsys.readouterr().out
    assert server.request_count > 0  # a decision model judged over HTTP
    assert server.chat_requests  # and chat models did
