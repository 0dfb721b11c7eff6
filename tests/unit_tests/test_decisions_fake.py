"""The fake OpenAI Decisions API, driven by the real SDK and OpenAIClassifier."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from langchain_core.decisions import Choice, Noul, NoulCriteria, Score
from langchain_core.exceptions import (
    ModelInvalidRequestError,
    ModelRateLimitError,
    ModelRefusalError,
)
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_openai import ChatOpenAI
from langchain_openai.decisions import OpenAIClassifier
from openai.types.decision import (
    AnswerAnswerResourcePredicate,
    AnswerAnswerResourceRefusal,
    Decision,
)
from openai.types.decision_create_params import QuestionQuestionParamPredicate

from langchain_tag.matching.prompts import render_decision_question
from langchain_tag.testing.decisions import (
    FakeDecisionsServer,
    RuleAwareFakeDecisionModel,
)
from langchain_tag.testing.server import FakeOpenAIServer, Refusal

pytestmark = [
    pytest.mark.usefixtures("loopback"),  # the fake API, on 127.0.0.1
    pytest.mark.filterwarnings("ignore:The class `OpenAIClassifier` is in beta"),
]

LAMBDA = (
    ("rule_id", "R-1"),
    ("name", "No named lambdas"),
    ("condition", "The code assigns a `lambda` to a name"),
)
TABS = (
    ("rule_id", "R-2"),
    ("name", "Spaces, not tabs"),
    ("condition", "The code indents with `tab characters`"),
)
CODE = "square = lambda x: x * x"
CRITERIA = NoulCriteria(
    true="The input meets the rule's condition.", false="It does not."
)
# The SDK waits out only a positive Retry-After; `retry-after: 0` alone would
# leave it backing off by its own schedule (~0.5 s).
AT_ONCE = Refusal(
    headers={"retry-after": "0", "retry-after-ms": "1"}, code="rate_limit_exceeded"
)


def _predicate(
    fields: tuple[tuple[str, str], ...], name: str | None = None
) -> QuestionQuestionParamPredicate:
    return {
        "type": "predicate",
        "name": name or dict(fields)["rule_id"],
        "instructions": render_decision_question(fields),
    }


def _noul(fields: tuple[tuple[str, str], ...]) -> Noul:
    return Noul(instructions=render_decision_question(fields), criteria=CRITERIA)


def _tokens(state: str, *instructions: str) -> int:
    return math.ceil(len(state) / 4) + sum(math.ceil(len(i) / 4) for i in instructions)


def _sent(fields: tuple[tuple[str, str], ...]) -> str:
    """A Noul's instructions as OpenAIClassifier sends them: criteria appended."""
    return (
        f"{render_decision_question(fields)}\n\n"
        "Answer true if: The input meets the rule's condition.\n"
        "Answer false if: It does not."
    )


def _refuse_tabs(state: str, fields: dict[str, str]) -> bool:
    return fields["rule_id"] == "R-2"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx2.Client]:
    """One HTTP client for the module: making one (its TLS setup) costs ~40 ms."""
    with openai.DefaultHttpxClient() as shared:
        yield shared


@pytest.fixture
def server(loopback: None) -> Iterator[FakeDecisionsServer]:
    with FakeDecisionsServer() as fake:
        yield fake


def _sdk(
    server: FakeDecisionsServer, http: httpx2.Client, max_retries: int = 0
) -> openai.OpenAI:
    # Not closed: closing it would close the shared HTTP client.
    return openai.OpenAI(
        base_url=server.base_url,
        api_key="test",
        max_retries=max_retries,
        http_client=http,
    )


@pytest.fixture
def client(server: FakeDecisionsServer, http: httpx2.Client) -> openai.OpenAI:
    return _sdk(server, http)


def _classifier(
    server: FakeDecisionsServer, http: httpx2.Client | None = None, **changes: Any
) -> OpenAIClassifier:
    options: dict[str, Any] = {"max_retries": 0, "http_client": http, **changes}
    return OpenAIClassifier(
        model="gpt-6-luna", base_url=server.base_url, api_key="test", **options
    )


# -- the SDK's client.decisions.create ------------------------------------------------


