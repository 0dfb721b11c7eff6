"""Both Studio graphs (langgraph.json) served by `langgraph dev`, driven by the SDK.

The server runs as a subprocess on a free loopback port, with its models pointed by
`OPENAI_BASE_URL` at a `FakeOpenAIServer` on loopback too, so everything is offline:
the graphs' real `ChatOpenAI` talks HTTP to fakes that judge by backtick-quoted
condition fragments and play the extraction phases. One more server judges with a
decision model (`TAG_DECISION_MODEL`): its real `OpenAIClassifier` talks HTTP to a
`FakeDecisionsServer`, which answers its executor's chat requests too.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from langchain_tag import Rulebook
from langchain_tag.matching.prefilters import build_prefilter
from langchain_tag.resources import curated_rulebook
from langchain_tag.settings import DECISION_MODEL_ENV_VAR
from langchain_tag.testing import (
    FakeOpenAIServer,
    JudgeAndExtractorFakeChatModel,
)
from langchain_tag.testing.decisions import FakeDecisionsServer
from tests.integration_tests.servers import LANGGRAPH, langgraph_dev

REPO = Path(__file__).resolve().parents[2]

if not LANGGRAPH.is_file():
    pytest.skip(
        f"the langgraph CLI is not installed next to {sys.executable} "
        "(install the `server` dependency group: langgraph-cli[inmem])",
        allow_module_level=True,
    )
if importlib.util.find_spec("langgraph_api") is None:
    pytest.skip(
        "`langgraph dev` needs the in-memory server: install langgraph-cli[inmem] "
        "(the `server` dependency group)",
        allow_module_level=True,
    )
try:
    from langgraph_sdk import get_client
    from langgraph_sdk.client import LangGraphClient
except ImportError:  # pragma: no cover - depends on the environment
    pytest.skip(
        "langgraph_sdk is not installed (it comes with langgraph-cli[inmem])",
        allow_module_level=True,
    )

pytestmark = pytest.mark.server

CALL_SECONDS = 30.0
DECISION_MODEL = "gpt-6-luna"

QUERY = "from os import *\n\nif x == None:\n    pass\n"
MATCHED = ["PEP8-IMPORT-WILDCARD", "PEP8-NONE-IDENTITY"]
OTHER_QUERY = "square = lambda x: x * x\n"

STYLE_GUIDE = """\
# Style

Wildcard imports such as `from os import *` must never be used.

Bare `except:` clauses should never be used.
"""

T = TypeVar("T")


# --- the servers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_openai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(JudgeAndExtractorFakeChatModel()) as server:
        yield server


@pytest.fixture(scope="module")
def studio(
    fake_openai: FakeOpenAIServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The URL of a `langgraph dev` serving this repository's langgraph.json."""
    with langgraph_dev(
        fake_openai.base_url,
        cwd=REPO,
        log=tmp_path_factory.mktemp("studio") / "langgraph-dev.log",
    ) as url:
        yield url


@pytest.fixture
def fake_decisions() -> Iterator[FakeDecisionsServer]:
    """OpenAI's Decisions API for the judge and chat completions for the executor."""
    with FakeDecisionsServer(chat_model=JudgeAndExtractorFakeChatModel()) as server:
        yield server


