"""The query graph: load_rulebook, (extract, review), plan, match_rule*, execute.

Everything runs on the deterministic fakes of `langchain_tag.testing`: the judge says
YES exactly when a backtick-quoted fragment of a rule's condition is in the query, and
echoes any other prompt (so the executor's answer shows what it was given).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from langchain_core.callbacks import (
    CallbackManagerForLLMRun,
)
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.cache.memory import InMemoryCache
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, StateGraph
from langgraph.types import Command
from pydantic import Field

from langchain_tag import Rulebook, query_graph
from langchain_tag._graph import coerce_context
from langchain_tag.engine import select_applicable
from langchain_tag.errors import (
    JudgmentError,
    ModelNotConfiguredError,
    ReviewNeedsCheckpointerError,
    RulebookError,
    RulebookPathError,
)
from langchain_tag.execution import GENERIC_TEMPLATE, prompts
from langchain_tag.execution.templates import TEMPLATES
from langchain_tag.extraction import build_extraction_graph
from langchain_tag.matching import ApplicabilityJudge, Verdict, constraint_profile
from langchain_tag.matching.profiles import PROFILES
from langchain_tag.matching.prompts import read_judge_message
from langchain_tag.models import CallRetry
from langchain_tag.query_graph import (
    QueryContext,
    QueryInput,
    build_query_graph,
    checkpoint_serializer,
)
from langchain_tag.rule_schemas import NBA_SCHEMA
from langchain_tag.rules import Rule
from langchain_tag.testing import (
    FakeClock,
    JudgeAndExtractorFakeChatModel,
    RuleAwareFakeChatModel,
    TransientFakeError,
    trigger_rulebook,
)
from langchain_tag.usage import PromptCaching, TokenUsage

FIXTURES = Path(__file__).parent.parent / "fixtures"
PEP8_PATH = FIXTURES / "pep8_rulebook.json"
REPO = Path(__file__).resolve().parents[2]
DIAGRAMS = REPO / "docs" / "diagrams"

QUERY = "from os import *\n\nif x == None:\n    pass\n"
"""Satisfies the conditions of PEP8-IMPORT-WILDCARD and PEP8-NONE-IDENTITY only."""
MATCHED = ["PEP8-IMPORT-WILDCARD", "PEP8-NONE-IDENTITY"]
OTHER_QUERY = "square = lambda x: x * x\n"
"""Satisfies PEP8-LAMBDA-ASSIGN only."""

STYLE_GUIDE = """\
# Style

Wildcard imports such as `from os import *` must never be used.

Bare `except:` clauses should never be used.

