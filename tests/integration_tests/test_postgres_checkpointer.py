"""The query and extraction graphs on a PostgreSQL checkpointer.

Each run uses a new graph and a new saver with its own connection, as separate
server processes (or machines) sharing one database would: a thread paused by the
review interrupt in one is resumed in another, and an extraction stopped by a
provider outage is finished by another without repeating a completed model call.
Sync (`PostgresSaver`) and async (`AsyncPostgresSaver`) runs are mixed both ways.
A `langgraph dev` server configured with `graphs/checkpointer.py` keeps its threads
in PostgreSQL across a restart.

Needs a PostgreSQL server: set `TAG_TEST_POSTGRES_URI` (`scripts/postgres start`
prints it for a throwaway local one); the tests skip when it is unset or
unreachable.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command, StateSnapshot
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from psycopg.conninfo import conninfo_to_dict

from langchain_tag import Rulebook
from langchain_tag.extraction import aextract_rules, extract_rules, prompts
from langchain_tag.models import CallRetry
from langchain_tag.query_graph import QueryContext, build_query_graph
from langchain_tag.testing import (
    ExtractionFakeChatModel,
    FakeOpenAIServer,
    FaultSchedule,
    JudgeAndExtractorFakeChatModel,
    TransientFakeError,
)
from tests.integration_tests.servers import LANGGRAPH, langgraph_dev

pytestmark = pytest.mark.postgres

URI_VARIABLE = "TAG_TEST_POSTGRES_URI"
CONNECT_SECONDS = 5
CALL_SECONDS = 30.0
REPO = Path(__file__).resolve().parents[2]

Mode = Literal["sync", "async"]
HANDOVERS = [("sync", "async"), ("async", "sync")]
"""(first process, second process): each run mode picks up the other's thread."""

STYLE_GUIDE = """\
# Style

Wildcard imports such as `from os import *` must never be used.

Bare `except:` clauses should never be used.

Function names should be lowercase in new code, for example `parse_record`.
"""
"""The extraction fake makes three rules of it, conditioned on `from os import *`,
`except:` and `parse_record`."""
QUERY = "from os import *\ntry:\n    f()\nexcept:\n    pass\n"
"""Satisfies the wildcard-import and bare-except rules."""

GUIDE = """\
# Team guide

The conventions of the team, written down so that reviewers and authors agree.

## Imports

Each import should be on its own line, as in `import os`. Wildcard imports such as
`from os import *` must never be used, because they hide where names come from.

## Naming

Function names should be lowercase, as in `snake_case`. Class names must use the
CapWords convention, as in `MyClass`.

## Comments

Comments should be complete sentences. You must keep comments up to date when the
code changes, and inline comments like `x = 1  # count` should be rare.

## Exceptions

Bare `except:` clauses should never be used; catch specific exceptions instead.
Raised exceptions must derive from `Exception`, never from `BaseException`.
"""
"""Cut into five sections (`max_section_tokens=60`), so phase 1 fans out and the
outage can stop it half done."""
FAST_RETRY = CallRetry(max_attempts=2, initial_delay=0.01, max_delay=0.02)


# --- the database ---------------------------------------------------------------------


def where(uri: str) -> str:
    """The server and database of a URI, without its password."""
    parts = conninfo_to_dict(uri)
    host = parts.get("host", "localhost")
    return f"{host}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


@pytest.fixture(scope="module")
def postgres_uri() -> str:
    """The database URI; skips when none is configured or it cannot be reached."""
    uri = os.environ.get(URI_VARIABLE)
    if not uri:
        pytest.skip(
            f"{URI_VARIABLE} is not set: start a throwaway PostgreSQL with "
            '`eval "$(bash scripts/postgres start)"` (CI does)'
        )
    try:
        psycopg.connect(uri, connect_timeout=CONNECT_SECONDS).close()
    except psycopg.Error as error:
        pytest.skip(
            f"cannot reach PostgreSQL at {where(uri)} ({URI_VARIABLE}): {error}"
        )
    with PostgresSaver.from_conn_string(uri) as saver:
        saver.setup()  # idempotent: creates or migrates the checkpoint tables
    return uri


def new_thread() -> RunnableConfig:
    # The database outlives a test run: every thread is new.
    return {"configurable": {"thread_id": f"test-{uuid.uuid4()}"}}


# --- one run per "process": a new graph and a new saver connection each ---------------


