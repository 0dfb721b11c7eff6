"""The default chat model comes from the environment, or a clear error."""

from __future__ import annotations

import email.utils
from types import SimpleNamespace
from typing import Any, Literal, TypedDict

import httpx2
import openai
import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, SecretStr, ValidationError
from tenacity import Retrying

from langchain_tag.errors import ModelNotConfiguredError
from langchain_tag.models import (
    FLEX_TIMEOUT,
    ONE_ATTEMPT,
    CallRetry,
    StructuredFallback,
    default_chat_model,
    is_capacity_shortage,
    is_rate_limit,
    model_identity,
    model_label,
    without_password,
)
from langchain_tag.models._retry import is_quota_exhausted
from langchain_tag.testing import FakeClock, RuleAwareFakeChatModel, TransientFakeError

ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TAG_MODEL", "TAG_SERVICE_TIER")

# Building a ChatOpenAI probes socket options (and urllib3 probes IPv6) by creating
# sockets it never connects; the blocked attempt is reported as a warning only.
pytestmark = pytest.mark.filterwarnings(
    "ignore:A test tried to use socket.socket:UserWarning"
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def test_nothing_configured_lists_every_option() -> None:
    with pytest.raises(ModelNotConfiguredError) as caught:
        default_chat_model()
    message = str(caught.value)
    assert "pass any LangChain chat model" in message
    assert "OPENAI_API_KEY" in message
    assert "OPENAI_BASE_URL" in message
    assert "TAG_MODEL" in message


def test_api_key_gives_chat_openai_at_temperature_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    model = default_chat_model()
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "gpt-4o-mini"
    assert model.temperature == 0
    assert isinstance(model.openai_api_key, SecretStr)
    assert model.openai_api_key.get_secret_value() == "sk-test"


def test_base_url_alone_serves_a_local_compatible_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")
    monkeypatch.setenv("TAG_MODEL", "smollm2")
    model = default_chat_model()
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "smollm2"
    assert model.openai_api_base == "http://127.0.0.1:8080/v1"


def test_keyword_arguments_override_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    model = default_chat_model(model="gpt-4.1", timeout=5)
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "gpt-4.1"
    assert model.request_timeout == 5


def test_an_unknown_service_tier_or_an_empty_model_is_refused_before_any_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: TAG_SERVICE_TIER=bogus and model="" were sent as they were.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("TAG_SERVICE_TIER", "bogus")
    with pytest.raises(
        ValueError, match=r"\$TAG_SERVICE_TIER='bogus' is not an OpenAI"
    ):
        default_chat_model()
    with pytest.raises(ValueError, match="service_tier='fast'"):
        default_chat_model(service_tier="fast")
    monkeypatch.delenv("TAG_SERVICE_TIER")
    with pytest.raises(ValueError, match="the model name is empty"):
        default_chat_model(model=" ")


def test_the_flex_tier_gets_a_long_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    flex = default_chat_model(service_tier="flex")
    assert isinstance(flex, ChatOpenAI)
    assert flex.service_tier == "flex"
    assert flex.request_timeout == FLEX_TIMEOUT == 900.0  # OpenAI's advice
    given = default_chat_model(service_tier="flex", timeout=60)
    assert isinstance(given, ChatOpenAI)
    assert given.request_timeout == 60
    standard = default_chat_model()
    assert isinstance(standard, ChatOpenAI)
    assert (standard.service_tier, standard.request_timeout) == (None, None)
    # The tier changes the price and the wait, not the answer: one cache key.
    assert model_identity(flex) == model_identity(standard)
    monkeypatch.setenv("TAG_SERVICE_TIER", "flex")
    from_env = default_chat_model()
    assert isinstance(from_env, ChatOpenAI)
    assert (from_env.service_tier, from_env.request_timeout) == ("flex", 900.0)
    chosen = default_chat_model(service_tier="auto")
    assert isinstance(chosen, ChatOpenAI)
    assert (chosen.service_tier, chosen.request_timeout) == ("auto", None)


# --- a rate limit, or a shortage of capacity ------------------------------------------


def _sdk_error(status: int, **body: Any) -> Exception:
    """What the OpenAI SDK raises for an HTTP error response of `status`."""
    client = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    text = body.pop("text", None)
    response = (
        httpx2.Response(status, text=text, request=request)
        if text is not None
        else httpx2.Response(status, json={"error": body}, request=request)
    )
    return client._make_status_error_from_response(response)


RATE_LIMIT = _sdk_error(
    429,
    message="Rate limit reached for gpt-4o-mini on requests per min (RPM).",
    type="requests",
    code="rate_limit_exceeded",
)


@pytest.mark.parametrize(
    "error",
    [
        # OpenAI's flex tier: the code says it (what the SDK keeps of the body).
        _sdk_error(429, message="Resource unavailable", code="resource_unavailable"),
        # A server that gives only the message, or no JSON at all.
        _sdk_error(429, message="429 Resource Unavailable", type=None, code=None),
        _sdk_error(429, text="upstream: resource unavailable, try later"),
        # Groq's flex tier.
        _sdk_error(498, message="Flex capacity exceeded", code="capacity_exceeded"),
        # Any SDK's error, by its message.
        TransientFakeError("Resource Unavailable: flex capacity", 429),
    ],
)
def test_a_shortage_of_capacity_is_told_from_a_rate_limit(error: Exception) -> None:
    assert is_capacity_shortage(error)
    assert not is_rate_limit(error)
    assert CallRetry().is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        RATE_LIMIT,
        _sdk_error(429, message="Too many requests"),
        TransientFakeError("rate limited", 429),
    ],
)
def test_a_rate_limit_is_no_shortage_of_capacity(error: Exception) -> None:
    assert is_rate_limit(error)
    assert not is_capacity_shortage(error)