Function names should be lowercase in new code, for example `parse_record`.
Function names should be lowercase in old code too, as in `read_file`.
"""
"""ExtractionFakeChatModel makes four rules of it, conditioned on `from os import *`,
`except:`, `parse_record` and `read_file`; the last two overlap (same name)."""
DOCS_QUERY = "from os import *\ntry:\n    f()\nexcept:\n    pass\n"
"""Satisfies the extracted wildcard-import and bare-except rules."""


# --- test-local models ---------------------------------------------------------------


class CannedChatModel(BaseChatModel):
    """An executor that answers every prompt with `answer` and records the prompts."""

    answer: str
    prompts: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "canned-fake"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.prompts.append("\n".join(str(m.content) for m in messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(self.answer))])


# --- helpers --------------------------------------------------------------------------


def judge_prompts(model: RuleAwareFakeChatModel) -> list[str]:
    return [p for p in model.prompts if read_judge_message(p) is not None]


def other_prompts(model: RuleAwareFakeChatModel) -> list[str]:
    return [p for p in model.prompts if read_judge_message(p) is None]


def ids(matches: Sequence[Mapping[str, Any]]) -> list[str]:
    return [m["rule_id"] for m in matches]


def thread() -> RunnableConfig:
    return {"configurable": {"thread_id": str(uuid.uuid4())}}


def style_guide() -> list[Document]:
    return [Document(page_content=STYLE_GUIDE, metadata={"source": "style.md"})]


def rule_with(rules: Sequence[Mapping[str, Any]], fragment: str) -> dict[str, Any]:
    """The extracted rule whose condition names `fragment` (ids are content hashes)."""
    return dict(next(r for r in rules if f"`{fragment}`" in r["condition"]))


@pytest.fixture
def pep8_json(pep8_rulebook: Rulebook) -> dict[str, Any]:
    return pep8_rulebook.model_dump(mode="json")


@pytest.fixture
def judge() -> RuleAwareFakeChatModel:
    return RuleAwareFakeChatModel()


# --- rulebook paths in a run's input ------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/etc/hostname", "/dev/zero", "/no/such/file.json", str(PEP8_PATH)]
)
def test_a_served_graph_opens_no_rulebook_path(
    path: str, judge: RuleAwareFakeChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: any server-side path was opened (/dev/zero read until memory ran
    # out), and the errors told missing, not JSON and not a rulebook apart.
    monkeypatch.delenv("TAG_RULEBOOK_DIR", raising=False)
    served = importlib.reload(importlib.import_module("graphs.query")).compiled
    with pytest.raises(RulebookPathError) as refused:
        served.invoke(
            {"query": QUERY, "rulebook": path}, context=QueryContext(judge_model=judge)
        )
    assert str(refused.value) == str(query_graph._refused())  # the same for every path
    assert path not in str(refused.value)
    assert judge.calls == 0


def test_a_graph_opens_rulebook_paths_only_inside_its_folder(
    tmp_path: Path,
    pep8_rulebook: Rulebook,
    judge: RuleAwareFakeChatModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    allowed = tmp_path / "rulebooks"
    allowed.mkdir()
    pep8_rulebook.save(allowed / "pep8.json")
    pep8_rulebook.save(tmp_path / "outside.json")
    (allowed / "link.json").symlink_to(tmp_path / "outside.json")
    limit = (allowed / "pep8.json").stat().st_size
    (allowed / "big.json").write_bytes(b" " * (limit + 1))
    monkeypatch.setattr(query_graph, "MAX_RULEBOOK_BYTES", limit)
    graph = build_query_graph(rulebook_dir=allowed)
    context = QueryContext(judge_model=judge)

    # Inside the folder, by a relative name or its full path.
    for name in ("pep8.json", str(allowed / "pep8.json")):
        output = graph.invoke({"query": QUERY, "rulebook": name}, context=context)
        assert [d.id for d in output["result"].documents] == MATCHED
    # Outside it (by .., by a link, by an absolute path), too big, or missing: refused.
    for name in (
        "../outside.json",
        "link.json",
        str(tmp_path / "outside.json"),
        "big.json",
        "missing.json",
    ):
        with pytest.raises(RulebookPathError):
            graph.invoke({"query": QUERY, "rulebook": name}, context=context)


def test_models_and_the_filter_travel_as_json_in_the_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: only Python objects were accepted; a server's JSON context dropped them.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    schema = build_query_graph().get_context_jsonschema()
    assert schema is not None
    properties = schema["properties"]
    assert {"judge_model", "executor_model", "filter"} <= set(properties)
    context = QueryContext(
        judge_model="openai:gpt-4o-mini",
        executor_model="openai:gpt-4.1-mini",
        filter={"tags": ["imports"]},
    )
    assert isinstance(context.judge_model, ChatOpenAI)
    assert context.judge_model.model_name == "gpt-4o-mini"
    assert isinstance(context.executor_model, ChatOpenAI)
    with pytest.raises(ValueError, match="judge_model='nope:x' names no chat model"):
        QueryContext(judge_model="nope:x")


# --- end to end with a rulebook -------------------------------------------------------


@pytest.mark.parametrize("given", ["json", "path"])
def test_end_to_end_with_a_rulebook(
    given: str,
    pep8_rulebook: Rulebook,
    pep8_json: dict[str, Any],
    judge: RuleAwareFakeChatModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a fake clock each model call "takes" 0.25 s, so the run's seconds are known.
    clock = FakeClock(start=1_000.0)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    monkeypatch.setattr(query_graph, "time", SimpleNamespace(time=clock.time))
    judge.latency = 0.25
    rulebook: dict[str, Any] | str = pep8_json if given == "json" else str(PEP8_PATH)
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": rulebook}, context=QueryContext(judge_model=judge)
    )

    assert set(output) == {"answer", "matches", "cost", "result"}
    assert [d.id for d in output["result"].documents] == MATCHED
    assert ids(output["matches"]) == MATCHED  # rulebook order: no scores
    rules = {r.rule_id: r for r in pep8_rulebook.rules}
    for match in output["matches"]:
        assert match["name"] == rules[match["rule_id"]].name
        assert match["score"] is None

    # The executor (an echo) saw the query and the matched actions, nothing else.
    answer = output["answer"]
    assert isinstance(answer, str)
    assert answer.startswith(judge.answer_prefix)
    assert QUERY.strip() in answer
    for rule in pep8_rulebook.rules:
        assert (rule.action in answer) == (rule.rule_id in MATCHED), rule.rule_id
        assert rule.condition not in answer
        assert rule.name not in answer
        assert rule.source_text not in answer

    assert output["cost"]["rules"] == len(pep8_rulebook) == 9
    assert output["cost"]["judgments"] == len(pep8_rulebook)
    assert output["cost"]["applicable"] == len(MATCHED)
    assert output["cost"]["executor_calls"] == 1
    assert output["cost"]["seconds"] == 0.25 * (len(pep8_rulebook) + 1)

    # One judgment per rule, none of them shown an action; one executor call.
    judged = judge_prompts(judge)
    assert len(judged) == len(pep8_rulebook)
    assert len(other_prompts(judge)) == 1
    for prompt in judged:
        assert not any(rule.action in prompt for rule in pep8_rulebook.rules)


@pytest.mark.parametrize("as_dict", [False, True])
def test_one_judge_serves_every_rule_of_a_run(
    pep8_json: dict[str, Any],
    judge: RuleAwareFakeChatModel,
    monkeypatch: pytest.MonkeyPatch,
    as_dict: bool,  # noqa: FBT001 - a parameter of the test
) -> None:
    # A LangGraph server passes the run context as a dict, as `as_dict` does.
    built: list[QueryContext] = []
    real = QueryContext.settings

    def counting(context: QueryContext, *args: Any) -> Any:
        built.append(context)
        return real(context, *args)

    monkeypatch.setattr(QueryContext, "settings", counting)
    graph = build_query_graph()
    for _ in range(2):
        # A server's JSON context is a dict: typed as the context only here.
        context = cast(
            "QueryContext",
            {"judge_model": judge} if as_dict else QueryContext(judge_model=judge),
        )
        output = graph.invoke({"query": QUERY, "rulebook": pep8_json}, context=context)
        assert output["cost"]["judgments"] == 9
    assert len(built) == 2  # once per run, not once per rule


def test_a_rulebook_without_rules_skips_matching(judge: RuleAwareFakeChatModel) -> None:
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": {"rules": []}},
        context=QueryContext(judge_model=judge),
    )
    assert output["matches"] == []
    assert output["cost"]["judgments"] == 0
    assert prompts.NO_GUIDANCE in output["answer"]
    assert judge_prompts(judge) == []


def test_neither_rulebook_nor_documents_is_a_clear_error(
    judge: RuleAwareFakeChatModel,
) -> None:
    with pytest.raises(ValueError, match="needs a rulebook, or documents") as error:
        build_query_graph().invoke(
            {"query": QUERY}, context=QueryContext(judge_model=judge)
        )
    assert query_graph.INPUT_SCHEMA in str(error.value)


@pytest.mark.parametrize("given", ["rulebook", "documents", "nothing"])
def test_an_input_without_query_names_the_key_and_the_input_schema(
    given: str, pep8_json: dict[str, Any]
) -> None:
    """Refused where the graph starts, before any model call (was a raw KeyError)."""
    model = JudgeAndExtractorFakeChatModel()
    choices: dict[str, dict[str, Any]] = {
        "rulebook": {"rulebook": pep8_json},
        "documents": {"documents": style_guide()},
        "nothing": {},
    }
    inputs = choices[given]
    with pytest.raises(ValueError, match="input has no 'query'") as error:
        build_query_graph().invoke(
            cast("QueryInput", inputs), context=QueryContext(judge_model=model)
        )
    assert not isinstance(error.value, KeyError)
    message = str(error.value)
    assert query_graph.INPUT_SCHEMA in message
    assert '"query"' in message
    assert '"rulebook"' in message
    assert '"documents"' in message
    assert "QueryInput" in message
    assert model.extractor.calls == 0
    assert model.judge.prompts == []


def test_the_schema_in_input_errors_names_every_input_key() -> None:
    for key in QueryInput.__annotations__:
        assert f'"{key}"' in query_graph.INPUT_SCHEMA


async def test_an_async_input_without_query_is_refused_too(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    with pytest.raises(ValueError, match="input has no 'query'"):
        await build_query_graph().ainvoke(
            cast("QueryInput", {"rulebook": pep8_json}),
            context=QueryContext(judge_model=judge),
        )
    assert judge.prompts == []


def test_a_query_that_is_not_text_is_a_clear_error(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    with pytest.raises(TypeError, match="'query' must be a string, not list"):
        build_query_graph().invoke(
            cast("QueryInput", {"query": [QUERY], "rulebook": pep8_json}),
            context=QueryContext(judge_model=judge),
        )
    assert judge.prompts == []


def test_a_later_run_on_a_thread_needs_its_own_query(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    """The query is consumed with the run, as the rulebook: never answered twice."""
    graph = build_query_graph(checkpointer=InMemorySaver())
    config = thread()
    context = QueryContext(judge_model=judge)
    graph.invoke({"query": QUERY, "rulebook": pep8_json}, config, context=context)
    asked = len(judge.prompts)
    with pytest.raises(ValueError, match="input has no 'query'"):
        graph.invoke(
            cast("QueryInput", {"rulebook": pep8_json}), config, context=context
        )
    assert len(judge.prompts) == asked


# --- the per-rule fan-out, streamed ---------------------------------------------------


def check_fan_out(updates: Sequence[Mapping[str, Any]], rulebook: Rulebook) -> None:
    nodes = [node for update in updates for node in update]
    assert nodes[:2] == ["load_rulebook", "plan"]
    assert nodes[-1] == "execute"
    judged = [u["match_rule"] for u in updates if "match_rule" in u]
    assert len(judged) == len(rulebook) == nodes.count("match_rule")
    assert all(len(update["verdicts"]) == 1 for update in judged)
    assert sorted(u["verdicts"][0].rule_id for u in judged) == sorted(
        r.rule_id for r in rulebook.rules
    )
    applicable = sorted(
        u["verdicts"][0].rule_id for u in judged if u["verdicts"][0].applies
    )
    assert applicable == sorted(MATCHED)
    assert ids(updates[-1]["execute"]["matches"]) == MATCHED


def test_stream_shows_one_match_rule_update_per_rule(
    pep8_rulebook: Rulebook,
    pep8_json: dict[str, Any],
    overlapping_llm: RuleAwareFakeChatModel,
) -> None:
    judge = overlapping_llm  # its first call waits until a second is in flight
    updates = list(
        build_query_graph().stream(
            {"query": QUERY, "rulebook": pep8_json},
            context=QueryContext(judge_model=judge),
            stream_mode="updates",
        )
    )
    check_fan_out(updates, pep8_rulebook)
    assert judge.peak_in_flight > 1  # the judgments ran side by side


async def test_astream_shows_one_match_rule_update_per_rule(
    pep8_rulebook: Rulebook,
    pep8_json: dict[str, Any],
    overlapping_llm: RuleAwareFakeChatModel,
) -> None:
    judge = overlapping_llm  # its first call waits until a second is in flight
    updates = [
        update
        async for update in build_query_graph().astream(
            {"query": QUERY, "rulebook": pep8_json},
            context=QueryContext(judge_model=judge),
            stream_mode="updates",
        )
    ]
    check_fan_out(updates, pep8_rulebook)
    assert judge.peak_in_flight > 1


async def test_ainvoke_matches_invoke(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    graph = build_query_graph()
    context = QueryContext(judge_model=judge)
    inputs: QueryInput = {"query": QUERY, "rulebook": pep8_json}
    sync = graph.invoke(inputs, context=context)
    async_ = await graph.ainvoke(inputs, context=context)
    assert async_["matches"] == sync["matches"]
    assert async_["answer"] == sync["answer"]


async def test_run_config_max_concurrency_bounds_judgments_in_flight(
    pep8_json: dict[str, Any], overlapping: Callable[..., RuleAwareFakeChatModel]
) -> None:
    """Each server process caps its own share of a provider's rate limit this way."""
    graph = build_query_graph()
    inputs: QueryInput = {"query": QUERY, "rulebook": pep8_json}
    # Calls wait until three are in flight: the bound is reached, whatever the speed.
    sync_judge = overlapping(3)
    graph.invoke(
        inputs, {"max_concurrency": 3}, context=QueryContext(judge_model=sync_judge)
    )
    async_judge = overlapping(3)
    await graph.ainvoke(
        inputs, {"max_concurrency": 3}, context=QueryContext(judge_model=async_judge)
    )
    assert sync_judge.peak_in_flight == async_judge.peak_in_flight == 3


