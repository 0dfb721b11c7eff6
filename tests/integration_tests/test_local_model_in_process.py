"""SmolLM2-135M in this process (`InProcessModel`): the real weights, no server.

SmolLM2-135M judges poorly, so these tests assert what the model path promises, not
what it answers: constrained answers always parse, logprob scores, token usage,
stops, and that closing the model stops a call; for the decision model, that many
questions on one shared prefix get the probabilities each would get alone.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from langchain_tag import Rulebook, TAGRetriever
from langchain_tag.errors import LocalModelStoppedError
from langchain_tag.local_model import (
    JSON_RESPONSE_FORMAT,
    InProcessModel,
    _decisions,
    _transformers,
)
from langchain_tag.local_model._decisions import Asked
from langchain_tag.local_model._smollm2 import VERDICT_RESPONSE_FORMAT
from langchain_tag.models import with_settings
from langchain_tag.testing import trigger_rulebook
from langchain_tag.usage import UsageCounter
from tests.integration_tests.servers import LOCAL_MODEL_PACKAGES, skip_unless_installed
from tests.unit_tests.conftest import HANG_GUARD

skip_unless_installed(LOCAL_MODEL_PACKAGES)

SNIPPET = "from os import *\n\nif x == None:\n    pass\n"
VERDICTS = {'{"verdict": "yes"}', '{"verdict": "no"}'}


def closed_mid_call(
    model: InProcessModel, started: threading.Event, call: Callable[[], object]
) -> LocalModelStoppedError:
    """Run `call` in a thread and close `model` once `started` is set: its error."""
    failures: list[LocalModelStoppedError] = []

    def run() -> None:
        try:
            call()
        except LocalModelStoppedError as error:
            failures.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(HANG_GUARD)
    model.close()
    worker.join(HANG_GUARD)
    assert not worker.is_alive()
    assert len(failures) == 1
    return failures[0]


@pytest.fixture(scope="module")
def model() -> Iterator[InProcessModel]:
    loaded = InProcessModel().load()
    yield loaded
    loaded.close()


def test_the_judge_gets_a_constrained_verdict_and_a_score(
    model: InProcessModel, pep8_rulebook: Rulebook
) -> None:
    judge = model.judge(cache=None)
    counter = UsageCounter()
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
    assert (counter.usage.input_tokens or 0) > 100 * len(rules)  # the judge's prompts
    assert counter.usage.output_tokens == 7 * len(
        rules
    )  # {"verdict": "yes"} is 7 tokens


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
    error = closed_mid_call(
        closing,
        generating,
        lambda: closing.generate(
            [{"role": "user", "content": "Tell a long story."}], max_tokens=500
        ),
    )
    assert "closed while answering" in str(error)
    assert tokens < 500
    with pytest.raises(LocalModelStoppedError, match="was closed"):
        closing.chat_model().invoke("Hello")


# --- the decision model: every question on one shared prefix ------------------------

CODE = (
    "import os, sys\nfrom collections import *\n\n\ndef load(path):\n"
    "    try:\n        return open(path).read()\n    except:\n        return None\n"
)
MEANINGS = "Yes means: a line of the code shows it.\nNo means: none does.\n\n"
ASKED = [
    Asked(
        criteria=MEANINGS if i % 3 else "",  # shared by most, none for some
        question=f"Question:\nDoes the code {what}?"
        + " Consider every line of it." * (i % 5),
    )
    for i, what in enumerate(
        [
            "import several modules on one line",
            "use a wildcard import",
            "use a bare except",
            "define a class",
            "open a file",
            "use a lambda",
            "compare with None using ==",
            "define a function",
        ]
        * 3
    )
]


def test_24_questions_in_one_request_agree_with_one_by_one(
    model: InProcessModel,
) -> None:
    together, tokens = model.decide(CODE, ASKED)
    alone = [model.decide(CODE, [question])[0][0] for question in ASKED]
    assert max(abs(a - b) for a, b in zip(together, alone, strict=True)) <= 1e-4
    assert all(0.0 <= p <= 1.0 for p in together)
    # The prefix (instructions and code) once, then each question's tokens.
    assert tokens < sum(model.decide(CODE, [q])[1] for q in ASKED[:2]) * 12


def test_a_decision_over_the_context_is_refused_before_any_pass(
    model: InProcessModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = InProcessModel(model.model_path, n_ctx=64)
    small._loaded = model._loaded

    passes: list[object] = []

    monkeypatch.setattr(
        _transformers, "score_questions", lambda *a, **k: passes.append(a)
    )
    with pytest.raises(ValueError, match="more than the local model's context of 64"):
        small.decide(CODE, ASKED[:2])
    assert not passes


def test_closing_stops_a_decision_in_flight(model: InProcessModel) -> None:
    closing = InProcessModel(model.model_path)
    closing._loaded = model._loaded
    check = closing._raise_if_stopped_answering
    answering = threading.Event()
    layers = 0

    def watched() -> None:
        nonlocal layers
        layers += 1
        answering.set()
        check()

    closing._raise_if_stopped_answering = watched  # type: ignore[method-assign]
    error = closed_mid_call(closing, answering, lambda: closing.decide(CODE, ASKED * 4))
    assert "closed while answering" in str(error)
    # SmolLM2 has 30 layers: the prefix's pass and 96 questions' would run hundreds.
    assert layers < 200


def test_two_threads_take_turns_and_get_their_own_answers(
    model: InProcessModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    score = _decisions.score_questions
    running, most = 0, 0
    lock = threading.Lock()

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            return score(*args, **kwargs)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(_transformers, "score_questions", counted)
    states = [CODE, "x = [1, 2, 3]\nprint(x)\n"]
    answers: dict[int, list[float]] = {}

    def ask(index: int) -> None:
        answers[index] = model.decide(states[index], ASKED[:6])[0]

    workers = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(HANG_GUARD)
    assert most == 1
    for index, state in enumerate(states):
        assert answers[index] == pytest.approx(
            model.decide(state, ASKED[:6])[0], abs=1e-5
        )


def test_a_retriever_judges_24_rules_in_one_decision_request(
    model: InProcessModel,
) -> None:
    rulebook = trigger_rulebook(24)
    retriever = TAGRetriever(rulebook=rulebook, llm=model.decision_model(), cache=None)
    result = retriever.match("trigger-003 and trigger-017 appear here")
    assert [v.rule_id for v in result.verdicts] == [r.rule_id for r in rulebook.rules]
    assert not result.failed_rule_ids
    assert all(v.score is not None and 0.0 <= v.score <= 1.0 for v in result.verdicts)
    assert result.usage is not None
    assert result.usage.calls == 1  # 24 judgments, one request
    assert result.usage.input_tokens
    assert result.usage.output_tokens == 0