def test_an_exhausted_quota_is_not_retried() -> None:
    # A 429 that only billing can end: retrying it spends the attempts for nothing.
    quota = _sdk_error(
        429,
        message="You exceeded your current quota, please check your plan.",
        type="insufficient_quota",
        code="insufficient_quota",
    )
    assert is_quota_exhausted(quota)
    assert not CallRetry().is_transient(quota)
    assert not is_quota_exhausted(RATE_LIMIT)
    assert CallRetry().is_transient(RATE_LIMIT)


def test_only_a_refusal_is_a_shortage_of_capacity() -> None:
    # The words alone, on another status, are another error.
    overloaded = _sdk_error(503, message="resource unavailable", code="unavailable")
    assert not is_capacity_shortage(overloaded)
    assert not is_capacity_shortage(ValueError("resource unavailable"))
    assert not is_capacity_shortage(None)


def test_a_shortage_of_capacity_waits_at_least_the_backoff() -> None:
    policy = CallRetry(initial_delay=2.0, jitter=0.0)
    asked = {"retry-after": "5"}
    short = TransientFakeError("resource unavailable", 429, headers=asked)
    assert policy.delay(1, short) == 5.0
    assert policy.delay(3, short) == 8.0  # its own backoff, when longer
    rate_limited = TransientFakeError("rate limited", 429, headers=asked)
    assert policy.delay(3, rate_limited) == 5.0


def _attempts(
    policy: CallRetry | None, error: Exception, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[float]]:
    """Calls the policy makes of a call that always fails with `error`, and waits."""
    clock = FakeClock()
    monkeypatch.setattr(
        "langchain_tag.models._retry.time",
        SimpleNamespace(monotonic=clock.monotonic, time=clock.time),
    )
    calls = []

    def call() -> None:
        calls.append(clock.now)
        raise error

    retrying = (policy or ONE_ATTEMPT).retrying(Retrying).copy(sleep=clock.sleep)
    with pytest.raises(type(error)):
        retrying(call)
    return len(calls), clock.sleeps


PACED = TransientFakeError("rate limited", 429, headers={"retry-after": "2"})
SHORTAGE = TransientFakeError("Resource unavailable", 429)