# --- one thread, several runs ---------------------------------------------------------


def test_verdicts_are_reset_on_every_run_of_a_thread(
    pep8_rulebook: Rulebook, pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    graph = build_query_graph(checkpointer=InMemorySaver())
    config = thread()
    context = QueryContext(judge_model=judge)

    first = graph.invoke(
        {"query": QUERY, "rulebook": pep8_json}, config, context=context
    )
    second = graph.invoke(
        {"query": OTHER_QUERY, "rulebook": pep8_json}, config, context=context
    )

    assert ids(first["matches"]) == MATCHED
    assert ids(second["matches"]) == ["PEP8-LAMBDA-ASSIGN"]
    assert not set(ids(second["matches"])) & set(MATCHED)
    for rule_id in MATCHED:
        assert rule_id not in second["answer"]
    assert second["cost"]["judgments"] == len(pep8_rulebook)
    assert second["cost"]["applicable"] == 1
    values = graph.get_state(config).values
    assert len(values["verdicts"]) == len(pep8_rulebook)
    assert [v.rule_id for v in values["verdicts"] if v.applies] == [
        "PEP8-LAMBDA-ASSIGN"
    ]


def test_documents_on_a_thread_that_had_a_rulebook_are_extracted(
    pep8_json: dict[str, Any],
) -> None:
    model = JudgeAndExtractorFakeChatModel()
    graph = build_query_graph(checkpointer=InMemorySaver())
    config = thread()
    context = QueryContext(judge_model=model)
    graph.invoke({"query": QUERY, "rulebook": pep8_json}, config, context=context)

    output = graph.invoke(
        {"query": DOCS_QUERY, "documents": style_guide()}, config, context=context
    )

    assert model.extractor.calls > 0
    assert output["cost"]["rules"] == 4
    assert not any(m["rule_id"].startswith("PEP8-") for m in output["matches"])


# --- documents instead of a rulebook --------------------------------------------------


def test_documents_are_extracted_as_part_of_the_run() -> None:
    model = JudgeAndExtractorFakeChatModel()
    updates = list(
        build_query_graph().stream(
            {"query": DOCS_QUERY, "documents": style_guide()},
            context=QueryContext(judge_model=model),
            stream_mode="updates",
        )
    )
    nodes = [node for update in updates for node in update]
    assert nodes[:4] == ["load_rulebook", "extract", "review", "plan"]

    extracted = next(u["extract"] for u in updates if "extract" in u)
    rules = [r.model_dump(mode="json") for r in extracted["rules"]]
    assert rules == extracted["rulebook"]["rules"]
    assert len(rules) == 4
    Rulebook.model_validate(extracted["rulebook"])

    output = updates[-1]["execute"]
    expected = [rule_with(rules, "from os import *"), rule_with(rules, "except:")]
    assert ids(output["matches"]) == ids(expected)
    assert output["cost"]["rules"] == output["cost"]["judgments"] == 4
    assert nodes.count("match_rule") == 4
    assert model.extractor.calls > 0
    assert len(judge_prompts(model.judge)) == 4
    for rule in rules:
        assert (rule["action"] in output["answer"]) == (rule in expected)


@pytest.mark.parametrize("profile", [None, "condition"])
def test_documents_extracted_in_a_schema_are_judged_by_its_profile(
    profile: str | None,
) -> None:
    model = JudgeAndExtractorFakeChatModel()
    output = build_query_graph().invoke(
        {"query": DOCS_QUERY, "documents": style_guide()},
        context=QueryContext(judge_model=model, rule_schema="nba", profile=profile),
    )
    assert len(output["matches"]) == 2  # the wildcard import and the bare except
    judged = judge_prompts(model.judge)
    assert len(judged) == 4
    # The NBA matcher's fields, unless the context names another profile.
    assert all(('"applicable"' in p) == (profile is None) for p in judged)
    assert all(("violation_check" in p) == (profile is None) for p in judged)


def test_a_rulebook_is_judged_by_the_profile_of_its_schema(
    pep8_rulebook: Rulebook, judge: RuleAwareFakeChatModel
) -> None:
    nba = pep8_rulebook.model_copy(update={"rule_schema": NBA_SCHEMA})
    graph = build_query_graph()
    for rulebook, asked in ((nba, True), (pep8_rulebook, False)):
        judge.reset()
        graph.invoke(
            {"query": QUERY, "rulebook": rulebook.model_dump(mode="json")},
            context=QueryContext(judge_model=judge),
        )
        judged = judge_prompts(judge)
        assert judged
        assert all(('"applicable"' in p) == asked for p in judged)


async def test_documents_are_extracted_in_async_runs_too() -> None:
    model = JudgeAndExtractorFakeChatModel()
    output = await build_query_graph().ainvoke(
        {"query": DOCS_QUERY, "documents": style_guide()},
        context=QueryContext(judge_model=model),
    )
    assert len(output["matches"]) == 2
    assert output["cost"]["rules"] == 4


class AsyncOnlySaver(InMemorySaver):
    """A checkpointer with async methods only, as a LangGraph server's custom one.

    Sync calls are refused off the event loop (the async methods use them on it).
    """

    def get_tuple(self, config: RunnableConfig) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            msg = "sync checkpointer call outside the event loop"
            raise NotImplementedError(msg) from None
        return super().get_tuple(config)


async def test_async_runs_extract_without_sync_checkpointer_calls() -> None:
    model = JudgeAndExtractorFakeChatModel()
    graph = build_query_graph(checkpointer=AsyncOnlySaver())
    output = await graph.ainvoke(
        {"query": DOCS_QUERY, "documents": style_guide()},
        thread(),
        context=QueryContext(judge_model=model),
    )
    assert output["cost"]["rules"] == 4
    assert len(output["matches"]) == 2


def test_extraction_domain_comes_from_the_context() -> None:
    model = JudgeAndExtractorFakeChatModel()
    build_query_graph().invoke(
        {"query": DOCS_QUERY, "documents": style_guide()},
        context=QueryContext(judge_model=model, domain="Python code style"),
    )
    assert model.extractor.prompts
    assert all("Python code style" in p for p in model.extractor.prompts)


# --- human review ---------------------------------------------------------------------


def start_review(
    graph: Any, context: QueryContext
) -> tuple[RunnableConfig, list[dict[str, Any]]]:
    """Run until the review interrupt; the config of the thread and the rules shown."""
    config = thread()
    result = graph.invoke(
        {"query": DOCS_QUERY, "documents": style_guide()}, config, context=context
    )
    (interrupt,) = result["__interrupt__"]
    return config, [action["args"] for action in interrupt.value["action_requests"]]


def reviewing(
    checkpointer: BaseCheckpointSaver[Any] | None = None,
) -> tuple[
    JudgeAndExtractorFakeChatModel,
    Any,
    QueryContext,
    RunnableConfig,
    list[dict[str, Any]],
]:
    """A graph with a checkpointer, run until the review of its extracted rules.

    Returns:
        The model, the graph, the context, the thread's config and the rules shown.
    """
    model = JudgeAndExtractorFakeChatModel()
    graph = build_query_graph(checkpointer=checkpointer or InMemorySaver())
    context = QueryContext(judge_model=model, review=True)
    config, rules = start_review(graph, context)
    return model, graph, context, config, rules


def test_review_pauses_with_the_extracted_rules() -> None:
    model = JudgeAndExtractorFakeChatModel()
    graph = build_query_graph(checkpointer=InMemorySaver())
    config = thread()
    result = graph.invoke(
        {"query": DOCS_QUERY, "documents": style_guide()},
        config,
        context=QueryContext(judge_model=model, review=True),
    )

    assert set(result) == {"__interrupt__"}
    (interrupt,) = result["__interrupt__"]
    # LangChain's HITL request, as Studio and Agent Chat UI read it.
    request = interrupt.value
    assert set(request) == {"action_requests", "review_configs", "problem"}
    assert request["problem"] is None
    assert request["review_configs"] == [
        {"action_name": "keep_rule", "allowed_decisions": ["approve", "edit", "reject"]}
    ]
    actions = request["action_requests"]
    assert [a["name"] for a in actions] == ["keep_rule"] * 4
    rules = [a["args"] for a in actions]
    assert rules == [
        r.model_dump(mode="json") for r in graph.get_state(config).values["rules"]
    ]
    wildcard = rule_with(rules, "from os import *")
    (description,) = [
        a["description"] for a in actions if a["args"]["rule_id"] == wildcard["rule_id"]
    ]
    assert description == (
        f"[{wildcard['rule_id']}] {wildcard['name']}: "
        f"{' '.join(wildcard['condition'].split())} \N{RIGHTWARDS ARROW} "
        f"{' '.join(wildcard['action'].split())}"
    )
    assert "\n" not in description
    snapshot = graph.get_state(config)
    assert snapshot.next == ("review",)
    assert judge_prompts(model.judge) == []  # nothing judged before the review


@pytest.mark.parametrize("approval", [True, {"approve": True}])
def test_review_approved_keeps_every_rule(approval: object) -> None:
    model, graph, context, config, rules = reviewing()
    extraction_calls = model.extractor.calls

    output = graph.invoke(Command(resume=approval), config, context=context)

    expected = [rule_with(rules, "from os import *"), rule_with(rules, "except:")]
    assert ids(output["matches"]) == ids(expected)
    assert output["cost"]["rules"] == 4
    assert model.extractor.calls == extraction_calls  # resuming does not re-extract


def test_review_drop_removes_the_rule() -> None:
    model, graph, context, config, rules = reviewing()
    dropped = rule_with(rules, "from os import *")["rule_id"]

    output = graph.invoke(Command(resume={"drop": [dropped]}), config, context=context)

    assert ids(output["matches"]) == [rule_with(rules, "except:")["rule_id"]]
    assert output["cost"]["rules"] == output["cost"]["judgments"] == 3
    assert not any(dropped in prompt for prompt in model.judge.prompts)
    assert dropped not in output["answer"]
    state_ids = [r.rule_id for r in graph.get_state(config).values["rules"]]
    assert dropped not in state_ids


@pytest.mark.parametrize("allowed", ["named", "strict"])
def test_state_types_survive_the_checkpoint(
    allowed: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Named, they come back as themselves, unwarned; refused, as fields, still read."""
    serde = (
        checkpoint_serializer()
        if allowed == "named"
        else JsonPlusSerializer(allowed_msgpack_modules=None)
    )
    _model, graph, context, config, rules = reviewing(InMemorySaver(serde=serde))
    dropped = rule_with(rules, "from os import *")["rule_id"]
    with caplog.at_level(logging.WARNING, logger="langgraph"):
        output = graph.invoke(
            Command(resume={"drop": [dropped]}), config, context=context
        )
    assert ids(output["matches"]) == [rule_with(rules, "except:")["rule_id"]]
    assert output["cost"]["judgments"] == 3
    unregistered = [r for r in caplog.records if "unregistered" in r.getMessage()]
    assert unregistered == [] or allowed == "strict"
    stored = graph.get_state(config).values["rules"]
    assert all(
        isinstance(rule, Rule if allowed == "named" else dict) for rule in stored
    )


def test_review_decision_applies_when_the_resume_has_no_context() -> None:
    """A server client resuming a paused thread may send no context at all."""
    model = JudgeAndExtractorFakeChatModel()
    graph = build_query_graph(checkpointer=InMemorySaver())
    config, rules = start_review(graph, QueryContext(judge_model=model, review=True))
    dropped = rule_with(rules, "from os import *")["rule_id"]

    output = graph.invoke(
        Command(resume={"drop": [dropped]}),
        config,
        context=QueryContext(judge_model=model),
    )

    assert ids(output["matches"]) == [rule_with(rules, "except:")["rule_id"]]
    assert output["cost"]["rules"] == 3


def test_review_edited_rules_change_what_matches() -> None:
    _model, graph, context, config, rules = reviewing()
    wildcard = rule_with(rules, "from os import *")
    bare_except = rule_with(rules, "except:")
    new_code = rule_with(rules, "parse_record")
    old_code = rule_with(rules, "read_file")
    # The wildcard rule no longer applies to the query; the naming rule now does.
    edited = [
        {**wildcard, "condition": "The input contains `print(`"},
        bare_except,
        {**new_code, "condition": "The input contains `f()`"},
        old_code,
    ]

    output = graph.invoke(Command(resume={"rules": edited}), config, context=context)

    assert ids(output["matches"]) == [bare_except["rule_id"], new_code["rule_id"]]
    assert graph.get_state(config).values["rules"][0].condition == (
        "The input contains `print(`"
    )


def _asked_again(graph: Any, config: Any, context: QueryContext, bad: object) -> str:
    """Resume with a bad answer; the review must pause again and say what was wrong.

    The problem is in the payload's `problem`, and leads every action's description
    (what Agent Chat UI shows); the actions are the same rules as before.
    """
    before = graph.get_state(config).interrupts[0].value["action_requests"]
    result = graph.invoke(Command(resume=bad), config, context=context)
    (pending,) = result["__interrupt__"]
    problem = pending.value["problem"]
    assert isinstance(problem, str)
    actions = pending.value["action_requests"]
    assert [a["args"] for a in actions] == [a["args"] for a in before]
    for action, first in zip(actions, before, strict=True):
        assert action["description"] == (
            f"Previous answer not applied: {problem}\n\n{first['description']}"
        )
    return problem


def test_review_edited_rules_must_be_valid_rules() -> None:
    model, graph, context, config, _ = reviewing()
    bad = {"rules": [{"rule_id": "R-1", "name": "No condition"}]}
    assert "condition" in _asked_again(graph, config, context, bad)
    assert judge_prompts(model.judge) == []


@pytest.mark.parametrize(
    "bad",
    ["nope", False, 1, ["style-1"], {"approve": False}, {"dorp": ["x"]}],
    ids=["str", "false", "int", "list", "approve-false", "typo"],
)
def test_review_bad_answers_are_asked_again(bad: object) -> None:
    model, graph, context, config, _ = reviewing()
    problem = _asked_again(graph, config, context, bad)
    assert "Unreadable review answer" in problem
    assert query_graph.REVIEW_HELP in problem
    assert judge_prompts(model.judge) == []


def test_review_dropping_an_unknown_rule_is_asked_again() -> None:
    _model, graph, context, config, _ = reviewing()
    problem = _asked_again(graph, config, context, {"drop": ["no-such-rule"]})
    assert "no-such-rule" in problem


def test_review_can_be_resumed_again_after_a_bad_value() -> None:
    _model, graph, context, config, _ = reviewing()
    assert "'nope'" in _asked_again(graph, config, context, "nope")

    output = graph.invoke(Command(resume=True), config, context=context)

    assert len(output["matches"]) == 2


def test_review_drop_of_a_related_rule() -> None:
    _model, graph, context, config, rules = reviewing()
    new_code = rule_with(rules, "parse_record")
    old_code = rule_with(rules, "read_file")
    assert old_code["relations"][0]["other_rule_id"] == new_code["rule_id"]

    output = graph.invoke(
        Command(resume={"drop": [new_code["rule_id"]]}), config, context=context
    )

    assert output["cost"]["rules"] == 3


APPROVE = {"type": "approve"}


def decisions_for(
    rules: Sequence[Mapping[str, Any]], **by_id: dict[str, Any]
) -> dict[str, Any]:
    """LangChain's resume value: the decision given for a rule id, else approve."""
    return {"decisions": [by_id.get(r["rule_id"], APPROVE) for r in rules]}


def edit(rule: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "edit", "edited_action": {"name": "keep_rule", "args": rule}}


def test_review_decisions_approve_every_rule() -> None:
    _model, graph, context, config, rules = reviewing()

    output = graph.invoke(
        Command(resume={"decisions": [APPROVE] * 4}), config, context=context
    )

    expected = [rule_with(rules, "from os import *"), rule_with(rules, "except:")]
    assert ids(output["matches"]) == ids(expected)
    assert output["cost"]["rules"] == output["cost"]["judgments"] == 4
    assert [
        r.model_dump(mode="json") for r in graph.get_state(config).values["rules"]
    ] == rules


def test_review_decisions_edit_changes_what_matches() -> None:
    _model, graph, context, config, rules = reviewing()
    wildcard = rule_with(rules, "from os import *")
    bare_except = rule_with(rules, "except:")
    new_code = rule_with(rules, "parse_record")
    # The wildcard rule no longer applies to the query; the naming rule now does.
    answer = decisions_for(
        rules,
        **{
            wildcard["rule_id"]: edit(
                {**wildcard, "condition": "The input contains `print(`"}
            ),
            new_code["rule_id"]: edit(
                {**new_code, "condition": "The input contains `f()`"}
            ),
        },
    )

    output = graph.invoke(Command(resume=answer), config, context=context)

    assert ids(output["matches"]) == [bare_except["rule_id"], new_code["rule_id"]]
    stored = {r.rule_id: r for r in graph.get_state(config).values["rules"]}
    assert stored[wildcard["rule_id"]].condition == "The input contains `print(`"
    assert len(stored) == 4


def test_review_decisions_reject_drops_the_rule_and_relations_to_it() -> None:
    model, graph, context, config, rules = reviewing()
    wildcard = rule_with(rules, "from os import *")
    new_code = rule_with(rules, "parse_record")
    old_code = rule_with(rules, "read_file")
    assert old_code["relations"][0]["other_rule_id"] == new_code["rule_id"]
    answer = decisions_for(
        rules,
        **{
            wildcard["rule_id"]: {"type": "reject", "message": "too broad"},
            new_code["rule_id"]: {"type": "reject"},
        },
    )

    output = graph.invoke(Command(resume=answer), config, context=context)

    assert ids(output["matches"]) == [rule_with(rules, "except:")["rule_id"]]
    assert output["cost"]["rules"] == output["cost"]["judgments"] == 2
    assert not any(wildcard["rule_id"] in p for p in model.judge.prompts)
    stored = {r.rule_id: r for r in graph.get_state(config).values["rules"]}
    assert set(stored) == {rule_with(rules, "except:")["rule_id"], old_code["rule_id"]}
    assert stored[old_code["rule_id"]].relations == ()


def test_review_wrong_decision_count_is_asked_again_then_applied() -> None:
    model, graph, context, config, rules = reviewing()

    problem = _asked_again(graph, config, context, {"decisions": [APPROVE] * 3})

    assert "Expected 4 decisions" in problem
    assert "got 3" in problem
    assert judge_prompts(model.judge) == []
    dropped = rule_with(rules, "from os import *")["rule_id"]
    answer = decisions_for(rules, **{dropped: {"type": "reject"}})
    output = graph.invoke(Command(resume=answer), config, context=context)
    assert ids(output["matches"]) == [rule_with(rules, "except:")["rule_id"]]
    assert output["cost"]["rules"] == 3


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (
            {"decisions": [{"type": "accept"}] * 4},
            "decisions[0] (for action 'keep_rule') has unknown type 'accept'",
        ),
        (
            {"decisions": [{"type": "respond", "message": "ok"}] * 4},
            "'respond' is not allowed",
        ),
        (
            {"decisions": [edit({"rule_id": "R-1", "name": "No condition"})] * 4},
            "decisions[0]: the edited args are not a valid rule",
        ),
        (
            {
                "decisions": [
                    {
                        "type": "edit",
                        "edited_action": {"name": "drop_rule", "args": {}},
                    }
                ]
                * 4
            },
            "not rename the action 'keep_rule'",
        ),
        (
            {"decisions": [APPROVE] * 4, "drop": ["x"]},
            "not with ['drop'] as well",
        ),
    ],
    ids=["unknown-type", "respond", "invalid-rule", "renamed", "mixed"],
)
def test_review_bad_decisions_are_asked_again(bad: object, says: str) -> None:
    model, graph, context, config, _ = reviewing()
    assert says in _asked_again(graph, config, context, bad)
    assert judge_prompts(model.judge) == []


