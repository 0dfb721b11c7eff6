"""The local decision model's core: questions scored on one shared prefix.

A tiny Llama with random weights stands in for a real model here (the arithmetic is
the same); `tests/integration_tests/test_local_model_in_process.py` runs SmolLM2.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from langchain_core.decisions import Choice, Noul, NoulCriteria
from langchain_core.messages import HumanMessage

from langchain_tag.errors import UnsupportedQuestionError
from langchain_tag.local_model._decisions import (
    LocalDecisionModel,
    Prepared,
    render_question,
    render_state,
    rows_per_batch,
    score_questions,
)

torch = pytest.importorskip("torch", reason="the local-llm extra is not installed")
transformers = pytest.importorskip(
    "transformers", reason="the local-llm extra is not installed"
)

VOCAB = 96
YES, NO = [5, 6], [7]


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    tiny = transformers.LlamaForCausalLM(config)
    tiny.eval()
    return tiny


def questions(
    count: int, seed: int = 1, criteria: list[int] | None = None
) -> list[tuple[list[int], list[int]]]:
    """`count` questions of mixed lengths, each after `criteria` (none by default)."""
    draw = random.Random(seed)  # noqa: S311 - token ids, not secrets
    return [
        (
            list(criteria or []),
            [draw.randrange(8, VOCAB) for _ in range(draw.choice([1, 3, 9, 30, 61]))],
        )
        for _ in range(count)
    ]


def scored(
    model: Any, prefix: list[int], asked: list[tuple[list[int], list[int]]], rows: int
) -> list[float]:
    with torch.inference_mode():
        return score_questions(model, Prepared(prefix, asked), YES, NO, rows=rows)


_DRAW = random.Random(0)  # noqa: S311 - token ids, not secrets
PREFIX = [_DRAW.randrange(8, VOCAB) for _ in range(120)]


def test_one_request_of_24_equals_24_requests_of_one(model: Any) -> None:
    asked = questions(24)
    together = scored(model, PREFIX, asked, rows=5)  # five batches, lengths mixed
    alone = [scored(model, PREFIX, [q], rows=1)[0] for q in asked]
    assert max(abs(a - b) for a, b in zip(together, alone, strict=True)) <= 1e-4
    assert all(0.0 <= p <= 1.0 for p in together)
    assert len(set(together)) > 1  # the questions are told apart


def test_questions_with_their_own_criteria_equal_them_alone(model: Any) -> None:
    asked = questions(5, criteria=[20, 21, 22]) + questions(5, 2, criteria=[30] * 40)
    asked += questions(3, 3)  # and some with none
    together = scored(model, PREFIX, asked, rows=4)
    alone = [scored(model, PREFIX, [q], rows=1)[0] for q in asked]
    assert max(abs(a - b) for a, b in zip(together, alone, strict=True)) <= 1e-4
    # The criteria are read: the same question after others answers otherwise.
    assert together[0] != pytest.approx(
        scored(model, PREFIX, [([31, 32], asked[0][1])], rows=1)[0], abs=1e-6
    )


def test_questions_never_see_one_another(model: Any) -> None:
    asked = questions(6)
    before = scored(model, PREFIX, asked, rows=8)
    after = scored(model, PREFIX, [*asked, ([], [9] * 50)], rows=8)
    assert max(abs(a - b) for a, b in zip(before, after, strict=False)) <= 1e-5


def test_questions_of_very_different_lengths_share_a_batch(model: Any) -> None:
    short: tuple[list[int], list[int]] = ([], [11])
    long: tuple[list[int], list[int]] = ([], [12 + i % 80 for i in range(200)])
    together = scored(model, PREFIX, [short, long], rows=2)
    assert together[0] == pytest.approx(scored(model, PREFIX, [short], 1)[0], abs=1e-5)
    assert together[1] == pytest.approx(scored(model, PREFIX, [long], 1)[0], abs=1e-5)


def test_the_prefix_matters(model: Any) -> None:
    asked = questions(4)
    other = scored(model, list(reversed(PREFIX)), asked, rows=4)
    assert other != scored(model, PREFIX, asked, rows=4)


def test_a_check_that_raises_stops_the_request_between_layers(model: Any) -> None:
    layers = 0

    class ClosedError(Exception):
        pass

    def check() -> None:
        nonlocal layers
        layers += 1
        if layers > 4:  # the prefix's pass, then the first batch's second layer
            raise ClosedError

    with pytest.raises(ClosedError), torch.inference_mode():
        score_questions(
            model, Prepared(PREFIX, questions(8)), YES, NO, rows=2, check=check
        )
    assert layers == 5
    # The hooks are gone: the next request runs in full.
    assert len(scored(model, PREFIX, questions(3), rows=3)) == 3


def test_batches_are_bounded_by_the_memory_budget(model: Any) -> None:
    config = model.config
    small = rows_per_batch(config, 500, 90, element_bytes=4, budget=1 << 20)
    large = rows_per_batch(config, 500, 90, element_bytes=4, budget=1 << 26)
    assert 1 <= small < large
    assert rows_per_batch(config, 500, 90, element_bytes=4, budget=1) == 1


def test_a_noul_is_asked_with_what_yes_and_no_mean() -> None:
    asked = render_question(
        "R-1",
        Noul(
            instructions="Does the input import with a wildcard?",
            criteria=NoulCriteria(true="`import *` appears", false={"else": "no"}),
        ),
    )
    assert (
        asked.criteria == 'Yes means: `import *` appears\nNo means: {"else": "no"}\n\n'
    )
    assert asked.question == (
        "Answer yes or no to this question:\nDoes the input import with a wildcard?"
    )
    assert render_question("R-2", Noul(instructions="Plain?")).criteria == ""


def test_only_noul_questions_are_answered() -> None:
    choice = Choice(instructions="Which team?", criteria={"a": None, "b": None})
    with pytest.raises(UnsupportedQuestionError, match="'route' is a Choice"):
        render_question("route", choice)


def test_a_state_is_text_or_json() -> None:
    assert render_state("x = 1") == "x = 1"
    assert render_state(HumanMessage("hi")) == "hi"
    assert '"role": "human"' in render_state({"messages": [HumanMessage("hi")]})


class Scripted:
    """A `Decider` answering from a table, to test the model's wrapping."""

    model_path = "scripted"

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[str]]] = []

    def decide(
        self, state: str, questions: Any, *, instructions: str, memory_budget: Any
    ) -> tuple[list[float], int]:
        self.asked.append((state, [q.question for q in questions]))
        return [0.25 * (i + 1) for i in range(len(questions))], 42


def test_the_decision_model_answers_each_noul_with_its_probability() -> None:
    decider = Scripted()
    model = LocalDecisionModel(runtime=decider, model="tiny")
    response = model.invoke(
        {
            "state": "import os, sys",
            "questions": {
                "a": Noul(instructions="One?"),
                "b": Noul(instructions="Two?"),
            },
        }
    )
    assert {k: v.noul for k, v in response.nouls.items()} == {"a": 0.25, "b": 0.5}
    assert response.usage is not None
    assert (response.usage["input_tokens"], response.usage["output_tokens"]) == (42, 0)
    assert decider.asked == [
        (
            "import os, sys",
            [
                "Answer yes or no to this question:\nOne?",
                "Answer yes or no to this question:\nTwo?",
            ],
        )
    ]
    assert model.identity_params["model_path"] == "scripted"