@pytest.mark.parametrize(
    ("policy", "error", "calls"),
    [
        # The provider's wait: 60 s of it, from the first refusal, then no more.
        (CallRetry(), PACED, 31),
        (CallRetry(rate_limit_wait=10.0), PACED, 6),
        # A budget of 0 turns it off; no retry means none.
        (CallRetry(rate_limit_wait=0.0), PACED, 4),
        (None, PACED, 1),
        # A wait of zero spends no time: it counts as an attempt.
        (CallRetry(), TransientFakeError(headers={"retry-after": "0"}), 4),
        (CallRetry(initial_delay=0.0, max_delay=0.0), PACED, 4),
        # A rate limit without the provider's wait, and other errors: attempts.
        (CallRetry(jitter=0.0), TransientFakeError("rate limited", 429), 4),
        (CallRetry(jitter=0.0), TransientFakeError("overloaded", 503), 4),
        # A shortage of capacity: its own backoff, for `capacity_wait`.
        (CallRetry(jitter=0.0, capacity_wait=20.0), SHORTAGE, 5),
        (CallRetry(capacity_wait=0.0), SHORTAGE, 4),
    ],
)
def test_the_retry_budgets(
    policy: CallRetry | None,
    error: Exception,
    calls: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, _ = _attempts(policy, error, monkeypatch)
    assert made == calls


def test_no_wait_ends_past_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    _, waits = _attempts(CallRetry(rate_limit_wait=11.0), PACED, monkeypatch)
    assert waits == [2.0] * 5  # 10 s; one more would end at 12
    policy = CallRetry(jitter=0.0, capacity_wait=20.0)
    _, waits = _attempts(policy, SHORTAGE, monkeypatch)
    assert waits == [1.0, 2.0, 4.0, 8.0]  # 15 s; one more of 16 would end at 31


@pytest.mark.parametrize("budget", [-1.0, float("nan")])
def test_a_budget_is_seconds(budget: float) -> None:
    with pytest.raises(ValueError, match="rate_limit_wait must be a number of seconds"):
        CallRetry(rate_limit_wait=budget)


class _Count(TypedDict):
    calls: int


def _node_runs(policy: CallRetry, failures: list[Exception]) -> int:
    """Runs of a LangGraph node, retried by `policy`, that fails with `failures`."""
    runs = []

    def node(state: _Count) -> _Count:
        runs.append(1)
        if len(runs) <= len(failures):
            raise failures[len(runs) - 1]
        return {"calls": len(runs)}

    graph = StateGraph(_Count)
    graph.add_node("call", node, retry_policy=policy.as_node_policy())
    graph.add_edge(START, "call")
    graph.add_edge("call", END)
    try:
        graph.compile().invoke({"calls": 0})
    except Exception:  # noqa: BLE001 - counted, whatever it is
        return -len(runs)
    return len(runs)


def test_the_node_policy_turns_the_time_budgets_into_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("langgraph.pregel._retry.time.sleep", lambda _: None)
    policy = CallRetry()
    # LangGraph cannot wait for `Retry-After` nor count time: the 60 s budget is
    # the waits of 1, 2, 4, 8, 16 s that fit in it, 6 attempts; 600 s, 24.
    policies = policy.as_node_policy()
    assert [p.max_attempts for p in policies] == [24, 6, 4]
    assert all(p.initial_interval == 1.0 and not p.jitter for p in policies)
    assert _node_runs(policy, [PACED] * 5) == 6
    assert _node_runs(policy, [PACED] * 6) == -6
    assert _node_runs(policy, [SHORTAGE] * 23) == 24
    overloaded = TransientFakeError("overloaded", 503)
    assert _node_runs(policy, [overloaded] * 3) == 4
    assert _node_runs(policy, [overloaded] * 4) == -4
    assert _node_runs(policy, [ValueError("bad request")]) == -1
    # Without a time budget, the attempts.
    assert [p.max_attempts for p in CallRetry(rate_limit_wait=0).as_node_policy()] == [
        24,
        4,
        4,
    ]


# --- structured output, or the text -------------------------------------------------


class _Answer(BaseModel):
    verdict: Literal["YES", "NO"]


class _SDKParsingFake(FakeListChatModel):
    """Structured output parsed by the 'SDK', which raises on what it cannot parse."""

    def with_structured_output(
        self, schema: Any, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[Any, Any]:
        def parse(message: BaseMessage) -> dict[str, Any]:
            parsed = schema.model_validate_json(message.text)
            return {"raw": message, "parsed": parsed, "parsing_error": None}

        return self | RunnableLambda(parse)


def _fallback(
    *answers: str, mode: Literal["auto", "always", "never"] = "auto"
) -> StructuredFallback:
    return StructuredFallback(_SDKParsingFake(responses=list(answers)), mode, [_Answer])


def test_prose_switches_that_instance_to_text_calls() -> None:
    calls = _fallback("Yes it does.", "YES again", "NO")
    assert calls.invoke([HumanMessage("q")], {}, _Answer).text == "YES again"
    assert calls.ignores_structured_output
    assert calls.structured(_Answer) is None
    assert calls.invoke([HumanMessage("q")], {}, _Answer).text == "NO"  # text
    assert _fallback("x").structured(_Answer) is not None  # not process-wide


async def test_json_off_the_schema_is_handed_back_as_text() -> None:
    calls = _fallback('{"verdict": "YE', '{"verdict": "YES"}')
    output = await calls.ainvoke([HumanMessage("q")], {}, _Answer)
    assert isinstance(output, AIMessage)
    assert output.text == '{"verdict": "YE'  # that answer, for the lenient parser
    assert not calls.ignores_structured_output
    structured = await calls.ainvoke([HumanMessage("q")], {}, _Answer)
    assert structured["parsed"] == _Answer(verdict="YES")


def test_always_means_no_fallback() -> None:
    with pytest.raises(ValidationError):
        _fallback("Yes it does.", mode="always").invoke(
            [HumanMessage("q")], {}, _Answer
        )


# --- Retry-After ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # ms is more precise
        ({"retry-after": "600"}, 30.0),  # cut to max_delay
    ],
)
def test_the_providers_retry_after_sets_the_wait(
    headers: dict[str, str], expected: float
) -> None:
    policy = CallRetry(initial_delay=7.0, jitter=0.0)
    assert (
        policy.delay(1, TransientFakeError("HTTP 429", 429, headers=headers))
        == expected
    )
    assert (
        policy.delay(1, TransientFakeError("HTTP 429", 429, headers={})) == 7.0
    )  # nothing asked: backoff
    assert policy.delay(1, ValueError("no response")) == 7.0