def test_review_edit_reads_lists_and_objects_sent_as_json_text() -> None:
    """Agent Chat UI sends each edited arg as the text of its box."""
    _model, graph, context, config, rules = reviewing()
    old_code = rule_with(rules, "read_file")
    as_text = {
        **old_code,
        "tags": '["naming", "legacy"]',
        "relations": json.dumps(old_code["relations"]),
        "metadata": '{"owner": "style"}',
        "name": "[1, 2]",  # a text field stays text, even when it reads as JSON
    }

    graph.invoke(
        Command(resume=decisions_for(rules, **{old_code["rule_id"]: edit(as_text)})),
        config,
        context=context,
    )

    stored = {r.rule_id: r for r in graph.get_state(config).values["rules"]}
    edited = stored[old_code["rule_id"]]
    assert edited.tags == ("naming", "legacy")
    assert edited.metadata == {"owner": "style"}
    assert edited.name == "[1, 2]"
    assert [r.model_dump(mode="json") for r in edited.relations] == old_code[
        "relations"
    ]


def test_apply_review_an_edit_may_take_a_rejected_rules_id() -> None:
    """Relations to a rejected id survive when an edited rule takes that id."""
    rules = [
        Rule(rule_id="a", name="A", condition="c", action="x").model_dump(mode="json"),
        Rule(
            rule_id="b",
            name="B",
            condition="c",
            action="y",
            relations=({"relationship": "overlap", "other_rule_id": "a"},),
        ).model_dump(mode="json"),
        Rule(rule_id="c", name="C", condition="c", action="z").model_dump(mode="json"),
    ]
    answer = {
        "decisions": [
            {"type": "reject"},
            APPROVE,
            edit({**rules[2], "rule_id": "a"}),
        ]
    }
    reviewed = query_graph.apply_review(rules, answer)
    assert [r["rule_id"] for r in reviewed] == ["b", "a"]
    assert reviewed[0]["relations"][0]["other_rule_id"] == "a"


