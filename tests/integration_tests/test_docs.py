"""Every Python block of README.md and of the docs site runs, page by page.

Each markdown file holding ```python blocks is one test: its blocks run in order, in
one fresh namespace, as a reader pasting them would, in a temporary working folder,
with `OPENAI_BASE_URL` pointing at a loopback fake that serves chat completions and
decisions (`FakeDecisionsServer`), so `ChatOpenAI(...)` and `OpenAIClassifier(...)`
take their real clients with fake answers. What a page leaves to the reader (their
model `llm`, their documents `docs`, a `snippet`, a loaded `rulebook`, ...) is in
`reader_objects`; the files the pages name as examples are made in `reader_files`.
The placeholders the pages use for what only a reader has are replaced:
`path/to/model.gguf` by the bundled SmolLM2, the PostgreSQL URI of `docs/deployment.md`
by `TAG_TEST_POSTGRES_URI` (the page is skipped without it) and its Chroma host by a
`chroma run` started here. Nothing else is changed: a block that no longer runs fails
here, naming its file and line.

`test_the_site_builds_strictly` builds the site with `mkdocs build --strict`, so a
broken link, a missing page or an API reference that no longer resolves fails too.

The servers are on loopback, which is why this is an integration test (unit tests
have sockets disabled).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
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

from langchain_tag import Rulebook
from langchain_tag._processes import free_port
from langchain_tag.testing import HashingFakeEmbeddings, JudgeAndExtractorFakeChatModel
from langchain_tag.testing.decisions import FakeDecisionsServer
from tests.integration_tests.servers import (
    LOCAL_MODEL_PACKAGES,
    running_server,
    skip_unless_installed,
)
from tests.unit_tests.test_documents import PAGE_1, PAGE_2, write_pdf

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
EXCERPT = REPO / "notebooks" / "data" / "pep8_excerpt.rst"
PEP8_RULEBOOK = REPO / "langchain_tag" / "resources" / "pep8.rulebook.json"
SNIPPET = "from os.path import *\n\nif x == None:\n    print(join('a', 'b'))\n"
GGUF_PLACEHOLDER = "path/to/model.gguf"
POSTGRES_PLACEHOLDER = "postgresql://tag:secret@db.internal:5432/tag"
CHROMA_PLACEHOLDER = 'host="chroma.internal", port=8000'
QUICKSTART_PAGES = {"README.md", "docs/getting-started.md"}
"""The pages holding the quickstart, which prints the rule it matched."""
LOCAL_MODEL_MARKERS = (GGUF_PLACEHOLDER, "langchain_tag.local_model")
CHROMA = Path(sys.executable).with_name("chroma")
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """The Python blocks of `markdown`, each with the line its code starts on."""
    return [
        (markdown.count("\n", 0, found.start(1)) + 1, found.group(1))
        for found in _BLOCK.finditer(markdown)
    ]


def markdown_files() -> list[Path]:
    """README.md and every page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def name(path: Path) -> str:
    """`path` relative to the repository, as the test ids and tracebacks name it."""
    return path.relative_to(REPO).as_posix()


PAGES = [path for path in markdown_files() if python_blocks(path.read_text("utf-8"))]


def test_python_blocks_are_found_with_their_lines() -> None:
    text = (
        "# T\n\n```python\nx = 1\n```\n\ntext\n\n"
        "```bash\nls\n```\n```python\ny = 2\n```\n"
    )
    assert python_blocks(text) == [(4, "x = 1\n"), (13, "y = 2\n")]


def test_readme_and_docs_hold_the_blocks() -> None:
    blocks = [
        block for path in PAGES for block in python_blocks(path.read_text("utf-8"))
    ]
    assert len(blocks) >= 20, "README's and the docs' Python blocks were not found"
    assert any(name(path) in QUICKSTART_PAGES for path in PAGES)


def test_the_gguf_placeholder_is_somewhere() -> None:
    code = "".join(
        block for path in PAGES for _, block in python_blocks(path.read_text("utf-8"))
    )
    assert GGUF_PLACEHOLDER in code, (
        f"neither README nor the docs name {GGUF_PLACEHOLDER}: update this test"
    )


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDecisionsServer]:
    """Chat and decisions on loopback; the environment points the clients at it."""
    with FakeDecisionsServer(chat_model=JudgeAndExtractorFakeChatModel()) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        yield fake


