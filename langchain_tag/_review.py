"""Human review in LangChain's human-in-the-loop schema.

`review_request` builds the interrupt value (`HITLRequest`) that LangGraph Studio and
Agent Chat UI render; `read_decisions` reads the reviewer's resume value
(`{"decisions": [...]}`, one decision per action, in order) and says precisely what
is wrong with one that cannot be applied; `check_can_pause` refuses a review that
could never be resumed. The query graph's rule review and the agent middleware both
speak it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast, get_args

from langchain.agents.middleware.human_in_the_loop import (
    Action,
    ActionRequest,
    ApproveDecision,
    Decision,
    DecisionType,
    EditDecision,
    HITLRequest,
    RejectDecision,
    RespondDecision,
    ReviewConfig,
)
from langchain_core.runnables import RunnableConfig
from langgraph.constants import CONF, CONFIG_KEY_CHECKPOINTER
from langgraph.types import interrupt
from typing_extensions import TypeIs

from langchain_tag.errors import ReviewNeedsCheckpointerError

T = TypeVar("T")


def check_can_pause(config: RunnableConfig, message: str) -> None:
    """Refuse a review that could never be resumed: the run has no checkpointer.

    A run has one when its graph was compiled with one, when a parent graph lends
    it to a subgraph, or when a LangGraph server (Studio) runs the graph: all of
    them put it in the run's config, which is what is checked here.

    Args:
        config: The config of the running node (`get_config()` inside one).
        message: What to tell the caller, e.g. how to give a checkpointer.

    Raises:
        ReviewNeedsCheckpointerError: The run has no checkpointer.
    """
    if config.get(CONF, {}).get(CONFIG_KEY_CHECKPOINTER) is None:
        raise ReviewNeedsCheckpointerError(message)


DEFAULT_ALLOWED: tuple[DecisionType, ...] = ("approve", "edit", "reject")
"""The decisions a reviewer may make unless told otherwise."""

_KNOWN: tuple[DecisionType, ...] = get_args(DecisionType)

_SHAPES: dict[DecisionType, str] = {
    "approve": '{"type": "approve"}',
    "edit": '{"type": "edit", "edited_action": {"name": <the action\'s name>, '
    '"args": {...}}}',
    "reject": '{"type": "reject"} or {"type": "reject", "message": "<why>"}',
    "respond": '{"type": "respond", "message": "<the answer>"}',
}
"""Each decision as the reviewer writes it, for error messages."""


def _shown(value: object, limit: int = 200) -> str:
    """`repr(value)`, cut short: an answer can carry whole edited actions."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _is_decision_type(name: object) -> TypeIs[DecisionType]:
    return name in _KNOWN


def _allowed(allowed: Sequence[str]) -> list[DecisionType]:
    """`allowed`, checked against LangChain's decision types, without repeats."""
    if isinstance(allowed, str):
        # A lone string is a sequence of letters, never what the caller meant.
        msg = (
            f"allowed must be a sequence of decision types, not the string {allowed!r}"
        )
        raise TypeError(msg)
    checked: list[DecisionType] = []
    for name in allowed:
        if not _is_decision_type(name):
            msg = f"Unknown decision type {name!r} in allowed; known: {list(_KNOWN)}."
            raise ValueError(msg)
        if name not in checked:
            checked.append(name)
    if not checked:
        msg = "allowed must name at least one decision type."
        raise ValueError(msg)
    return checked


def review_request(
    actions: Sequence[ActionRequest],
    allowed: Sequence[str] = DEFAULT_ALLOWED,
) -> HITLRequest:
    """LangChain's HITL request for `actions`.

    Args:
        actions: The actions to review, in the order their decisions must come.
        allowed: The decisions the reviewer may make on every action.

    Returns:
        The action requests, and one review config per distinct action name (in
        order of first appearance) with `allowed_decisions = allowed`.

    Raises:
        ValueError: `allowed` is empty or names an unknown decision type.
        TypeError: `allowed` is a single string.
    """
    decisions = _allowed(allowed)
    names = dict.fromkeys(action["name"] for action in actions)
    configs = [
        ReviewConfig(action_name=name, allowed_decisions=list(decisions))
        for name in names
    ]
    return HITLRequest(action_requests=list(actions), review_configs=configs)


def ask(
    actions: Sequence[ActionRequest],
    apply: Callable[[object], T],
    allowed: Sequence[str] = DEFAULT_ALLOWED,
) -> T:
    """Pause for a person with `actions` until `apply` accepts an answer.

    The interrupt's value is `review_request(actions, allowed)` and `problem`: why
    the previous answer was not applied (None at first). The problem also leads
    each action's description, since Agent Chat UI shows only the HITL keys.

    Args:
        actions: The actions to review.
        apply: Reads an answer (the resume value); raises `ValueError` or
            `TypeError` when it cannot be applied, which asks again.
        allowed: The decisions the reviewer may make on every action.

    Returns:
        What `apply` made of the first answer it accepted.
    """
    problem: str | None = None
    while True:
        shown = [
            action
            if problem is None
            else {
                **action,
                "description": f"Previous answer not applied: {problem}\n\n"
                + action.get("description", ""),
            }
            for action in actions
        ]
        # Each ask is a new interrupt: LangGraph replays earlier answers to the
        # earlier interrupts, so a bad answer never sticks to the thread.
        answer = interrupt(
            {
                **review_request(cast("list[ActionRequest]", shown), allowed),
                "problem": problem,
            }
        )
        try:
            return apply(answer)
        except (ValueError, TypeError) as error:
            problem = str(error)