def test_review_applies_to_extracted_rules_only(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    """`review` is documented as "after extraction": a given rulebook is not paused."""
    graph = build_query_graph(checkpointer=InMemorySaver())
    output = graph.invoke(
        {"query": QUERY, "rulebook": pep8_json},
        thread(),
        context=QueryContext(judge_model=judge, review=True),
    )
    assert "__interrupt__" not in output
    assert ids(output["matches"]) == MATCHED


async def test_a_review_without_a_checkpointer_is_refused_before_extraction() -> None:
    """Without one the pause could never be resumed: refused before paying for it."""
    model = JudgeAndExtractorFakeChatModel()
    graph = build_query_graph()
    inputs: QueryInput = {"query": DOCS_QUERY, "documents": style_guide()}
    context = QueryContext(judge_model=model, review=True)
    with pytest.raises(ReviewNeedsCheckpointerError, match="needs a checkpointer"):
        graph.invoke(inputs, context=context)
    with pytest.raises(ReviewNeedsCheckpointerError, match="InMemorySaver"):
        await graph.ainvoke(inputs, context=context)
    assert model.extractor.calls == 0
    assert model.judge.prompts == []


def test_a_review_of_a_given_rulebook_needs_no_checkpointer(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    """Nothing is extracted, so nothing pauses: the run is not refused."""
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(judge_model=judge, review=True),
    )
    assert ids(output["matches"]) == MATCHED


def test_a_review_pauses_with_the_checkpointer_a_server_gives() -> None:
    """The review pauses on a LangGraph server (Studio, `langgraph dev`).

    langgraph_api loads `graphs/query.py:graph` (a factory returning the graph
    compiled without a checkpointer) and runs a copy with its own (`get_graph`),
    as here.
    """
    from graphs.query import compiled as served  # noqa: PLC0415 - the Studio entry

    model = JudgeAndExtractorFakeChatModel()
    assert served.checkpointer is None
    graph = served.copy(update={"checkpointer": InMemorySaver()})
    config, rules = start_review(graph, QueryContext(judge_model=model, review=True))
    assert len(rules) == 4
    assert graph.get_state(config).next == ("review",)


def test_a_review_in_a_subgraph_pauses_with_the_parents_checkpointer() -> None:
    model = JudgeAndExtractorFakeChatModel()
    parent = (
        StateGraph(query_graph.QueryState, context_schema=QueryContext)
        .add_node("tag", build_query_graph())
        .add_edge(START, "tag")
        .compile(checkpointer=InMemorySaver())
    )
    config, rules = start_review(parent, QueryContext(judge_model=model, review=True))
    assert len(rules) == 4
    assert parent.get_state(config, subgraphs=True).tasks[0].name == "tag"


# --- context --------------------------------------------------------------------------


def test_context_as_a_plain_dict(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    """A LangGraph server passes the context as the JSON the client sent."""
    context: Any = {"judge_model": judge, "k": 1, "review": False}
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json}, context=context
    )
    assert ids(output["matches"]) == MATCHED[:1]
    assert output["cost"]["applicable"] == len(MATCHED)