@pytest.fixture
def reader_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The working folder, holding the example files the pages open.

    Chroma keeps one client per path for the process, and the pages name the same
    relative paths (`rules-db`) in different folders: each page starts afresh.
    """
    from chromadb.api.shared_system_client import SharedSystemClient  # noqa: PLC0415

    monkeypatch.chdir(tmp_path)
    write_pdf(tmp_path / "handbook.pdf", [PAGE_1, PAGE_2])
    shutil.copy(PEP8_RULEBOOK, tmp_path / "pep8.rulebook.json")
    SharedSystemClient.clear_system_cache()
    yield tmp_path
    SharedSystemClient.clear_system_cache()


@pytest.fixture(scope="module")
def chroma_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`chroma run` on a free loopback port, for the page that names a server."""
    if not CHROMA.is_file():
        pytest.skip(f"the chroma CLI is not installed next to {sys.executable}")
    directory = tmp_path_factory.mktemp("chroma")
    port = free_port()
    command = [str(CHROMA), "run", "--host", "127.0.0.1", "--port", str(port)]
    with running_server(
        "chroma run",
        [*command, "--path", str(directory / "data")],
        ready_url=f"http://127.0.0.1:{port}/api/v2/heartbeat",
        log=directory / "chroma.log",
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
        cwd=directory,
    ):
        yield port


def reader_objects() -> dict[str, Any]:
    """What the pages' blocks take from the reader's own code."""
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
        "rulebook": Rulebook.load(PEP8_RULEBOOK),
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
    settings: this one has the settings every test's in-memory client has. Each
    call gets a collection of its own, since that client outlives a test.
    """
    import chromadb  # noqa: PLC0415
    from chromadb.config import Settings  # noqa: PLC0415
    from langchain_chroma import Chroma  # noqa: PLC0415

    store = Chroma(
        collection_name=f"docs-{uuid.uuid4().hex[:12]}",
        embedding_function=HashingFakeEmbeddings(),
        client=chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False)),
    )
    store.add_documents(docs)
    return store


def placeholders(code: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """What stands for the reader's own model file and servers in `code`."""
    found: dict[str, str] = {}
    if any(marker in code for marker in LOCAL_MODEL_MARKERS):
        skip_unless_installed(LOCAL_MODEL_PACKAGES)
    if GGUF_PLACEHOLDER in code:
        from langchain_tag.local_model import smollm2_model_path  # noqa: PLC0415

        found[GGUF_PLACEHOLDER] = str(smollm2_model_path())
    if POSTGRES_PLACEHOLDER in code:
        found[POSTGRES_PLACEHOLDER] = request.getfixturevalue("uri")  # or skips
    if CHROMA_PLACEHOLDER in code:
        port = request.getfixturevalue("chroma_port")
        found[CHROMA_PLACEHOLDER] = f'host="127.0.0.1", port={port}'
    return found


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_block_of_the_page_runs_in_order(
    page: Path,
    server: FakeDecisionsServer,
    reader_files: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    replace = placeholders("".join(code for _, code in blocks), request)
    namespace: dict[str, Any] = {"__name__": page.stem, **reader_objects()}
    for line, given in blocks:
        code = given
        for placeholder, value in replace.items():
            code = code.replace(placeholder, value)
        # A failure's traceback names the block by its line: `docs/x.md:<line>`.
        compiled = compile(textwrap.dedent(code), f"{name(page)}:{line}", "exec")
        exec(compiled, namespace)  # noqa: S102
    out = capsys.readouterr().out
    if name(page) in QUICKSTART_PAGES:
        # The quickstart prints its match: the fake judge said YES over HTTP.
        assert "PEP8-IMPORT-WILDCARD" in out
    if any("OpenAIClassifier(" in code for _, code in blocks):
        assert server.request_count > 0  # a decision model judged over HTTP
    if any("llm" in code or "model" in code for _, code in blocks):
        assert server.chat_requests or server.request_count  # a model was asked


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(
                f"{module} is not installed; install the `docs` dependency group "
                "(`bash scripts/setup`)"
            )
    started = time.perf_counter()
    built = subprocess.run(  # noqa: S603 - this interpreter's mkdocs, fixed arguments
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    log = built.stdout + built.stderr
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{log[-4000:]}"
    assert "WARNING" not in log, log[-4000:]
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "reference" / "langchain_tag" / "index.html").is_file()
    print(f"mkdocs build --strict: {time.perf_counter() - started:.1f} s")  # noqa: T201