def test_sdk_gets_typed_answers_in_question_order(
    server: FakeDecisionsServer, client: openai.OpenAI
) -> None:
    questions = [_predicate(TABS), _predicate(LAMBDA)]
    raw = client.decisions.with_raw_response.create(
        model="gpt-6-luna", input=CODE, questions=questions
    )
    decision = raw.parse()
    assert isinstance(decision, Decision)
    assert [type(a) for a in decision.answers] == [AnswerAnswerResourcePredicate] * 2
    assert [(a.name, a.probability) for a in decision.answers] == [  # type: ignore[union-attr]
        ("R-2", 0.04),
        ("R-1", 0.93),
    ]
    assert decision.model == "gpt-6-luna"
    expected = _tokens(
        CODE, render_decision_question(TABS), render_decision_question(LAMBDA)
    )
    assert decision.usage.input_tokens == decision.usage.total_tokens == expected
    assert decision.usage.output_tokens == 0
    assert decision.usage.input_tokens_details.cached_tokens == 0
    assert decision.usage.output_tokens_details.reasoning_tokens == 0
    assert raw.headers["x-request-id"] == "req_fake_1"
    assert server.request_count == 1
    assert server.requests[0]["questions"] == questions
    assert server.model.requests == [(CODE, ["R-2", "R-1"])]


def test_sdk_message_input_is_judged_on_user_text_only(
    client: openai.OpenAI,
) -> None:
    decision = client.decisions.create(
        model="gpt-6-luna",
        input=[
            {"role": "system", "content": "Check for `tab characters` and `lambda`."},
            {"role": "user", "content": [{"type": "input_text", "text": CODE}]},
            {"role": "assistant", "content": "It indents with tab characters."},
        ],
        questions=[_predicate(LAMBDA), _predicate(TABS)],
    )
    assert [a.probability for a in decision.answers] == [0.93, 0.04]  # type: ignore[union-attr]


def test_sdk_parses_a_refusal_in_its_slot(loopback: None, http: httpx2.Client) -> None:
    model = RuleAwareFakeDecisionModel(refuse=_refuse_tabs)
    with FakeDecisionsServer(model) as server:
        decision = _sdk(server, http).decisions.create(
            model="gpt-6-luna",
            input=CODE,
            questions=[_predicate(TABS), _predicate(LAMBDA)],
        )
    refused, answered = decision.answers
    assert isinstance(refused, AnswerAnswerResourceRefusal)
    assert (refused.type, refused.name) == ("refusal", "R-2")
    assert isinstance(answered, AnswerAnswerResourcePredicate)
    assert answered.probability == 0.93