def test_unknown_context_keys_in_process(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    """Unknown keys: ignored by `coerce_context`, refused by LangGraph in process.

    LangGraph turns a dict context into the dataclass itself (`QueryContext(**ctx)`)
    before any node runs, so `coerce_context`'s Mapping branch is never reached in a
    graph run. A LangGraph server drops unknown keys before that (see the
    integration test); a Python caller passing one gets LangGraph's TypeError.
    """
    assert coerce_context({"k": 1, "from_a_newer_client": True}, QueryContext) == (
        QueryContext(k=1)
    )
    context: Any = {"judge_model": judge, "k": 1, "from_a_newer_client": True}
    with pytest.raises(TypeError, match="from_a_newer_client"):
        build_query_graph().invoke(
            {"query": QUERY, "rulebook": pep8_json}, context=context
        )


def test_context_dict_names_template_and_profile(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    context: Any = {"judge_model": judge, "profile": "nba", "template": "generic"}
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json}, context=context
    )
    assert ids(output["matches"]) == MATCHED
    # The nba profile asks for {"applicable": ..., "reason": ...}.
    assert all(
        m["reason"] == "the input shows the condition" for m in output["matches"]
    )


@pytest.fixture
def no_environment_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    query_graph._environment_model.cache_clear()
    yield
    query_graph._environment_model.cache_clear()


@pytest.mark.usefixtures("no_environment_model")
def test_no_model_and_no_environment_is_a_clear_error(
    pep8_json: dict[str, Any],
) -> None:
    with pytest.raises(ModelNotConfiguredError, match="No chat model is configured"):
        build_query_graph().invoke({"query": QUERY, "rulebook": pep8_json})


# --- k and score_threshold ------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "expected"), [(None, MATCHED), (1, MATCHED[:1]), (0, [])]
)
def test_k_limits_the_executed_rules(
    k: int | None,
    expected: list[str],
    pep8_json: dict[str, Any],
    judge: RuleAwareFakeChatModel,
) -> None:
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(judge_model=judge, k=k),
    )
    assert ids(output["matches"]) == expected
    assert output["cost"]["applicable"] == len(MATCHED)  # every rule still judged
    guidance = output["answer"].split("<guidance>")[1]
    for rule_id in MATCHED:
        assert (rule_id in guidance) == (rule_id in expected)
    if not expected:
        assert prompts.NO_GUIDANCE in guidance


def scored(rule_id: str, score: float | None, *, applies: bool = True) -> Verdict:
    return Verdict(rule_id=rule_id, applies=applies, score=score)


