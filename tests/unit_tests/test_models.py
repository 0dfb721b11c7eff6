"""The default chat model comes from the environment, or a clear error."""

from __future__ import annotations

import pytest
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from langchain_tag import ModelNotConfiguredError
from langchain_tag.models import default_chat_model

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