def test_sdk_gets_a_bad_request_above_max_questions(
    server: FakeDecisionsServer, client: openai.OpenAI
) -> None:
    questions = [_predicate(LAMBDA, f"Q-{i}") for i in range(server.max_questions + 1)]
    with pytest.raises(openai.BadRequestError, match="at most 200 questions") as info:
        client.decisions.create(model="gpt-6-luna", input=CODE, questions=questions)
    assert (info.value.code, info.value.param) == ("too_many_questions", "questions")
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert info.value.request_id == "req_fake_1"
    server.max_questions = 201
    answered = client.decisions.create(
        model="gpt-6-luna", input=CODE, questions=questions
    )
    assert len(answered.answers) == 201
    assert server.model.calls == 1  # the refused request never reached the model


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": CODE, "questions": [_predicate(LAMBDA)]}, "missing", "model"),
        ({"model": "m", "questions": [_predicate(LAMBDA)]}, "missing", "input"),
        ({"model": "m", "input": CODE}, "missing", "questions"),
        ({"model": "m", "input": CODE, "questions": []}, "empty_array", "questions"),
        ({"model": "m", "input": 3, "questions": []}, "invalid_type", "input"),
        (
            {"model": "m", "input": CODE, "questions": [{"type": "oracle"}]},
            "invalid_value",
            "questions[0].type",
        ),
        (
            {
                "model": "m",
                "input": CODE,
                "questions": [{"type": "choice", "name": "c", "instructions": "?"}],
            },
            "unsupported_question_type",
            "questions[0].type",
        ),
        (
            {
                "model": "m",
                "input": CODE,
                "questions": [{"type": "predicate", "instructions": "?"}],
            },
            "missing",
            "questions[0].name",
        ),
        (
            {
                "model": "m",
                "input": CODE,
                "questions": [_predicate(LAMBDA), _predicate(LAMBDA)],
            },
            "duplicate_question_name",
            "questions[1].name",
        ),
        (
            {
                "model": "m",
                "input": CODE,
                "questions": [{"type": "predicate", "name": "R-1"}],
            },
            "missing",
            "questions[0].instructions",
        ),
        (
            {
                "model": "m",
                "input": CODE,
                "questions": [
                    {"type": "predicate", "name": "Q", "instructions": "Is it?"}
                ],
            },
            "unsupported_question",
            "questions",
        ),
    ],
)
def test_invalid_requests_get_specific_bad_requests(
    server: FakeDecisionsServer,
    client: openai.OpenAI,
    body: dict[str, Any],
    code: str,
    param: str,
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/decisions", body=body, cast_to=Decision)
    expected = "missing_required_parameter" if code == "missing" else code
    assert (info.value.code, info.value.param) == (expected, param)
    assert server.model.calls == 0


def test_sdk_retries_a_rate_limit_then_succeeds(
    server: FakeDecisionsServer, http: httpx2.Client
) -> None:
    server.rate_limit_next(1, AT_ONCE)
    decision = _sdk(server, http, max_retries=1).decisions.create(
        model="gpt-6-luna", input=CODE, questions=[_predicate(LAMBDA)]
    )
    assert decision.answers[0].probability == 0.93  # type: ignore[union-attr]
    assert server.request_count == 2
    assert server.model.calls == 1


def test_rate_limited_first_requests_carry_retry_after(
    loopback: None, http: httpx2.Client
) -> None:
    with FakeDecisionsServer(rate_limited=2) as server:
        c = _sdk(server, http)
        for _ in range(2):
            with pytest.raises(openai.RateLimitError) as info:
                c.decisions.create(model="m", input=CODE, questions=[_predicate(TABS)])
            assert info.value.response.headers["retry-after"] == "0"
            assert info.value.code == "rate_limit_exceeded"
        decision = c.decisions.create(
            model="m", input=CODE, questions=[_predicate(TABS)]
        )
    assert decision.answers[0].probability == 0.04  # type: ignore[union-attr]
    assert server.request_count == len(server.requests) == 3


def test_fault_hook_sends_its_refusal(
    server: FakeDecisionsServer, client: openai.OpenAI
) -> None:
    def fail_tabs(request: dict[str, Any]) -> Refusal | None:
        names = {q["name"] for q in request["questions"]}
        return Refusal(500, {}, "The server had an error.") if "R-2" in names else None

    server.fault = fail_tabs
    with pytest.raises(openai.InternalServerError, match="had an error"):
        client.decisions.create(model="m", input=CODE, questions=[_predicate(TABS)])
    answered = client.decisions.create(
        model="m", input=CODE, questions=[_predicate(LAMBDA)]
    )
    assert answered.answers[0].probability == 0.93  # type: ignore[union-attr]


def test_other_paths_get_openai_404(
    server: FakeDecisionsServer, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.NotFoundError, match="Invalid URL") as info:
        client.post("/chat/completions", body={}, cast_to=object)
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.get("/decisions", cast_to=object)
    assert server.request_count == 0


# -- langchain-openai's OpenAIClassifier ---------------------------------------------


def test_classifier_gets_probabilities_and_usage(
    server: FakeDecisionsServer, http: httpx2.Client
) -> None:
    response = _classifier(server, http).invoke(
        {"state": CODE, "questions": {"R-1": _noul(LAMBDA), "R-2": _noul(TABS)}}
    )
    assert response.nouls["R-1"].noul == 0.93
    assert response.nouls["R-2"].noul == 0.04
    assert response.model == "gpt-6-luna"
    assert response.request_id == "req_fake_1"
    assert response.usage is not None
    expected = _tokens(CODE, _sent(LAMBDA), _sent(TABS))
    assert response.usage["input_tokens"] == expected
    assert response.usage["output_tokens"] == 0
    assert response.usage["total_tokens"] == expected
    # Criteria arrive appended to the instructions, the rule block still readable.
    assert server.requests[0]["questions"][0]["instructions"] == _sent(LAMBDA)
    # The fake model used directly reports the same answers and usage.
    direct = RuleAwareFakeDecisionModel().invoke(
        {"state": CODE, "questions": {"R-1": _noul(LAMBDA), "R-2": _noul(TABS)}}
    )
    assert direct.answers == response.answers
    assert direct.usage == response.usage


async def test_classifier_ainvoke(server: FakeDecisionsServer) -> None:
    response = await _classifier(server).ainvoke(
        {"state": CODE, "questions": {"R-2": _noul(TABS), "R-1": _noul(LAMBDA)}}
    )
    assert list(response.nouls) == ["R-2", "R-1"]
    assert response.nouls["R-1"].noul == 0.93
    assert server.request_count == 1


def test_classifier_raises_on_a_refused_question(
    loopback: None, http: httpx2.Client
) -> None:
    with FakeDecisionsServer(RuleAwareFakeDecisionModel(refuse=_refuse_tabs)) as s:
        with pytest.raises(ModelRefusalError, match="refused to answer: R-2"):
            _classifier(s, http).invoke(
                {"state": CODE, "questions": {"R-1": _noul(LAMBDA), "R-2": _noul(TABS)}}
            )
        assert s.request_count == 1


@pytest.mark.parametrize(
    "change",
    [
        {"drop_answers": lambda request: {"R-2"}},
        {
            "extra_answers": lambda request: [
                {"type": "predicate", "name": "R-9", "probability": 0.5}
            ]
        },
    ],
    ids=["dropped", "extra"],
)
def test_classifier_refuses_answers_that_do_not_match_its_questions(
    server: FakeDecisionsServer, http: httpx2.Client, change: dict[str, Any]
) -> None:
    for name, value in change.items():
        setattr(server, name, value)
    with pytest.raises(openai.APIResponseValidationError, match="Invalid response"):
        _classifier(server, http).invoke(
            {"state": CODE, "questions": {"R-1": _noul(LAMBDA), "R-2": _noul(TABS)}}
        )


def test_classifier_reports_http_errors_as_langchain_model_errors(
    server: FakeDecisionsServer, http: httpx2.Client
) -> None:
    classifier = _classifier(server, http)
    server.rate_limit_next(1)
    with pytest.raises(openai.RateLimitError) as limited:
        classifier.invoke({"state": CODE, "questions": {"R-1": _noul(LAMBDA)}})
    assert isinstance(limited.value, ModelRateLimitError)
    server.max_questions = 1
    with pytest.raises(openai.BadRequestError, match="at most 1 questions") as bad:
        classifier.invoke(
            {"state": CODE, "questions": {"R-1": _noul(LAMBDA), "R-2": _noul(TABS)}}
        )
    assert isinstance(bad.value, ModelInvalidRequestError)


def test_classifier_retries_a_rate_limit(
    server: FakeDecisionsServer, http: httpx2.Client
) -> None:
    server.rate_limit_next(1, AT_ONCE)
    response = _classifier(server, http, max_retries=1).invoke(
        {"state": CODE, "questions": {"R-1": _noul(LAMBDA)}}
    )
    assert response.nouls["R-1"].noul == 0.93
    assert response.request_id == "req_fake_2"


# -- chat completions on the same address --------------------------------------------


def _chat(server: FakeDecisionsServer) -> ChatOpenAI:
    return ChatOpenAI(
        model="fake-chat", base_url=server.base_url, api_key="test", max_retries=0
    )


def test_one_base_url_serves_decisions_and_chat(
    loopback: None, http: httpx2.Client
) -> None:
    chat = FakeListChatModel(responses=["Use `def` instead."])
    with FakeDecisionsServer(chat_model=chat) as server:
        assert isinstance(server, FakeOpenAIServer)
        decided = _classifier(server, http).invoke(
            {"state": CODE, "questions": {"R-1": _noul(LAMBDA)}}
        )
        answer = _chat(server).invoke("Rewrite it.")
    assert decided.nouls["R-1"].noul == 0.93
    assert answer.text == "Use `def` instead."
    # Each side keeps its own record; decisions are numbered on their own.
    assert decided.request_id == "req_fake_1"
    assert server.request_count == len(server.requests) == 1
    assert server.model.calls == 1
    assert [r["model"] for r in server.chat_requests] == ["fake-chat"]
    assert server.chat_requests[0]["messages"][-1]["content"] == "Rewrite it."


def test_chat_refusals_and_failures_reach_the_client(loopback: None) -> None:
    overloaded = Refusal(503, {}, "Overloaded.", error_type="server_error")
    asked: list[dict[str, Any]] = []

    def refuse_once(body: dict[str, Any]) -> Refusal | None:
        asked.append(body)
        return overloaded if len(asked) == 1 else None

    with FakeDecisionsServer(
        chat_model=FakeListChatModel(responses=[]), chat_refuse=refuse_once
    ) as server:
        with pytest.raises(openai.InternalServerError, match="Overloaded"):
            _chat(server).invoke("hi")
        # The chat model has no answer left: the server says so with a 500.
        with pytest.raises(openai.InternalServerError):
            _chat(server).invoke("hi")
        response = httpx2.post(f"{server.base_url}/chat/completions", content=b"[")
    assert response.status_code == 400
    assert len(asked) == 2  # asked once per chat request (not the non-JSON one)
    assert server.chat_requests == asked  # the refused one included
    assert server.requests == []
    assert server.request_count == 0


# -- RuleAwareFakeDecisionModel directly ----------------------------------------------


def test_fake_model_answers_from_the_rule_condition() -> None:
    model = RuleAwareFakeDecisionModel(yes_probability=0.8, no_probability=0.1)
    plain = Noul(instructions=render_decision_question(TABS))
    response = model.invoke(
        {"state": CODE, "questions": {"R-1": _noul(LAMBDA), "R-2": plain}}
    )
    assert {n: a.noul for n, a in response.nouls.items()} == {"R-1": 0.8, "R-2": 0.1}
    assert response.model == "fake-decisions"
    assert response.request_id == "req_fake_1"
    assert response.usage is not None
    expected = _tokens(CODE, _sent(LAMBDA), render_decision_question(TABS))
    assert response.usage["input_tokens"] == expected
    assert model.requests == [(CODE, ["R-1", "R-2"])]
    assert model.calls == 1


async def test_fake_model_ainvoke() -> None:
    model = RuleAwareFakeDecisionModel()
    response = await model.ainvoke(
        {"state": "no match", "questions": {"R-1": _noul(LAMBDA)}}
    )
    assert response.nouls["R-1"].noul == 0.04
    assert model.calls == 1


def test_fake_model_refusal_names_the_refused_questions() -> None:
    model = RuleAwareFakeDecisionModel(refuse=_refuse_tabs)
    assert model.answer(CODE, "R-2", render_decision_question(TABS)) is None
    assert model.answer(CODE, "R-1", render_decision_question(LAMBDA)) == 0.93
    with pytest.raises(ModelRefusalError, match="refused to answer: R-2"):
        model.invoke(
            {"state": CODE, "questions": {"R-1": _noul(LAMBDA), "R-2": _noul(TABS)}}
        )


@pytest.mark.parametrize(
    ("request_", "error", "match"),
    [
        ({"state": [CODE], "questions": {"R-1": _noul(LAMBDA)}}, TypeError, "str"),
        (
            {
                "state": CODE,
                "questions": {"c": Choice(instructions="?", criteria={"a": "A"})},
            },
            ValueError,
            "'c'.*not Choice",
        ),
        (
            {
                "state": CODE,
                "questions": {"s": Score(instructions="?", criteria=["0", "1"])},
            },
            ValueError,
            "'s'.*not Score",
        ),
        (
            {"state": CODE, "questions": {"Q": Noul(instructions="Is it code?")}},
            ValueError,
            "'Q' is not a decision question",
        ),
        (
            {"state": CODE, "questions": {"J": Noul(instructions={"rule": "R-1"})}},
            ValueError,
            "'J' is not a decision question",
        ),
    ],
)
def test_fake_model_refuses_what_it_cannot_answer(
    request_: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        RuleAwareFakeDecisionModel().invoke(request_)