def read_decisions(
    answer: object,
    actions: Sequence[ActionRequest],
    allowed: Sequence[str] = DEFAULT_ALLOWED,
) -> list[Decision]:
    """The reviewer's decisions, one per action, in order.

    Keys a decision does not use are ignored, as LangChain's middleware ignores them;
    the decisions returned carry only their own keys.

    Args:
        answer: LangChain's resume value, `{"decisions": [...]}`.
        actions: The actions the decisions are about (as sent in the request).
        allowed: The decisions the reviewer may make on every action.

    Returns:
        One decision per action: approve, edit (the same action name, new args),
        reject (with an optional message) or, when allowed, respond.

    Raises:
        ValueError: The answer is not a mapping with a "decisions" list, has a
            decision per action too many or too few, or a decision is unknown, not
            allowed, or malformed (an edit without `edited_action` {"name": str,
            "args": dict} or renaming the action, a reject message that is not a
            string). The message says which decision and what shape is expected.
    """
    permitted = _allowed(allowed)
    expected = " or ".join(_SHAPES[name] for name in permitted)
    if not isinstance(answer, Mapping) or not isinstance(
        decisions := answer.get("decisions"), list
    ):
        msg = (
            f"Unreadable review answer {_shown(answer)}: expected "
            '{"decisions": [...]} with one decision per action, in order, each '
            f"{expected}."
        )
        raise ValueError(msg)  # noqa: TRY004 - a bad answer, reported as the others
    if len(decisions) != len(actions):
        msg = (
            f"Expected {len(actions)} decisions, one per action in order, got "
            f'{len(decisions)}: resume with {{"decisions": [...]}} holding exactly '
            f"{len(actions)}."
        )
        raise ValueError(msg)
    return [
        _decision(i, decision, action, permitted, expected)
        for i, (decision, action) in enumerate(zip(decisions, actions, strict=True))
    ]


def _decision(
    i: int,
    decision: object,
    action: ActionRequest,
    permitted: list[DecisionType],
    expected: str,
) -> Decision:
    where = f"decisions[{i}] (for action {action['name']!r})"
    if not isinstance(decision, Mapping):
        msg = f"{where} is {_shown(decision)}, not a decision; expected {expected}."
        raise ValueError(msg)  # noqa: TRY004 - a bad answer, reported as the others
    kind = _decision_type(where, decision, permitted, expected)
    if kind == "approve":
        return ApproveDecision(type="approve")
    if kind == "edit":
        return EditDecision(
            type="edit", edited_action=_edited_action(where, decision, action)
        )
    return _with_message(where, kind, decision)


def _decision_type(
    where: str,
    decision: Mapping[str, Any],
    permitted: list[DecisionType],
    expected: str,
) -> DecisionType:
    if "type" not in decision:
        msg = f"{where} has no type: {_shown(decision)}; expected {expected}."
        raise ValueError(msg)
    kind = decision["type"]
    if not _is_decision_type(kind):
        msg = f"{where} has unknown type {_shown(kind)}; expected {expected}."
        raise ValueError(msg)
    if kind not in permitted:
        msg = (
            f"{where}: {kind!r} is not allowed here; allowed: {permitted}, "
            f"as {expected}."
        )
        raise ValueError(msg)
    return kind


def _with_message(
    where: str, kind: DecisionType, decision: Mapping[str, Any]
) -> RejectDecision | RespondDecision:
    """A reject (its message optional) or a respond (its message required)."""
    message = decision.get("message")
    if kind == "reject" and "message" not in decision:
        return RejectDecision(type="reject")
    if not isinstance(message, str):
        need = " (required)" if kind == "respond" else ""
        msg = (
            f"{where}: a {kind}'s message must be a string{need}, not "
            f"{_shown(message)}; "
            f"expected {_SHAPES[kind]}."
        )
        raise ValueError(msg)  # noqa: TRY004 - a bad answer, reported as the others
    if kind == "respond":
        return RespondDecision(type="respond", message=message)
    return RejectDecision(type="reject", message=message)


def _edited_action(
    where: str, decision: Mapping[str, Any], action: ActionRequest
) -> Action:
    edited = decision.get("edited_action")
    name = edited.get("name") if isinstance(edited, Mapping) else None
    args = edited.get("args") if isinstance(edited, Mapping) else None
    if not isinstance(name, str) or not isinstance(args, Mapping):
        msg = (
            f"{where}: an edit needs edited_action "
            f'{{"name": {action["name"]!r}, "args": {{...}}}}, got {_shown(edited)}.'
        )
        raise ValueError(msg)  # noqa: TRY004 - a bad answer, reported as the others
    if name != action["name"]:
        msg = (
            f"{where}: an edit may change the args only, not rename the action "
            f"{action['name']!r} to {name!r}."
        )
        raise ValueError(msg)
    return Action(name=name, args=dict(args))
