"""Token usage: summed from what models report, cached tokens included, and priced."""

from __future__ import annotations

from typing import Any, cast

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManager
from langchain_core.decisions import ClassifierResponse, Noul, NoulCriteria
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables.config import ContextThreadPoolExecutor
from pydantic import ValidationError

from langchain_tag.testing import RuleAwareFakeChatModel
from langchain_tag.usage import (
    MESSAGE_OVERHEAD,
    REPLY_OVERHEAD,
    PromptCaching,
    SimulatedPromptCache,
    TokenCounter,
    TokenPrices,
    TokenUsage,
    UsageCounter,
    active_counter,
    count_call,
    format_usd,
    sent_instructions,
)

UNKNOWN = {"input_tokens": None, "cached_input_tokens": None, "output_tokens": None}


def report(
    input_tokens: int, output_tokens: int, cache_read: int | None = None
) -> UsageMetadata:
    """A usage report as LangChain's provider integrations write it."""
    usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    if cache_read is not None:
        usage["input_token_details"] = {"cache_read": cache_read}
    return cast("UsageMetadata", usage)


def answered(usage: UsageMetadata | None, model: str = "gpt-x") -> LLMResult:
    message = AIMessage(
        "ok", usage_metadata=usage, response_metadata={"model_name": model}
    )
    return LLMResult(generations=[[ChatGeneration(message=message)]])


# --- TokenUsage -----------------------------------------------------------------------


def test_usage_reads_the_cached_tokens_of_each_report() -> None:
    usage = TokenUsage.from_metadata(
        [report(1500, 3, cache_read=1280), report(900, 2), None], calls=3
    )
    assert usage == TokenUsage(
        calls=3, input_tokens=2400, cached_input_tokens=1280, output_tokens=5
    )


def test_calls_without_any_report_have_unknown_tokens_not_zero() -> None:
    unknown = TokenUsage.from_metadata([None, None], calls=2)
    assert unknown.model_dump() == {"calls": 2, **UNKNOWN}
    assert not unknown.known
    # No call at all (every verdict from a cache) costs a known nothing.
    assert TokenUsage.from_metadata([], calls=0) == TokenUsage()
    assert TokenUsage().known


def test_sums_add_and_an_unknown_part_makes_the_sum_unknown() -> None:
    first = TokenUsage(
        calls=2, input_tokens=2000, cached_input_tokens=1024, output_tokens=4
    )
    second = TokenUsage(calls=1, input_tokens=900, output_tokens=2)
    assert first + second == TokenUsage(
        calls=3, input_tokens=2900, cached_input_tokens=1024, output_tokens=6
    )
    assert sum([first, second], TokenUsage()) == first + second
    unknown = TokenUsage(calls=1, **UNKNOWN)
    assert (first + unknown).model_dump() == {"calls": 3, **UNKNOWN}
    # Nothing called plus calls of unknown usage: unknown, never a 0.
    assert not (TokenUsage() + unknown).known


def test_tokens_are_known_or_unknown_together() -> None:
    with pytest.raises(ValidationError, match="known together"):
        TokenUsage(calls=1, input_tokens=None, cached_input_tokens=0, output_tokens=3)


# --- UsageCounter ---------------------------------------------------------------------


def test_the_counter_counts_calls_and_the_cached_tokens_reported() -> None:
    counter = UsageCounter()
    counter.on_chat_model_start({}, [[HumanMessage("a")]])
    counter.on_llm_end(answered(report(2048, 3, cache_read=1920)))
    counter.on_chat_model_start({}, [[HumanMessage("b")]])
    counter.on_llm_end(answered(report(100, 2), model="other"))
    assert counter.reported
    assert counter.usage == TokenUsage(
        calls=2, input_tokens=2148, cached_input_tokens=1920, output_tokens=5
    )


