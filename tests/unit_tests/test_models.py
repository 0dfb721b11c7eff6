"""The default chat model comes from the environment, or a clear error."""

from __future__ import annotations

import email.utils
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, SecretStr, ValidationError

from langchain_tag import ModelNotConfiguredError
from langchain_tag.models import (
    CallRetry,
    StructuredFallback,
    default_chat_model,
    model_identity,
    model_label,
    without_password,
)
from langchain_tag.testing import FakeClock, RuleAwareFakeChatModel, TransientFakeError

ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TAG_MODEL")

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
    monkeypatch.setattr("langchain_tag.models.time", SimpleNamespace(time=now.time))
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