async def run_query(
    mode: Mode,
    uri: str,
    graph_input: Any,
    config: RunnableConfig,
    context: QueryContext,
) -> tuple[dict[str, Any], StateSnapshot]:
    """Run the query graph once; its output and the thread's state after the run."""
    if mode == "async":
        async with AsyncPostgresSaver.from_conn_string(uri) as saver:
            graph = build_query_graph(checkpointer=saver)
            output = await graph.ainvoke(graph_input, config, context=context)
            return output, await graph.aget_state(config)

    def run() -> tuple[dict[str, Any], StateSnapshot]:
        with PostgresSaver.from_conn_string(uri) as saver:
            graph = build_query_graph(checkpointer=saver)
            output = graph.invoke(graph_input, config, context=context)
            return output, graph.get_state(config)

    return await asyncio.to_thread(run)


async def run_extraction(
    mode: Mode, uri: str, llm: ExtractionFakeChatModel, thread_id: str
) -> Rulebook:
    """Extract GUIDE with `llm`, checkpointed in PostgreSQL under `thread_id`."""
    documents = [Document(page_content=GUIDE, metadata={"source": "guide.md"})]
    settings: dict[str, Any] = {
        "llm": llm,
        "thread_id": thread_id,
        "max_concurrency": 4,
        "retry": FAST_RETRY,
        "max_section_tokens": 60,
    }
    if mode == "async":
        async with AsyncPostgresSaver.from_conn_string(uri) as saver:
            return await aextract_rules(documents, checkpoint=saver, **settings)

    def run() -> Rulebook:
        with PostgresSaver.from_conn_string(uri) as saver:
            return extract_rules(documents, checkpoint=saver, **settings)

    return await asyncio.to_thread(run)


def ids(matches: Sequence[Mapping[str, Any]]) -> list[str]:
    return [m["rule_id"] for m in matches]


def rule_with(rules: Sequence[Mapping[str, Any]], fragment: str) -> dict[str, Any]:
    """The extracted rule whose condition names `fragment` (ids are content hashes)."""
    return dict(next(r for r in rules if f"`{fragment}`" in r["condition"]))


def without_diagnostics(rulebook: Rulebook) -> dict[str, Any]:
    return rulebook.model_dump(mode="json", exclude={"diagnostics"})


# --- tests ----------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), HANDOVERS)
async def test_review_paused_in_one_process_is_resumed_in_another(
    postgres_uri: str, first: Mode, second: Mode
) -> None:
    model = JudgeAndExtractorFakeChatModel()
    context = QueryContext(judge_model=model, review=True)
    config = new_thread()
    documents = [Document(page_content=STYLE_GUIDE, metadata={"source": "style.md"})]

    paused, state = await run_query(
        first, postgres_uri, {"query": QUERY, "documents": documents}, config, context
    )
    (pending,) = paused["__interrupt__"]
    rules = [a["args"] for a in pending.value["action_requests"]]
    assert len(rules) == 3
    assert state.next == ("review",)
    extraction_calls = model.extractor.calls
    assert model.judge.calls == 0  # nothing judged before the review

    # The other process knows the thread id and the models, not the first context.
    dropped = rule_with(rules, "from os import *")["rule_id"]
    output, state = await run_query(
        second,
        postgres_uri,
        Command(resume={"drop": [dropped]}),
        config,
        QueryContext(judge_model=model),
    )

    assert ids(output["matches"]) == [rule_with(rules, "except:")["rule_id"]]
    assert output["cost"]["rules"] == output["cost"]["judgments"] == 2
    assert model.extractor.calls == extraction_calls  # the extraction was not redone
    assert model.judge.calls == 2 + 1  # two judgments and the executor
    assert not state.next
    assert dropped not in [rule.rule_id for rule in state.values["rules"]]