def test_counting_reads_the_answers_without_a_callback() -> None:
    counter = UsageCounter()
    chat = AIMessage(
        "ok",
        usage_metadata=report(100, 2, cache_read=64),
        response_metadata={"model_name": "gpt-x"},
    )
    decision = ClassifierResponse(model="luna", answers={}, usage=report(40, 0))
    with counter.counting():
        for answer in (chat, {"raw": chat, "parsed": None}, decision, "no usage"):
            active = active_counter()
            assert active is counter
            active.add_call()
            active.add_answer(answer)
        count_call()  # a call asked again within one counted call
    count_call()  # outside: counted by no one
    assert active_counter() is None
    assert counter.usage == TokenUsage(
        calls=5, input_tokens=240, cached_input_tokens=128, output_tokens=4
    )


def test_counting_reaches_worker_threads_started_inside() -> None:
    counter = UsageCounter()
    with counter.counting(), ContextThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda _: count_call(), range(4)))
    assert counter.calls == 4


def test_the_counter_says_unknown_when_the_model_reports_nothing() -> None:
    counter = UsageCounter()
    RuleAwareFakeChatModel().invoke("hello", counter.watch())
    assert (counter.calls, counter.reported) == (1, False)
    assert counter.usage.model_dump() == {"calls": 1, **UNKNOWN}


class Seen(BaseCallbackHandler):
    def __init__(self) -> None:
        self.starts = 0

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self.starts += 1


@pytest.mark.parametrize("form", ["list", "manager"])
def test_watch_keeps_the_callbacks_already_given(form: str) -> None:
    seen = Seen()
    callbacks: Any = [seen] if form == "list" else CallbackManager([seen])
    counter = UsageCounter()
    model = RuleAwareFakeChatModel(report_usage=True)
    model.invoke("hello", counter.watch({"callbacks": callbacks, "tags": ["mine"]}))
    assert (seen.starts, counter.calls) == (1, 1)
    assert counter.usage.input_tokens == 2  # "hello": 5 characters, 4 a token


def test_a_fake_reports_the_prefix_a_provider_would_cache() -> None:
    model = RuleAwareFakeChatModel(
        report_usage=True, prompt_caching=PromptCaching(min_tokens=8, block_tokens=4)
    )
    shared = "x" * 40  # 10 tokens: cached as 8, two 4-token blocks
    counter = UsageCounter()
    for tail in ("first question", "second question"):
        model.invoke(shared + tail, counter.watch())
    assert counter.usage.cached_input_tokens == 8
    assert counter.usage.input_tokens == 14 + 14  # ceil(54 / 4), ceil(55 / 4)


# --- TokenPrices ----------------------------------------------------------------------

USAGE = TokenUsage(
    calls=10, input_tokens=3_000_000, cached_input_tokens=2_000_000, output_tokens=10**6
)


def test_cached_input_is_priced_at_its_own_price() -> None:
    prices = TokenPrices(input=2.0, cached_input=0.5, output=8.0)
    # 1M fresh at $2, 2M cached at $0.50, 1M out at $8.
    assert prices.cost(USAGE) == pytest.approx(2.0 + 1.0 + 8.0)
    # Without a cached price, cached tokens cost as much as any input.
    assert TokenPrices(input=2.0, output=8.0).cost(USAGE) == pytest.approx(14.0)


def test_batch_prices_take_the_discount_off_every_price() -> None:
    prices = TokenPrices(input=2.0, cached_input=0.5, output=8.0)
    assert prices.cost(USAGE, batch=True) == pytest.approx(11.0 / 2)
    quarter = TokenPrices(input=2.0, cached_input=0.5, output=8.0, batch_discount=0.25)
    assert quarter.cost(USAGE, batch=True) == pytest.approx(11.0 * 0.75)


def test_unknown_usage_has_no_price_and_no_calls_cost_nothing() -> None:
    prices = TokenPrices(input=2.0, output=8.0)
    assert prices.cost(TokenUsage(calls=3, **UNKNOWN)) is None
    assert prices.cost(TokenUsage()) == 0.0


@pytest.mark.parametrize(
    "fields",
    [
        {"input": -1.0, "output": 1.0},
        {"input": 1.0, "output": 1.0, "cached_input": -0.1},
        {"input": 1.0, "output": 1.0, "batch_discount": 1.0},
    ],
)
def test_prices_out_of_range_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        TokenPrices(**fields)