def test_retry_after_as_an_http_date(monkeypatch: pytest.MonkeyPatch) -> None:
    # The date counts from models.py's clock, a fake here: no wall-clock margin.
    now = FakeClock(start=1_700_000_000.0)
    monkeypatch.setattr(
        "langchain_tag.models._retry.time", SimpleNamespace(time=now.time)
    )
    when = email.utils.formatdate(now.time() + 5, usegmt=True)
    assert (
        CallRetry().delay(
            1, TransientFakeError("HTTP 503", 503, headers={"retry-after": when})
        )
        == 5.0
    )


# --- model_identity and its short label ----------------------------------------------


def test_a_model_label_names_the_model_and_its_endpoint_without_the_password() -> None:
    local = ChatOpenAI(
        model="qwen3-8b",
        api_key=SecretStr("k"),
        base_url="http://user:s3cret@gpu-box:8000/v1",
    )
    identity = model_identity(local)
    assert "s3cret" in identity  # the identity keeps the endpoint whole
    assert model_label(identity) == "qwen3-8b @ http://user:***@gpu-box:8000/v1"
    # A model without a name setting or an endpoint: its class.
    fake = model_identity(RuleAwareFakeChatModel())
    assert model_label(fake) == "RuleAwareFakeChatModel"


@pytest.mark.parametrize("logged", ["fake", "gpt-4o-mini", "a:b", "x.Y:[1, 2]"])
def test_a_model_label_leaves_other_names_as_they_are(logged: str) -> None:
    # What a caller logged by hand, not an identity: shown as it is.
    assert model_label(logged) == logged


def test_without_password_keeps_the_rest_of_the_url() -> None:
    assert without_password("postgresql://tag:pw@db:5432/x") == (
        "postgresql://tag:***@db:5432/x"
    )
    assert without_password("http://gpu-box:8000/v1") == "http://gpu-box:8000/v1"
    assert without_password("host=db user=tag password=s3cret dbname=x") == (
        "host=db user=tag password=*** dbname=x"
    )
