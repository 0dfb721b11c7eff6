"""SmolLM2-135M in this process (`InProcessModel`): the real weights, no server.

SmolLM2-135M judges poorly, so these tests assert what the model path promises, not
what it answers: constrained answers always parse, logprob scores, token usage,
stops, and that closing the model stops a call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from langchain_tag import Rulebook
from langchain_tag.evaluation.usage import CallCounter
from langchain_tag.local_model import (
    JSON_RESPONSE_FORMAT,
    VERDICT_RESPONSE_FORMAT,
    InProcessModel,
    LocalModelStoppedError,
    _transformers,
)
from langchain_tag.models import with_settings
from tests.integration_tests.servers import LOCAL_MODEL_PACKAGES, skip_unless_installed
from tests.unit_tests.conftest import HANG_GUARD

skip_unless_installed(LOCAL_MODEL_PACKAGES)

SNIPPET = "from os import *\n\nif x == None:\n    pass\n"
VERDICTS = {'{"verdict": "yes"}', '{"verdict": "no"}'}


@pytest.fixture(scope="module")
def model() -> Iterator[InProcessModel]:
    loaded = InProcessModel().load()
    yield loaded
    loaded.close()


def test_the_judge_gets_a_constrained_verdict_and_a_score(
    model: InProcessModel, pep8_rulebook: Rulebook
) -> None:
    judge = model.judge(cache=None)
    counter = CallCounter()
    rules = pep8_rulebook.rules[:3]
    verdicts = judge.judge_rules(
        SNIPPET, rules, {"callbacks": [counter], "max_concurrency": 3}
    )
    assert [v.rule_id for v in verdicts] == [r.rule_id for r in rules]
    for verdict in verdicts:
        assert not verdict.failed, verdict.error
        assert verdict.score is not None
        assert 0.0 <= verdict.score <= 1.0
        # The score and the decision agree: the decision is the likelier token.
        assert verdict.applies is (verdict.score >= 0.5)
    assert counter.calls == len(rules)
    assert counter.input_tokens > 100 * len(rules)  # the judge's prompts
    assert counter.output_tokens == 7 * len(rules)  # {"verdict": "yes"} is 7 tokens


def test_a_verdict_answer_is_exactly_one_of_the_schemas_objects(
    model: InProcessModel,
) -> None:
    llm = model.chat_model(
        response_format=VERDICT_RESPONSE_FORMAT, max_tokens=16, logprobs=True
    )
    answer = llm.invoke("Is the sky green? Answer yes or no.")
    assert answer.content in VERDICTS
    assert answer.response_metadata["finish_reason"] == "stop"
    entries = answer.response_metadata["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == answer.content
    decision = next(e for e in entries if e["token"] in {"yes", "no"})
    assert {a["token"] for a in decision["top_logprobs"]} == {"yes", "no"}


def test_json_mode_starts_an_object_and_stops_where_it_closes(
    model: InProcessModel,
) -> None:
    llm = model.chat_model(response_format=JSON_RESPONSE_FORMAT, max_tokens=60)
    answer = llm.invoke('List two colours as JSON: {"colours": [...]}')
    text = str(answer.content)
    assert text.lstrip().startswith("{")
    if answer.response_metadata["finish_reason"] == "stop":
        assert _transformers._object_closed(text)
        assert not _transformers._object_closed(text[:-1])
    else:  # ran out of tokens inside the object
        assert answer.usage_metadata is not None
        assert answer.usage_metadata["output_tokens"] == 60


def test_free_text_stops_at_max_tokens_or_a_stop_string(model: InProcessModel) -> None:
    llm = model.chat_model(max_tokens=5)
    answer = llm.invoke("Count from one to twenty in words.")
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] <= 5
    stopped = model.chat_model(max_tokens=60).invoke(
        "Count from one to twenty in words, separated by commas.", stop=[","]
    )
    assert "," not in str(stopped.content)


def test_calls_from_async_code_take_turns(
    model: InProcessModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode = _transformers._decode
    running, most = 0, 0

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            return decode(*args, **kwargs)
        finally:
            running -= 1

    monkeypatch.setattr(_transformers, "_decode", counted)
    llm = model.chat_model(max_tokens=3)

    async def both() -> list[str]:
        answers = await asyncio.gather(llm.ainvoke("Hi"), llm.ainvoke("Hello"))
        return [str(a.content) for a in answers]

    assert len(asyncio.run(both())) == 2
    assert most == 1


def test_the_answer_stops_where_the_context_ends(model: InProcessModel) -> None:
    small = InProcessModel(model.model_path, n_ctx=64)
    small._loaded = model._loaded
    llm = small.chat_model(max_tokens=200)
    answer = llm.invoke("Count to a hundred.")
    assert answer.usage_metadata is not None
    usage = answer.usage_metadata
    assert usage["input_tokens"] + usage["output_tokens"] <= 64
    with pytest.raises(ValueError, match="more than the local model's context of 64"):
        llm.invoke("word " * 100)


def test_a_caller_asking_for_more_gets_the_models_limit(
    model: InProcessModel,
) -> None:
    limited, _ = with_settings(model.chat_model(max_tokens=4), max_tokens=4096)
    answer = limited.invoke("Count from one to twenty in words.")
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] <= 4


def test_closing_stops_a_call_at_its_next_token(
    model: InProcessModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    closing = InProcessModel(model.model_path)
    closing._loaded = model._loaded
    decode = _transformers._decode
    generating = threading.Event()
    tokens = 0

    def watched(*args: Any, stopped: Callable[[], bool], **kwargs: Any) -> Any:
        def counting() -> bool:
            nonlocal tokens
            tokens += 1
            generating.set()
            return stopped()

        return decode(*args, stopped=counting, **kwargs)

    monkeypatch.setattr(_transformers, "_decode", watched)
    failures: list[BaseException] = []

    def call() -> None:
        try:
            closing.generate(
                [{"role": "user", "content": "Tell a long story."}], max_tokens=500
            )
        except LocalModelStoppedError as error:
            failures.append(error)

    worker = threading.Thread(target=call)
    worker.start()
    assert generating.wait(HANG_GUARD)
    closing.close()
    worker.join(HANG_GUARD)
    assert not worker.is_alive()
    assert len(failures) == 1
    assert "closed while answering" in str(failures[0])
    assert tokens < 500
    with pytest.raises(LocalModelStoppedError, match="was closed"):
        closing.chat_model().invoke("Hello")