@pytest.fixture
def decision_studio(
    fake_decisions: FakeDecisionsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A `langgraph dev` whose graphs judge with an OpenAI decision model.

    Its own server (the environment is read at startup), for the one test that
    needs it: stopped when that test ends.
    """
    with langgraph_dev(
        fake_decisions.base_url,
        cwd=REPO,
        log=tmp_path_factory.mktemp("decision-studio") / "langgraph-dev.log",
        env={DECISION_MODEL_ENV_VAR: DECISION_MODEL},
    ) as url:
        yield url


@pytest.fixture
async def client(studio: str) -> AsyncIterator[LangGraphClient]:
    sdk = get_client(url=studio, api_key=None)
    try:
        yield sdk
    finally:
        await sdk.aclose()


@pytest.fixture
def pep8_json(pep8_rulebook: Rulebook) -> dict[str, Any]:
    return pep8_rulebook.model_dump(mode="json")


async def bounded(call: Awaitable[T]) -> T:
    return await asyncio.wait_for(call, timeout=CALL_SECONDS)


def ids(matches: Sequence[dict[str, Any]]) -> list[str]:
    return [m["rule_id"] for m in matches]


def strings(value: object) -> Iterable[str]:
    """Every string in a JSON value (a request body), keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def words(text: str) -> str:
    return " ".join(text.split())


# --- tests ----------------------------------------------------------------------------


async def test_every_graph_is_served(client: LangGraphClient) -> None:
    assistants = await bounded(client.assistants.search(limit=50))
    by_graph = {a["graph_id"]: a["assistant_id"] for a in assistants}
    assert {"tag_query", "tag_extraction", "tag_agent"} <= set(by_graph)

    agent = await bounded(client.assistants.get_graph(by_graph["tag_agent"]))
    nodes = {n["id"] for n in agent["nodes"]}
    assert {"TAGMiddleware.before_agent", "model"} <= nodes

    query = await bounded(client.assistants.get_graph(by_graph["tag_query"]))
    nodes = {n["id"] for n in query["nodes"]}
    assert {"load_rulebook", "extract", "review", "match_rule", "execute"} <= nodes

    extraction = await bounded(client.assistants.get_graph(by_graph["tag_extraction"]))
    nodes = {n["id"] for n in extraction["nodes"]}
    assert {"prepare", "detect_spans", "operationalise", "verify", "finalize"} <= nodes


async def test_query_run_streams_the_per_rule_fan_out(
    client: LangGraphClient,
    fake_openai: FakeOpenAIServer,
    pep8_rulebook: Rulebook,
    pep8_json: dict[str, Any],
) -> None:
    thread = await bounded(client.threads.create())
    before = len(fake_openai.requests)

    async def collect() -> list[dict[str, Any]]:
        return [
            part.data
            async for part in client.runs.stream(
                thread["thread_id"],
                "tag_query",
                input={"query": QUERY, "rulebook": pep8_json},
                stream_mode="updates",
            )
            if part.event == "updates"
        ]

    updates = await bounded(collect())
    nodes = [node for update in updates for node in update]
    # The server streams updates filtered to the output keys, so a match_rule
    # update shows up (one per rule) but carries no verdict; the state has them.
    assert nodes.count("match_rule") == len(pep8_rulebook)
    assert nodes[-1] == "execute"
    executed = updates[-1]["execute"]
    assert ids(executed["matches"]) == MATCHED
    assert executed["cost"]["judgments"] == len(pep8_rulebook)

    # The judge and the executor went over HTTP to the fake, as TAG_MODEL says.
    requests = fake_openai.requests[before:]
    assert len(requests) == len(pep8_rulebook) + 1
    assert {r["model"] for r in requests} == {"fake"}

    state = await bounded(client.threads.get_state(thread["thread_id"]))
    values: Any = state["values"]
    assert ids(values["matches"]) == MATCHED
    assert values["answer"] == executed["answer"]
    assert len(values["verdicts"]) == len(pep8_rulebook)

    # Another run on the same thread (the server's checkpointer keeps it).
    output: Any = await bounded(
        client.runs.wait(
            thread["thread_id"],
            "tag_query",
            input={"query": OTHER_QUERY, "rulebook": pep8_json},
        )
    )
    assert ids(output["matches"]) == ["PEP8-LAMBDA-ASSIGN"]
    state = await bounded(client.threads.get_state(thread["thread_id"]))
    values = state["values"]
    assert len(values["verdicts"]) == len(pep8_rulebook)
    assert ids(values["matches"]) == ["PEP8-LAMBDA-ASSIGN"]


async def test_context_k_limits_the_matches(
    client: LangGraphClient, pep8_json: dict[str, Any]
) -> None:
    output: Any = await bounded(
        client.runs.wait(
            None,
            "tag_query",
            input={"query": QUERY, "rulebook": pep8_json},
            context={"k": 1},
        )
    )
    assert ids(output["matches"]) == MATCHED[:1]
    assert output["cost"]["applicable"] == len(MATCHED)
    assert "PEP8-NONE-IDENTITY" not in output["answer"]


async def test_unknown_context_keys_are_refused(
    client: LangGraphClient, pep8_json: dict[str, Any]
) -> None:
    """Before: the server dropped them, and the run went on with defaults."""
    output: Any = await bounded(
        client.runs.wait(
            None,
            "tag_query",
            input={"query": QUERY, "rulebook": pep8_json},
            context={"k": 1, "kk": 1},
            raise_error=False,
        )
    )
    error = str(output.get("__error__"))
    assert "Unknown context key(s) 'kk'" in error
    assert "score_threshold" in error  # the known ones are listed


async def test_a_json_filter_judges_as_in_process(
    client: LangGraphClient,
    fake_openai: FakeOpenAIServer,
    pep8_rulebook: Rulebook,
    pep8_json: dict[str, Any],
) -> None:
    """Before: the server dropped `filter` (not in the context schema): all judged."""
    tag = pep8_rulebook.rules[0].tags[0]
    kept = [r for r in pep8_rulebook.rules if tag in r.tags]
    before = len(fake_openai.requests)
    output: Any = await bounded(
        client.runs.wait(
            None,
            "tag_query",
            input={"query": QUERY, "rulebook": pep8_json},
            context={"filter": {"tags": [tag]}},  # type: ignore[dict-item]
        )
    )
    assert output["cost"]["judgments"] == len(kept) < len(pep8_rulebook)
    judged = len(fake_openai.requests) - before - 1  # the executor's call
    assert judged == len(kept)
    assert ids(output["matches"]) == ["PEP8-IMPORT-WILDCARD"]  # as in process


async def test_a_prefilter_named_in_a_json_context_shortlists_as_in_process(
    client: LangGraphClient,
    fake_openai: FakeOpenAIServer,
    pep8_rulebook: Rulebook,
    pep8_json: dict[str, Any],
) -> None:
    """Before: no prefilter could travel in a JSON context (objects only)."""
    kept = build_prefilter(pep8_rulebook, "bm25", 2)
    assert kept is not None
    expected = {d.metadata["rule_id"] for d in kept.invoke(QUERY)}
    before = len(fake_openai.requests)
    output: Any = await bounded(
        client.runs.wait(
            None,
            "tag_query",
            input={"query": QUERY, "rulebook": pep8_json},
            context={"prefilter": "bm25:2"},
        )
    )
    assert output["cost"]["judgments"] == 2 < len(pep8_rulebook)
    assert len(fake_openai.requests) - before == 2 + 1  # and the executor's call
    assert {m["rule_id"] for m in output["matches"]} <= expected


async def test_query_run_judges_with_a_decision_model(
    decision_studio: str,
    fake_decisions: FakeDecisionsServer,
    pep8_rulebook: Rulebook,
    pep8_json: dict[str, Any],
) -> None:
    """One `/v1/decisions` request per input, one question per rule, no action."""
    sdk = get_client(url=decision_studio, api_key=None)
    try:
        outputs: list[Any] = [
            await bounded(
                sdk.runs.wait(
                    None,
                    "tag_query",
                    input={"query": query, "rulebook": pep8_json},
                    raise_error=False,
                )
            )
            for query in (QUERY, OTHER_QUERY)
        ]
    finally:
        await sdk.aclose()
    for output in outputs:
        assert "__error__" not in output, output["__error__"]
    first, other = outputs
    assert ids(first["matches"]) == MATCHED
    assert ids(other["matches"]) == ["PEP8-LAMBDA-ASSIGN"]
    # The scores are the decision model's probabilities of YES.
    yes = fake_decisions.model.yes_probability
    assert [m["score"] for m in first["matches"]] == [yes] * len(MATCHED)
    assert first["cost"]["judgments"] == len(pep8_rulebook)
    assert first["cost"]["judge_usage"]["calls"] == 1

    # One request per input, asking about every rule once, of the model named. The
    # runs' own cost says one request each (above); the fake may see a request twice
    # when the SDK retries one it lost the answer to on a loaded machine (seen once
    # in CI, three test processes on 2 cores): a retry repeats the same body.
    requests = fake_decisions.requests
    assert fake_decisions.request_count == len(requests)
    bodies = {json.dumps(r, sort_keys=True) for r in requests}
    assert sorted(json.loads(body)["input"] for body in bodies) == sorted(
        [QUERY, OTHER_QUERY]
    )
    rule_ids = sorted(rule.rule_id for rule in pep8_rulebook.rules)
    for request in requests:
        assert request["model"] == DECISION_MODEL
        assert sorted(q["name"] for q in request["questions"]) == rule_ids
        sent = [words(text) for text in strings(request)]
        for rule in pep8_rulebook.rules:
            assert any(words(rule.condition) in text for text in sent), rule.rule_id
            assert not any(words(rule.action) in text for text in sent), rule.rule_id

    # The executor (a chat model at the same address) got the matched actions.
    chats = fake_decisions.chat_requests
    assert len({json.dumps(c, sort_keys=True) for c in chats}) == 2
    prompt = words(" ".join(strings(chats[0]["messages"])))
    for rule in pep8_rulebook.rules:
        assert (words(rule.action) in prompt) == (rule.rule_id in MATCHED)


DOCUMENTS: list[dict[str, Any]] = [
    {"page_content": STYLE_GUIDE, "metadata": {"source": "style.md"}}
]
"""Documents as JSON, the only way a server client (or Studio) can send them."""


async def test_extraction_run_returns_a_rulebook(client: LangGraphClient) -> None:
    extraction_input: dict[str, Any] = {
        "documents": DOCUMENTS,
        "domain": "Python code style",
    }
    thread = await bounded(client.threads.create())
    output: Any = await bounded(
        client.runs.wait(
            thread["thread_id"],
            "tag_extraction",
            input=extraction_input,
            raise_error=False,
        )
    )
    assert "__error__" not in output, output["__error__"]
    rulebook = Rulebook.model_validate(output["rulebook"])
    assert len(rulebook) == 2
    assert {r.condition for r in rulebook.rules} == {
        "The input contains `from os import *`",
        "The input contains `except:`",
    }


async def test_query_run_with_documents_extracts_then_matches(
    client: LangGraphClient,
) -> None:
    query_input: dict[str, Any] = {
        "query": "from os import *\ntry:\n    f()\nexcept:\n    pass\n",
        "documents": DOCUMENTS,
    }
    output: Any = await bounded(
        client.runs.wait(
            None,
            "tag_query",
            input=query_input,
            raise_error=False,
        )
    )
    assert "__error__" not in output, output["__error__"]
    assert len(output["matches"]) == 2


async def test_agent_run_gives_its_model_only_the_matched_actions(
    client: LangGraphClient, fake_openai: FakeOpenAIServer
) -> None:
    rulebook = curated_rulebook("pep8")  # graphs/agent.py's default
    matched = ["pep8-wildcard-import", "pep8-none-comparison-identity"]
    question: Any = {"messages": [{"role": "user", "content": QUERY}]}
    thread = await bounded(client.threads.create())
    before = len(fake_openai.requests)
    output: Any = await bounded(
        client.runs.wait(
            thread["thread_id"],
            "tag_agent",
            input=question,
        )
    )
    state = await bounded(client.threads.get_state(thread["thread_id"]))
    values: Any = state["values"]
    assert ids(values["tag"]["matched"]) == matched
    assert values["tag_applied_rule_ids"] == matched

    # One judgment per rule, then one call of the agent's model, which got the
    # matched actions in its system message and no rule's condition.
    requests = fake_openai.requests[before:]
    assert len(requests) == len(rulebook) + 1
    system = requests[-1]["messages"][0]
    assert system["role"] == "system"
    for rule in rulebook.rules:
        action = " ".join(rule.action.split())
        assert (action in system["content"]) == (rule.rule_id in matched)
        assert rule.condition not in system["content"]
    assert output["messages"][-1]["type"] == "ai"