def test_select_orders_by_score_then_cuts_by_threshold_and_k() -> None:
    order = [f"R-{n}" for n in range(1, 6)]
    verdicts = [
        scored("R-1", 0.6),
        scored("R-2", 0.95),
        scored("R-3", None),  # no score counts as 1.0
        scored("R-4", 0.99, applies=False),
        scored("R-5", 0.95),
        scored("R-9", 1.0),  # not in the rulebook
    ]

    def chosen(k: int | None, threshold: float | None) -> list[str]:
        selected = select_applicable(verdicts, order, k=k, threshold=threshold)
        return [v.rule_id for v in selected]

    assert chosen(None, None) == ["R-3", "R-2", "R-5", "R-1"]
    assert chosen(None, 0.9) == ["R-3", "R-2", "R-5"]
    assert chosen(2, 0.9) == ["R-3", "R-2"]
    assert chosen(None, 0.96) == ["R-3"]
    assert chosen(0, None) == []


@pytest.mark.parametrize(
    ("k", "threshold", "expected"),
    [
        (None, None, ["PEP8-NONE-IDENTITY", "PEP8-IMPORT-WILDCARD"]),  # by score
        (1, None, ["PEP8-NONE-IDENTITY"]),
        (None, 0.9, ["PEP8-NONE-IDENTITY"]),
        (None, 0.5, ["PEP8-NONE-IDENTITY", "PEP8-IMPORT-WILDCARD"]),
        (None, 0.999, []),
    ],
)
def test_logprob_scores_order_and_cut_the_matches(
    k: int | None,
    threshold: float | None,
    expected: list[str],
    pep8_json: dict[str, Any],
) -> None:
    judge = RuleAwareFakeChatModel(
        confidence=0.99, confidence_by_rule={"PEP8-IMPORT-WILDCARD": 0.55}
    )
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(
            judge_model=judge, logprobs=True, k=k, score_threshold=threshold
        ),
    )
    assert ids(output["matches"]) == expected
    scores = {m["rule_id"]: m["score"] for m in output["matches"]}
    for rule_id, score in scores.items():
        assert score == pytest.approx(
            0.55 if rule_id == "PEP8-IMPORT-WILDCARD" else 0.99
        )
    assert output["cost"]["applicable"] == len(MATCHED)


def test_without_logprobs_matches_carry_no_score(pep8_json: dict[str, Any]) -> None:
    """A judge model that returns logprobs is not scored unless the context asks."""
    judge = RuleAwareFakeChatModel(
        logprobs=True, confidence_by_rule={"PEP8-IMPORT-WILDCARD": 0.55}
    )
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(judge_model=judge, score_threshold=0.9),
    )
    assert ids(output["matches"]) == MATCHED  # no score counts as 1.0
    assert all(m["score"] is None for m in output["matches"])


def test_a_rationale_lands_in_the_matches(pep8_json: dict[str, Any]) -> None:
    judge = RuleAwareFakeChatModel()
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(judge_model=judge, rationale=True),
    )
    assert ids(output["matches"]) == MATCHED
    assert all(m["reason"] for m in output["matches"])
    assert all('"reason"' in prompt for prompt in judge.prompts[:-1])


def test_logprobs_need_a_model_with_the_option(pep8_json: dict[str, Any]) -> None:
    model = JudgeAndExtractorFakeChatModel()
    context: Any = {"judge_model": model, "logprobs": True}
    with pytest.raises(ValueError, match="logprobs=True needs a model with a"):
        build_query_graph().invoke(
            {"query": QUERY, "rulebook": pep8_json}, context=context
        )
    assert model.judge.calls == 0


# --- templates and profiles -----------------------------------------------------------

CANNED = {
    "generic": ("from os import path\n", "from os import path"),
    "npov": (
        (
            "Applied rules: PEP8-IMPORT-WILDCARD\nReasoning: explicit names.\n"
            "Rewrite: from os import path"
        ),
        {
            "applied_rules": ["PEP8-IMPORT-WILDCARD"],
            "reasoning": "explicit names.",
            "rewrite": "from os import path",
        },
    ),
    "code": (
        "```python\ndef f(x):\n    return x is None\n```",
        "def f(x):\n    return x is None\n",
    ),
    "nba": (
        (
            '{"answer": false, "illegal_operation": null, "problematic_team": null, '
            '"rationale": "all legal"}'
        ),
        {
            "answer": False,
            "illegal_operation": None,
            "problematic_team": None,
            "rationale": "all legal",
        },
    ),
}


@pytest.mark.parametrize("name", sorted(CANNED))
def test_templates_by_name(
    name: str, pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    assert set(CANNED) == set(TEMPLATES)
    answer, parsed = CANNED[name]
    executor = CannedChatModel(answer=answer)
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(judge_model=judge, executor_model=executor, template=name),
    )
    assert output["answer"] == parsed
    (prompt,) = executor.prompts
    assert prompt.startswith(TEMPLATES[name].system_prompt)
    assert other_prompts(judge) == []  # the judge model did not execute


def test_template_and_profile_objects(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    template = GENERIC_TEMPLATE.model_copy(
        update={"name": "mine", "system_prompt": "MY SYSTEM PROMPT"}
    )
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(
            judge_model=judge, profile=constraint_profile("custom"), template=template
        ),
    )
    assert ids(output["matches"]) == MATCHED
    assert "MY SYSTEM PROMPT" in output["answer"]
    assert all('"applicable"' in p for p in judge_prompts(judge))


