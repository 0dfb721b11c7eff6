"""Human review in LangChain's HITL schema: the request, and reading the decisions."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents.middleware.human_in_the_loop import ActionRequest

from langchain_tag._review import read_decisions, review_request

ACTIONS: list[ActionRequest] = [
    {"name": "keep_rule", "args": {"rule_id": "R-1"}, "description": "R-1: one"},
    {"name": "send_email", "args": {"to": "a@b.c"}},
    {"name": "keep_rule", "args": {"rule_id": "R-2"}, "description": "R-2: two"},
]


def answer(*decisions: object) -> dict[str, Any]:
    return {"decisions": list(decisions)}


APPROVE = {"type": "approve"}


# --- review_request ------------------------------------------------------------------


def test_request_lists_the_actions_and_one_config_per_name() -> None:
    request = review_request(ACTIONS)
    assert request["action_requests"] == ACTIONS
    assert request["review_configs"] == [
        {
            "action_name": "keep_rule",
            "allowed_decisions": ["approve", "edit", "reject"],
        },
        {
            "action_name": "send_email",
            "allowed_decisions": ["approve", "edit", "reject"],
        },
    ]


def test_request_with_narrower_decisions() -> None:
    request = review_request(ACTIONS[:1], allowed=["approve", "reject", "approve"])
    assert request["review_configs"] == [
        {"action_name": "keep_rule", "allowed_decisions": ["approve", "reject"]}
    ]


def test_request_does_not_share_the_callers_list() -> None:
    actions = list(ACTIONS)
    request = review_request(actions)
    actions.clear()
    assert len(request["action_requests"]) == 3


@pytest.mark.parametrize(
    ("allowed", "error", "text"),
    [
        (["approve", "accept"], ValueError, "'accept'"),
        ([], ValueError, "at least one"),
        ("approve", TypeError, "'approve'"),
    ],
    ids=["unknown", "empty", "string"],
)
def test_request_refuses_bad_allowed(
    allowed: Any, error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        review_request(ACTIONS, allowed=allowed)


# --- read_decisions ------------------------------------------------------------------


def test_reads_each_kind_of_decision_in_order() -> None:
    edited = {"name": "send_email", "args": {"to": "x@y.z"}}
    decisions = read_decisions(
        answer(
            {"type": "reject", "message": "not this one"},
            {"type": "edit", "edited_action": edited},
            {"type": "reject"},
        ),
        ACTIONS,
    )
    assert decisions == [
        {"type": "reject", "message": "not this one"},
        {"type": "edit", "edited_action": edited},
        {"type": "reject"},
    ]


def test_decisions_carry_only_their_own_keys() -> None:
    """Extra keys are ignored, as LangChain's middleware ignores them."""
    decisions = read_decisions(
        {"decisions": [{**APPROVE, "note": "x"}] * 3, "meta": 1}, ACTIONS
    )
    assert decisions == [APPROVE] * 3


def test_an_edits_args_are_a_copy() -> None:
    args = {"rule_id": "R-9"}
    edit = {"type": "edit", "edited_action": {"name": "keep_rule", "args": args}}
    (decision,) = read_decisions(answer(edit), ACTIONS[:1])
    args["rule_id"] = "changed"
    assert decision == {
        "type": "edit",
        "edited_action": {"name": "keep_rule", "args": {"rule_id": "R-9"}},
    }


def test_respond_when_allowed() -> None:
    allowed = ["approve", "respond"]
    (decision,) = read_decisions(
        answer({"type": "respond", "message": "42"}), ACTIONS[:1], allowed
    )
    assert decision == {"type": "respond", "message": "42"}
    with pytest.raises(ValueError, match=r"respond's message must be a string \(req"):
        read_decisions(answer({"type": "respond"}), ACTIONS[:1], allowed)


def test_no_actions_no_decisions() -> None:
    assert read_decisions(answer(), []) == []


@pytest.mark.parametrize(
    "bad",
    [True, None, "approve", [APPROVE], {"decision": [APPROVE]}, {"decisions": "all"}],
    ids=["true", "none", "str", "list", "typo", "not-a-list"],
)
def test_unreadable_answer(bad: object) -> None:
    with pytest.raises(ValueError, match="Unreadable review answer") as caught:
        read_decisions(bad, ACTIONS)
    assert '{"decisions": [...]}' in str(caught.value)
    assert '{"type": "approve"}' in str(caught.value)  # what a decision looks like


@pytest.mark.parametrize("count", [0, 2, 4])
def test_wrong_count(count: int) -> None:
    with pytest.raises(ValueError, match=f"Expected 3 decisions.*got {count}"):
        read_decisions(answer(*[APPROVE] * count), ACTIONS)


@pytest.mark.parametrize(
    ("decision", "text"),
    [
        ("approve", "decisions[1] (for action 'send_email') is 'approve', not a"),
        ({"kind": "approve"}, "decisions[1] (for action 'send_email') has no type"),
        ({"type": "accept"}, "unknown type 'accept'"),
        ({"type": ["approve"]}, "unknown type ['approve']"),
        ({"type": "respond", "message": "hi"}, "'respond' is not allowed here"),
        ({"type": "edit"}, "an edit needs edited_action"),
        ({"type": "edit", "edited_action": {"name": "send_email"}}, "edited_action"),
        (
            {"type": "edit", "edited_action": {"name": "send_email", "args": [1]}},
            'edited_action {"name": \'send_email\', "args": {...}}',
        ),
        (
            {"type": "edit", "edited_action": {"name": "delete_all", "args": {}}},
            "not rename the action 'send_email' to 'delete_all'",
        ),
        ({"type": "reject", "message": None}, "reject's message must be a string"),
        ({"type": "reject", "message": 3}, "not 3"),
    ],
    ids=[
        "not-a-mapping",
        "no-type",
        "unknown-type",
        "unhashable-type",
        "respond-not-allowed",
        "edit-without-action",
        "edit-without-args",
        "edit-args-not-a-dict",
        "edit-renames",
        "reject-message-none",
        "reject-message-int",
    ],
)
def test_bad_decision_names_which_and_why(decision: object, text: str) -> None:
    with pytest.raises(ValueError, match="decisions\\[1\\]") as caught:
        read_decisions(answer(APPROVE, decision, APPROVE), ACTIONS)
    assert text in str(caught.value)


def test_not_allowed_lists_what_is() -> None:
    with pytest.raises(ValueError, match="not allowed") as caught:
        read_decisions(
            answer({"type": "edit", "edited_action": ACTIONS[0]}),
            ACTIONS[:1],
            allowed=["approve", "reject"],
        )
    message = str(caught.value)
    assert "['approve', 'reject']" in message
    assert '{"type": "reject"}' in message
    assert "edited_action" not in message.split("allowed:")[1]


def test_a_long_answer_is_cut_short_in_the_message() -> None:
    huge = {"decision": ["x" * 10_000]}
    with pytest.raises(ValueError, match="Unreadable") as caught:
        read_decisions(huge, ACTIONS)
    assert len(str(caught.value)) < 1_000