# --- PromptCaching and the simulated cache ------------------------------------------


@pytest.mark.parametrize(
    ("shared", "cached"), [(0, 0), (1023, 0), (1024, 1024), (1151, 1024), (1152, 1152)]
)
def test_openai_caches_from_1024_tokens_in_128_token_steps(
    shared: int, cached: int
) -> None:
    assert PromptCaching().cached_tokens(shared) == cached


def chars(text: str) -> int:
    return len(text)


def test_a_prompt_reads_its_longest_prefix_shared_with_an_earlier_one() -> None:
    cache = SimulatedPromptCache(PromptCaching(min_tokens=4, block_tokens=2), chars)
    assert cache.send("system: judge. input: A. rule 1") == 0  # nothing cached yet
    assert cache.send("system: judge. input: B. rule 1") == 22  # "system: ... input: "
    # The closest earlier prompt wins: "system: judge. input: A. rule ".
    assert cache.send("system: judge. input: A. rule 2") == 30
    assert cache.send("other") == 0
    assert cache.send("sys") == 0  # below min_tokens


def test_prompts_in_flight_cannot_read_each_other() -> None:
    cache = SimulatedPromptCache(
        PromptCaching(min_tokens=4, block_tokens=1), chars, in_flight=2
    )
    assert cache.send("shared prefix, call 1") == 0
    assert cache.send("shared prefix, call 2") == 0  # the first is still in flight
    assert cache.send("shared prefix, call 3") == len("shared prefix, call ")
    with pytest.raises(ValueError, match="in_flight must be at least 1"):
        SimulatedPromptCache(PromptCaching(), chars, in_flight=0)


def test_a_bounded_cache_forgets_its_oldest_prompts() -> None:
    cache = SimulatedPromptCache(
        PromptCaching(min_tokens=4, block_tokens=1), chars, keep=1
    )
    assert cache.send("input A, rule 1") == 0
    assert cache.send("input B, rule 1") == len("input ")
    # "input A, ..." was forgotten when "input B, ..." came: only B's prefix is left.
    assert cache.send("input A, rule 2") == len("input ")
    with pytest.raises(ValueError, match="keep must be at least 1"):
        SimulatedPromptCache(PromptCaching(), chars, keep=0)


def test_a_request_counts_its_tokens_and_what_a_cache_serves() -> None:
    counter = TokenCounter("a token a character", len)
    messages = [SystemMessage("s" * 40), HumanMessage("h" * 20)]
    sent = 40 + 20 + 2 * MESSAGE_OVERHEAD + REPLY_OVERHEAD
    assert counter.request(messages, "YES") == TokenUsage(
        calls=1, input_tokens=sent, cached_input_tokens=0, output_tokens=3
    )
    cache = SimulatedPromptCache(PromptCaching(min_tokens=8, block_tokens=8), len)
    first = counter.request(messages, "YES", cache)
    again = counter.request(messages, "NO", cache)
    assert first.cached_input_tokens == 0
    assert 0 < (again.cached_input_tokens or 0) <= sent
    assert again.output_tokens == 2


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "-"), (0, "$0"), (0.00123, "$0.0012"), (1234.5, "$1,234.50")],
)
def test_dollars_as_the_estimates_print_them(value: float | None, shown: str) -> None:
    assert format_usd(value) == shown


@pytest.mark.parametrize(
    "criteria",
    [
        None,
        NoulCriteria(true="it holds", false="it does not"),
        NoulCriteria(true="it holds"),
    ],
)
def test_decision_instructions_are_counted_as_openai_classifier_sends_them(
    criteria: NoulCriteria | None,
) -> None:
    classifier_input = pytest.importorskip(
        "langchain_openai.decisions._classifier_input",
        reason="langchain-openai with the Decisions API (and tiktoken)",
    )
    question = Noul(instructions="Does the input import *?", criteria=criteria)
    [sent] = classifier_input._to_classifier_questions({"q": question})
    assert sent_instructions(question) == sent["instructions"]
