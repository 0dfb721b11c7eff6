"""`notebook_model()`: the real model when configured, else the fake, and says which."""

from __future__ import annotations

import pytest
from langchain_openai import ChatOpenAI

from langchain_tag.testing import (
    OFFLINE_NOTE,
    JudgeAndExtractorFakeChatModel,
    notebook_model,
)

# Building a ChatOpenAI probes socket options by creating sockets it never connects.
pytestmark = pytest.mark.filterwarnings(
    "ignore:A test tried to use socket.socket:UserWarning"
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TAG_MODEL"):
        monkeypatch.delenv(name, raising=False)


def test_offline_gives_the_fake_and_says_so() -> None:
    model = notebook_model()

    assert model.offline
    assert isinstance(model.llm, JudgeAndExtractorFakeChatModel)
    assert model._repr_markdown_() == str(model) == model.note == OFFLINE_NOTE
    # The note's content, written out here rather than read from the constant.
    assert model.note.startswith(
        "**Offline run: the results below come from a fake model, not an LLM.**"
    )
    assert "Neither `OPENAI_API_KEY` nor `OPENAI_BASE_URL` is set" in model.note
    assert "`JudgeAndExtractorFakeChatModel` plays the LLM's roles" in model.note
    assert "nothing about model quality" in model.note
    assert "`TAG_MODEL`" in model.note
    assert model.note.endswith("run again to use a real model.")
    assert repr(model) == "NotebookModel(JudgeAndExtractorFakeChatModel, offline=True)"


def test_base_url_gives_chat_openai_named_in_the_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("TAG_MODEL", "qwen2.5-7b-instruct")

    model = notebook_model()

    assert not model.offline
    assert isinstance(model.llm, ChatOpenAI)
    assert model.llm.openai_api_base == "http://127.0.0.1:9/v1"
    assert model.note.startswith("**Real model:** `qwen2.5-7b-instruct`")
    assert "http://127.0.0.1:9/v1" in model._repr_markdown_()
    assert "fake" not in model.note


def test_api_key_gives_openai_without_showing_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123")

    model = notebook_model()

    assert not model.offline
    assert isinstance(model.llm, ChatOpenAI)
    assert "`gpt-4o-mini` at the OpenAI API" in model.note
    assert "sk-secret-123" not in model.note
    assert "sk-secret-123" not in repr(model)
