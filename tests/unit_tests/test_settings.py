"""`MatchSettings`: one declaration of the engine's options, read by every face."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from langchain_tag import TAGRetriever
from langchain_tag.bulk import BulkInput, BulkJob
from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.engine import MatchOptions
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.matching.decision import DecisionJudge
from langchain_tag.middleware import TAGMiddleware
from langchain_tag.query_graph import QueryContext, build_query_graph
from langchain_tag.settings import MatchSettings, build_judge
from langchain_tag.testing import (
    RuleAwareFakeChatModel,
    ToolLoopFakeChatModel,
    trigger_rulebook,
)
from langchain_tag.testing.decisions import RuleAwareFakeDecisionModel
from langchain_tag.testing.stores import CountingStore

RULES = trigger_rulebook(30)
TEXT = "trigger-004 and trigger-017 are here"
MATCHED = ["R-004", "R-017"]


# --- options are declared once and refused when unknown ------------------------------


def test_an_unknown_option_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="did you mean 'max_concurrency'") as raised:
        MatchSettings(max_concurency=2)  # type: ignore[call-arg]
    assert "Known options: cache, decision_threshold" in str(raised.value)
    with pytest.raises(ValueError, match="did you mean 'max_concurrency'"):
        TAGRetriever(
            rulebook=RULES,
            llm=RuleAwareFakeChatModel(),
            max_concurency=2,  # type: ignore[call-arg]
        )


def test_the_retriever_uses_the_cache_it_is_given() -> None:
    cache = CountingStore(InMemoryVerdictCache())
    retriever = TAGRetriever(rulebook=RULES, llm=RuleAwareFakeChatModel(), cache=cache)
    assert retriever.judge.memory is not None
    assert retriever.judge.memory.cache is cache
    retriever.invoke(TEXT)
    assert len(list(cache.yield_keys())) == len(RULES.rules)


def test_a_ready_judge_keeps_its_own_options() -> None:
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel())
    with pytest.raises(ValueError, match="cache build the judge from llm="):
        TAGRetriever(rulebook=RULES, judge=judge, cache=None)
    with pytest.raises(ValueError, match="either llm= or judge="):
        MatchSettings(judge=judge, llm=RuleAwareFakeChatModel())


def test_the_model_decides_the_backend() -> None:
    decision = build_judge(RuleAwareFakeDecisionModel(), questions_per_request=32)
    assert isinstance(decision, DecisionJudge)
    assert decision.questions_per_request == 32
    chat = build_judge(RuleAwareFakeChatModel(), rules_per_call=5)
    assert isinstance(chat, ApplicabilityJudge)
    assert chat.rules_per_call == 5
    with pytest.raises(ValueError, match="rules_per_call, logprobs apply to chat"):
        build_judge(RuleAwareFakeDecisionModel(), rules_per_call=5, logprobs=True)


# urllib3 opens (and closes) a socket when first imported, to probe IPv6: no traffic.
@pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")
def test_a_model_string_is_initialised_as_langchain_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    judge = MatchSettings(llm="openai:gpt-5-mini").build_judge()
    assert isinstance(judge, ApplicabilityJudge)
    assert isinstance(judge.llm, ChatOpenAI)
    assert judge.llm.model_name == "gpt-5-mini"


def test_the_environment_names_a_decision_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAG_DECISION_MODEL", "gpt-6-luna")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    judge = MatchSettings().build_judge()
    assert isinstance(judge, DecisionJudge)
    assert judge.model.model == "gpt-6-luna"


# --- a fully cached query: one lookup, no model call, through every face --------------


def _fakes() -> tuple[RuleAwareFakeDecisionModel, CountingStore]:
    return RuleAwareFakeDecisionModel(), CountingStore(InMemoryVerdictCache())


def test_a_cached_query_through_the_query_graph() -> None:
    model, cache = _fakes()
    judge = DecisionJudge(model=model, cache=cache)
    context = QueryContext(judge=judge, executor_model=RuleAwareFakeChatModel())
    graph = build_query_graph()
    data = RULES.model_dump(mode="json")
    first = graph.invoke({"query": TEXT, "rulebook": data}, context=context)
    assert [m["rule_id"] for m in first["matches"]] == MATCHED
    assert model.calls == 1
    cache.calls.clear()
    again = graph.invoke({"query": TEXT, "rulebook": data}, context=context)
    assert [m["rule_id"] for m in again["matches"]] == MATCHED
    assert again["cost"]["cached"] == len(RULES.rules)
    assert cache.calls["mget"] == 1
    assert model.calls == 1


def test_a_decision_model_as_the_graph_s_judge_model() -> None:
    model = RuleAwareFakeDecisionModel()
    context = QueryContext(
        judge_model=model,
        executor_model=RuleAwareFakeChatModel(),
        questions_per_request=8,
    )
    output = build_query_graph().invoke(
        {"query": TEXT, "rulebook": RULES.model_dump(mode="json")}, context=context
    )
    assert [m["rule_id"] for m in output["matches"]] == MATCHED
    assert [m["score"] for m in output["matches"]] == [0.93, 0.93]
    assert model.calls == 4  # 30 rules, 8 a request


@tool
def lookup(query: str) -> str:
    """Look the query up."""
    return f"found {len(query)} characters"


def test_a_cached_query_through_the_middleware() -> None:
    model, cache = _fakes()
    middleware = TAGMiddleware(rulebook=RULES, llm=model, cache=cache)
    agent_model = ToolLoopFakeChatModel(tool_rounds=2)
    agent = create_agent(agent_model, tools=[lookup], middleware=[middleware])
    for turn in range(2):
        cache.calls.clear()
        state = agent.invoke({"messages": [HumanMessage(TEXT)]})
        assert [m["rule_id"] for m in state["tag"]["matched"]] == MATCHED
        assert cache.calls["mget"] == 1
        # One request for the invocation's three model calls; then the cache.
        assert model.calls == 1, f"turn {turn}: judged once, then from the cache"
    assert all("Do thing 4" in (p or "") for p in agent_model.system_prompts)


def test_a_cached_bulk_run(tmp_path: Path) -> None:
    model, cache = _fakes()
    engine = MatchSettings(llm=model, cache=cache).build_engine()
    job = BulkJob(engine, RULES.rules, None, MatchOptions())
    inputs = [BulkInput(id="a", input=TEXT)]
    job.run(inputs, tmp_path / "one.jsonl")
    assert model.calls == 1
    cache.calls.clear()
    job.run(inputs, tmp_path / "two.jsonl")
    assert cache.calls["mget"] == 1
    assert model.calls == 1


def test_a_cached_query_through_the_retriever_in_async(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, cache = _fakes()
    retriever = TAGRetriever(rulebook=RULES, llm=model, cache=cache)
    asyncio.run(retriever.ainvoke(TEXT))
    cache.calls.clear()
    docs: Any = asyncio.run(retriever.ainvoke(TEXT))
    assert [d.id for d in docs] == MATCHED
    assert cache.calls["mget"] == 1
    assert model.calls == 1