def test_unknown_template_is_a_clear_error(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    with pytest.raises(ValueError, match=r"Unknown template 'poem'") as error:
        build_query_graph().invoke(
            {"query": QUERY, "rulebook": pep8_json},
            context=QueryContext(judge_model=judge, template="poem"),
        )
    assert str(sorted(TEMPLATES)) in str(error.value)


def test_unknown_profile_is_a_clear_error(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    with pytest.raises(ValueError, match=r"Unknown profile 'legal'") as error:
        build_query_graph().invoke(
            {"query": QUERY, "rulebook": pep8_json},
            context=QueryContext(judge_model=judge, profile="legal"),
        )
    assert str(sorted(PROFILES)) in str(error.value)
    assert judge.calls == 0


# --- retries and the node cache -------------------------------------------------------

TINY_RETRY = CallRetry(max_attempts=4, initial_delay=0.001, max_delay=0.01)


def test_transient_judge_errors_are_retried(pep8_json: dict[str, Any]) -> None:
    judge = RuleAwareFakeChatModel(
        faults={"PEP8-BARE-EXCEPT": [TransientFakeError(), TransientFakeError()]}
    )
    output = build_query_graph(retry=TINY_RETRY).invoke(
        {"query": "try:\n    f()\nexcept:\n    pass\n", "rulebook": pep8_json},
        context=QueryContext(judge_model=judge),
    )
    assert ids(output["matches"]) == ["PEP8-BARE-EXCEPT"]
    bare = [p for p in judge_prompts(judge) if "PEP8-BARE-EXCEPT" in p]
    assert len(bare) == 3


def test_transient_executor_errors_are_retried(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    # Executor prompts have no rule: their fault key is "".
    executor = RuleAwareFakeChatModel(
        faults={"": [TransientFakeError(), TransientFakeError(status_code=503)]}
    )
    output = build_query_graph(retry=TINY_RETRY).invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(judge_model=judge, executor_model=executor),
    )
    assert ids(output["matches"]) == MATCHED
    assert executor.calls == 3
    assert len(judge_prompts(judge)) == 9  # judgments are not repeated


def test_transient_errors_past_max_attempts_are_raised(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    executor = RuleAwareFakeChatModel(faults={"": [TransientFakeError()] * 5})
    with pytest.raises(TransientFakeError):
        build_query_graph(retry=TINY_RETRY).invoke(
            {"query": QUERY, "rulebook": pep8_json},
            context=QueryContext(judge_model=judge, executor_model=executor),
        )
    assert executor.calls == TINY_RETRY.max_attempts


def test_node_cache_skips_judgments_already_made(
    pep8_rulebook: Rulebook, pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    graph = build_query_graph(cache=InMemoryCache())
    context = QueryContext(judge_model=judge)
    inputs: QueryInput = {"query": QUERY, "rulebook": pep8_json}

    first = graph.invoke(inputs, context=context)
    assert len(judge_prompts(judge)) == len(pep8_rulebook)
    second = graph.invoke(inputs, context=context)

    assert len(judge_prompts(judge)) == len(pep8_rulebook)  # no new judgments
    assert len(other_prompts(judge)) == 2  # the executor runs every time
    assert second["matches"] == first["matches"]
    assert second["cost"]["judgments"] == len(pep8_rulebook)

    graph.invoke({"query": OTHER_QUERY, "rulebook": pep8_json}, context=context)
    assert len(judge_prompts(judge)) == 2 * len(pep8_rulebook)  # a new query


CACHING = PromptCaching(min_tokens=64, block_tokens=16)
"""A provider caching short prefixes, so the fake's prompts are cached."""


def test_cost_carries_the_judgments_and_the_executors_tokens(
    pep8_rulebook: Rulebook, pep8_json: dict[str, Any]
) -> None:
    model = RuleAwareFakeChatModel(report_usage=True, prompt_caching=CACHING)
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(judge_model=model),
    )
    judged = output["cost"]["judge_usage"]
    assert judged == output["result"].usage.model_dump()
    assert judged["calls"] == len(pep8_rulebook)
    assert judged["input_tokens"] == sum(
        math.ceil(len(p) / 4) for p in judge_prompts(model)
    )
    # The query comes before the rule: later judgments read the shared prefix.
    assert 0 < judged["cached_input_tokens"] < judged["input_tokens"]
    executed = output["cost"]["executor_usage"]
    [prompt] = other_prompts(model)
    assert (executed["calls"], executed["input_tokens"]) == (
        1,
        math.ceil(len(prompt) / 4),
    )


def test_judgments_replayed_from_the_node_cache_cost_nothing(
    pep8_rulebook: Rulebook, pep8_json: dict[str, Any]
) -> None:
    model = RuleAwareFakeChatModel(report_usage=True)
    graph = build_query_graph(cache=InMemoryCache())
    inputs: QueryInput = {"query": QUERY, "rulebook": pep8_json}
    first = graph.invoke(inputs, context=QueryContext(judge_model=model))
    second = graph.invoke(inputs, context=QueryContext(judge_model=model))
    assert first["cost"]["judge_usage"]["calls"] == len(pep8_rulebook)
    # The replayed tasks carry the first run's usage: not paid again.
    assert second["cost"]["judge_usage"] == TokenUsage().model_dump()
    assert second["result"].usage == TokenUsage()
    assert second["cost"]["executor_usage"]["calls"] == 1


def test_cost_shows_unknown_tokens_when_the_model_reports_none(
    pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    output = build_query_graph().invoke(
        {"query": QUERY, "rulebook": pep8_json},
        context=QueryContext(judge_model=judge),
    )
    assert output["cost"]["judge_usage"]["calls"] == 9
    assert output["cost"]["judge_usage"]["input_tokens"] is None
    assert output["cost"]["executor_usage"]["cached_input_tokens"] is None


def test_node_cache_is_keyed_by_profile(
    pep8_rulebook: Rulebook, pep8_json: dict[str, Any], judge: RuleAwareFakeChatModel
) -> None:
    graph = build_query_graph(cache=InMemoryCache())
    inputs: QueryInput = {"query": QUERY, "rulebook": pep8_json}
    graph.invoke(inputs, context=QueryContext(judge_model=judge))
    graph.invoke(inputs, context=QueryContext(judge_model=judge, profile="nba"))
    assert len(judge_prompts(judge)) == 2 * len(pep8_rulebook)


# --- diagrams -------------------------------------------------------------------------

REGENERATE = (
    "The graph changed; if that is intended, regenerate the committed diagram from "
    "the repository root with:\n"
    '  python -c "from pathlib import Path; from {module} import {builder}; '
    "Path('docs/diagrams/{file}').write_text({builder}().get_graph().draw_mermaid(), "
    "encoding='utf-8')\""
)


@pytest.mark.parametrize(
    ("file", "module", "builder"),
    [
        ("query_graph.mmd", "langchain_tag.query_graph", "build_query_graph"),
        ("extraction_graph.mmd", "langchain_tag.extraction", "build_extraction_graph"),
    ],
)
def test_diagram_snapshots(file: str, module: str, builder: str) -> None:
    builders: dict[str, Callable[[], Any]] = {
        "build_query_graph": build_query_graph,
        "build_extraction_graph": build_extraction_graph,
    }
    build = builders[builder]
    drawn = build().get_graph().draw_mermaid()
    committed = (DIAGRAMS / file).read_text(encoding="utf-8")
    assert drawn == committed, REGENERATE.format(
        module=module, builder=builder, file=file
    )


# --- options and inputs refused with a clear error ----------------------------------


def test_query_context_refuses_a_negative_k() -> None:
    with pytest.raises(ValueError, match="k must be None or an integer >= 0"):
        QueryContext(k=-1)
    with pytest.raises(ValueError, match="score_threshold"):
        QueryContext(score_threshold=2)
    assert QueryContext(k=0, score_threshold=1).k == 0


def test_the_query_graph_names_the_bad_field_of_a_rulebook() -> None:
    # Before: a raw pydantic ValidationError.
    data = trigger_rulebook(2).model_dump(mode="json")
    data["rules"][1]["condition"] = None
    graph = build_query_graph()
    with pytest.raises(
        RulebookError, match=r"rules\[1\]\.condition \(rule_id 'R-001'\)"
    ):
        graph.invoke(
            {"query": "x", "rulebook": data},
            context=QueryContext(judge_model=RuleAwareFakeChatModel()),
        )


# --- the query graph under a server's dict context ----------------------------------


def test_the_graph_refuses_a_bad_k_in_a_dict_context(
    monkeypatch: pytest.MonkeyPatch, pep8_rulebook: Rulebook
) -> None:
    monkeypatch.setattr(query_graph, "_environment_model", RuleAwareFakeChatModel)
    with pytest.raises(ValueError, match="k must be None or an integer >= 0"):
        build_query_graph().invoke(
            {"query": QUERY, "rulebook": pep8_rulebook.model_dump(mode="json")},
            context=cast("QueryContext", {"k": -1}),  # as a server passes it
        )


def test_the_graph_retries_a_given_judge_once_not_twice(
    pep8_rulebook: Rulebook,
) -> None:
    # A judge passed in the context keeps its model but retries by the graph's
    # policy only: no node retry on top of the judge's (4 x 10 attempts before).
    rule_id = pep8_rulebook.rules[0].rule_id
    model = RuleAwareFakeChatModel(faults={rule_id: [TransientFakeError()] * 20})
    given = ApplicabilityJudge(
        llm=model, retry=CallRetry(max_attempts=10, initial_delay=0.0)
    )
    graph = build_query_graph(retry=CallRetry(max_attempts=3, initial_delay=0.0))
    with pytest.raises(JudgmentError, match="after 3 attempt"):
        graph.invoke(
            {"query": QUERY, "rulebook": pep8_rulebook.model_dump(mode="json")},
            context=QueryContext(judge=given),
        )
    attempts = [p for p in model.prompts if f"rule_id: {rule_id}\n" in p]
    assert len(attempts) == 3
    assert given.retry is not None
    assert given.retry.max_attempts == 10  # the caller's judge is not changed