@pytest.mark.parametrize(("first", "second"), HANDOVERS)
async def test_extraction_stopped_by_an_outage_resumes_without_repeating_calls(
    postgres_uri: str, first: Mode, second: Mode
) -> None:
    clean_llm = ExtractionFakeChatModel()
    clean = await run_extraction(
        first, postgres_uri, clean_llm, f"clean-{uuid.uuid4()}"
    )
    calls = clean_llm.prompts
    assert len(set(calls)) == len(calls) > 10  # distinct prompts name the calls

    # The provider goes down after a few calls, while phase 1 is fanned out; the
    # retries are spent and the run fails.
    answered = 3
    span_prompt = prompts.SPAN_DETECTION_SYSTEM.split("{domain}")[0]
    assert sum(span_prompt in p for p in calls) > answered
    outage = TransientFakeError("provider outage", status_code=503)
    failing = ExtractionFakeChatModel(
        schedule=[FaultSchedule(outage, start=answered + 1)]
    )
    thread_id = f"outage-{uuid.uuid4()}"
    with pytest.raises(TransientFakeError, match="provider outage"):
        await run_extraction(first, postgres_uri, failing, thread_id)
    completed = set(failing.prompts[:answered])

    # Another process, with the provider back, resumes the thread from PostgreSQL.
    healthy = ExtractionFakeChatModel()
    resumed = await run_extraction(second, postgres_uri, healthy, thread_id)

    assert not completed & set(healthy.prompts)  # no completed call made again
    assert sorted([*completed, *healthy.prompts]) == sorted(calls)  # none lost
    assert without_diagnostics(resumed) == without_diagnostics(clean)

    # Finished: a third process gets the rulebook back without any call.
    idle = ExtractionFakeChatModel()
    again = await run_extraction(first, postgres_uri, idle, thread_id)
    assert idle.calls == 0
    assert without_diagnostics(again) == without_diagnostics(clean)


# --- a LangGraph server ---------------------------------------------------------------


@asynccontextmanager
async def tag_query_server(
    config_file: Path, fake: FakeOpenAIServer, postgres_uri: str
) -> AsyncIterator[LangGraphClient]:
    """`langgraph dev` run from the config's directory; an SDK client of it."""
    with langgraph_dev(
        fake.base_url,
        cwd=config_file.parent,
        log=config_file.with_name("langgraph-dev.log"),
        config_file=config_file,
        env={"TAG_POSTGRES_URI": postgres_uri},
    ) as url:
        client = get_client(url=url, api_key=None)
        try:
            yield client
        finally:
            await client.aclose()


@pytest.mark.server
@pytest.mark.skipif(
    not LANGGRAPH.is_file() or importlib.util.find_spec("langgraph_api") is None,
    reason="needs `langgraph dev`: install the `server` dependency group "
    "(langgraph-cli[inmem])",
)
async def test_langgraph_dev_keeps_a_paused_thread_in_postgres_across_a_restart(
    postgres_uri: str, tmp_path: Path
) -> None:
    graphs = REPO / "graphs"
    config_file = tmp_path / "langgraph.json"
    config_file.write_text(
        json.dumps(
            {
                "dependencies": [str(REPO)],
                "graphs": {"tag_query": f"{graphs / 'query.py'}:graph"},
                "checkpointer": {
                    "path": f"{graphs / 'checkpointer.py'}:postgres_checkpointer"
                },
            }
        ),
        encoding="utf-8",
    )
    documents: Any = [{"page_content": STYLE_GUIDE, "metadata": {"source": "style.md"}}]
    model = JudgeAndExtractorFakeChatModel()
    with FakeOpenAIServer(model) as fake:
        async with tag_query_server(config_file, fake, postgres_uri) as client:
            thread = await asyncio.wait_for(client.threads.create(), CALL_SECONDS)
            paused: Any = await asyncio.wait_for(
                client.runs.wait(
                    thread["thread_id"],
                    "tag_query",
                    input={"query": QUERY, "documents": documents},
                    context={"review": True},
                ),
                CALL_SECONDS,
            )
        (pending,) = paused["__interrupt__"]
        rules = [a["args"] for a in pending["value"]["action_requests"]]
        extraction_calls = model.extractor.calls

        # The server's checkpoints are in PostgreSQL, readable by any saver.
        thread_config: RunnableConfig = {
            "configurable": {"thread_id": thread["thread_id"], "checkpoint_ns": ""}
        }
        with PostgresSaver.from_conn_string(postgres_uri) as saver:
            assert saver.get_tuple(thread_config) is not None

        # A new server process resumes the paused thread.
        dropped = rule_with(rules, "from os import *")["rule_id"]
        async with tag_query_server(config_file, fake, postgres_uri) as client:
            state: Any = await asyncio.wait_for(
                client.threads.get_state(thread["thread_id"]), CALL_SECONDS
            )
            assert state["next"] == ["review"]
            output: Any = await asyncio.wait_for(
                client.runs.wait(
                    thread["thread_id"],
                    "tag_query",
                    command={"resume": {"drop": [dropped]}},
                ),
                CALL_SECONDS,
            )

    assert ids(output["matches"]) == [rule_with(rules, "except:")["rule_id"]]
    assert model.extractor.calls == extraction_calls  # not extracted again
