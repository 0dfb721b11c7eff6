"""TAG in a LangChain agent: `TAGMiddleware` for `langchain.agents.create_agent`.

    before_agent   judge the newest human message against every rule, once
                   (the engine behind `TAGRetriever`, with all its options)
    before_model   only with `review_band`: a person confirms uncertain verdicts
                   (LangChain's human-in-the-loop request), once per invocation
    wrap_model_call  every model call of the invocation gets the matched rules'
                   actions appended to its system message, and nothing else

The agent's model never sees an unmatched rule, any rule's condition, or the judge's
verdicts (the method's action-only principle). Tool-loop turns reuse the
invocation's verdicts; the next human message is judged again (an unchanged text
is a cache hit). What was matched is kept in the agent's state (`TAGAgentState`),
so checkpointed threads and traces show it, and a rule that already applied earlier
in the thread is marked so to the model ("previously applied", as Parlant does).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
)
from langchain.agents.middleware.human_in_the_loop import ActionRequest
from langchain.agents.middleware.types import ModelCallResult, OmitFromInput
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.constants import TAG_NOSTREAM
from langgraph.runtime import Runtime
from typing_extensions import NotRequired, TypedDict

from langchain_tag._delimiters import data_tag
from langchain_tag._review import ask, check_can_pause, read_decisions
from langchain_tag._text import digest
from langchain_tag.engine import MatchResult, select_applicable
from langchain_tag.execution.templates import format_actions
from langchain_tag.matching import Verdict
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rulebook
from langchain_tag.settings import JudgeModel

__all__ = [
    "GUIDANCE_INTRO",
    "TAGAgentState",
    "TAGMatch",
    "TAGMiddleware",
    "TAGTurn",
    "judged_text",
]


class TAGMatch(TypedDict):
    """A rule applied in this turn: what the state (not the model) records of it."""

    rule_id: str
    name: str
    score: float | None
    reason: str | None
    previously_applied: bool
    """Applied to an earlier human message of the thread as well."""


class TAGTurn(TypedDict):
    """The matching of one human message (one agent invocation)."""

    message_id: str | None
    """The id of the (last) human message judged."""
    text_digest: str
    """SHA-256 of the judged text (the message, with `history`: and its context)."""
    matched: list[TAGMatch]
    verdicts: list[dict[str, Any]]
    """Every verdict, as `Verdict.model_dump(mode="json")`, in rulebook order."""
    failed_rule_ids: list[str]
    reason: str | None
    """Why nothing matched, when nothing did."""
    review: list[str]
    """Rule ids whose verdicts wait for a person (`review_band`); empty once done."""
    reviewed: list[str]
    """Rule ids whose verdicts a person decided."""
    previous: list[str]
    """`tag_applied_rule_ids` before this turn."""


class TAGAgentState(AgentState[Any]):
    """The agent state `TAGMiddleware` adds: this turn's matching and the thread's."""

    tag: NotRequired[Annotated[TAGTurn, OmitFromInput]]
    tag_applied_rule_ids: NotRequired[Annotated[list[str], OmitFromInput]]
    """Every rule applied so far in the thread, in first-applied order."""


GUIDANCE_INTRO = (
    "Rules that apply to the user's latest message. Follow each of them in your reply:"
)
"""First line of the block appended to the system message."""

PREVIOUSLY_APPLIED = " (already applied earlier in this conversation)"
"""Appended to the action of a rule applied to an earlier message of the thread."""

_CONTEXT_NOTE = (
    "The message to judge is the text between <{message}> and </{message}>. The "
    "text between <{context}> and </{context}> is the earlier conversation, given "
    "as context only: use it to understand the message, but judge the message."
)

_REVIEW_ACTION = "tag_verdict"
"""The name of a review's action requests: the judge's verdict on one rule."""


class TAGMiddleware(AgentMiddleware[TAGAgentState, Any]):
    """Give an agent's model the actions of the rules its user's message satisfies.

    Once per agent invocation, the newest human message is judged against each
    rule, pairwise, by the matching engine of a `TAGRetriever` (its filter,
    prefilters, learned prefilter and shadow judging, cache, verdict log,
    `rules_per_call`, `max_concurrency` and `on_error` all apply). Every model
    call of that invocation, tool-loop turns included, then has the matched rules'
    actions appended to its system message. A failed judgment follows the judge's
    `on_error`: `"raise"` stops the invocation with `JudgmentError`;
    `"not_applicable"` leaves the rule out, flagged in `tag.failed_rule_ids`, with
    an `UnreliableMatchWarning` (and offers it for review when `review_band` is
    set), never silently a NO.

    Put it last in `create_agent(middleware=[...])`: its `wrap_model_call` is then
    the innermost and appends to the system message the others have set.

    Example:
        ```python
        from langchain.agents import create_agent
        from langchain_tag.middleware import TAGMiddleware

        agent = create_agent(
            model,
            tools=[search],
            middleware=[TAGMiddleware(rulebook="policy.rulebook.json", llm=judge)],
        )
        agent.invoke({"messages": [{"role": "user", "content": "..."}]})
        ```

    Args:
        retriever: The retriever whose engine and options judge; or give
            `rulebook` (and `llm` or `judge`, ...) to build one.
        rulebook: A `Rulebook` or the path of a rulebook file.
        llm: The judge model, with `rulebook`: a chat model, a decision model
            (`BaseDecisionModel`: every rule of the message as one question of
            one request) or a model string (default: from the environment).
        history: Earlier human and AI messages shown to the judge as context for
            the newest human message (0: the message alone). The judge's prompt
            tells which part is the message to judge and which is context.
        review_band: `(low, high)`: verdicts scoring within it (logprob scores:
            a judge with `logprobs=True`), and failed judgments, go to a person
            before the first model call, as a LangChain human-in-the-loop
            interrupt (needs a checkpointer). None: no review.
        guidance_intro: The line that introduces the actions in the system
            message.
        **retriever_fields: With `rulebook`: `TAGRetriever` fields (`k`, `filter`,
            `prefilter`, `judge`, `max_concurrency`, ...).
    """

    state_schema = TAGAgentState

    def __init__(
        self,
        retriever: TAGRetriever | None = None,
        *,
        rulebook: Rulebook | str | os.PathLike[str] | None = None,
        llm: JudgeModel | None = None,
        history: int = 0,
        review_band: tuple[float, float] | None = None,
        guidance_intro: str = GUIDANCE_INTRO,
        **retriever_fields: Any,
    ) -> None:
        """Set the middleware up; see the class docstring."""
        super().__init__()
        if (retriever is None) == (rulebook is None):
            msg = (
                "TAGMiddleware takes retriever=TAGRetriever(...) or rulebook= (with "
                "llm= or judge= and other TAGRetriever fields), exactly one of them."
            )
            raise ValueError(msg)
        if retriever is not None and (llm is not None or retriever_fields):
            given = sorted({*retriever_fields, *(["llm"] if llm is not None else [])})
            msg = (
                f"With retriever=, set {', '.join(given)} on the retriever: "
                "TAGMiddleware only takes them together with rulebook=."
            )
            raise ValueError(msg)
        if isinstance(history, bool) or not isinstance(history, int) or history < 0:
            msg = f"history must be an integer >= 0 (messages), got {history!r}."
            raise ValueError(msg)
        self.retriever = retriever or TAGRetriever.from_rulebook(
            cast("Rulebook | str | os.PathLike[str]", rulebook), llm, **retriever_fields
        )
        self.history = history
        self.review_band = _checked_band(review_band, self.retriever)
        self.guidance_intro = guidance_intro
        self.tools = []

    # -- before_agent: judge once per invocation --------------------------------------

    def before_agent(
        self, state: TAGAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Judge the newest human message, unless this thread already has."""
        judged = self._to_judge(state)
        if judged is None:
            return None
        self._check_review_can_pause()
        message, text = judged
        return self._turn(
            state, message, text, self.retriever.match(text, _judging_config())
        )

    async def abefore_agent(
        self, state: TAGAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async `before_agent`: the judgments run concurrently on the loop."""
        judged = self._to_judge(state)
        if judged is None:
            return None
        self._check_review_can_pause()
        message, text = judged
        result = await self.retriever.amatch(text, _judging_config())
        return self._turn(state, message, text, result)

    def _to_judge(self, state: TAGAgentState) -> tuple[HumanMessage, str] | None:
        """The newest human message and the text to judge; None: nothing new.

        What is new is every human message after the last AI message (an
        invocation may bring several; they are judged together), except the
        summaries `SummarizationMiddleware` writes as human messages. A message
        judged already (same id, same text) is not judged again.
        """
        messages = state["messages"]
        last_ai = max(
            (i for i, m in enumerate(messages) if isinstance(m, AIMessage)), default=-1
        )
        new = [
            i
            for i, m in enumerate(messages)
            if i > last_ai and isinstance(m, HumanMessage) and not _is_summary(m)
        ]
        if not new:
            return None
        # The same text sent again (a retry after a failed judgment, say) is one
        # message to judge, not the text twice.
        first: dict[str, int] = {}
        for i in new:
            first.setdefault(messages[i].text, i)
        new = sorted(first.values())
        humans = [cast("HumanMessage", messages[i]) for i in new]
        text = judged_text(humans, messages[: new[0]], self.history)
        turn = state.get("tag")
        if (
            turn is not None
            and turn["message_id"] == humans[-1].id
            and turn["text_digest"] == digest(text)
        ):
            return None
        return humans[-1], text

    def _check_review_can_pause(self) -> None:
        """Refuse a review that could never be resumed, before any judgment.

        Raises:
            ReviewNeedsCheckpointerError: `review_band` is set and the agent has
                no checkpointer to pause with.
        """
        if self.review_band is None:
            return
        check_can_pause(
            get_config(),
            "TAGMiddleware(review_band=...) pauses for a person, which needs a "
            "checkpointer: create_agent(..., checkpointer=InMemorySaver()) (or "
            "a persistent one), and a thread_id in the run's config. Nothing "
            "was judged.",
        )

    def _turn(
        self,
        state: TAGAgentState,
        message: HumanMessage,
        text: str,
        result: MatchResult,
    ) -> dict[str, Any]:
        earlier = state.get("tag")
        # A message judged again (edited in place) keeps what preceded it.
        previous = list(
            earlier["previous"]
            if earlier is not None and earlier["message_id"] == message.id
            else state.get("tag_applied_rule_ids") or []
        )
        verdicts = [v.model_dump(mode="json") for v in result.verdicts]
        turn = TAGTurn(
            message_id=message.id,
            text_digest=digest(text),
            matched=[],
            verdicts=verdicts,
            failed_rule_ids=list(result.failed_rule_ids),
            reason=result.reason,
            review=self._uncertain(result.verdicts),
            reviewed=[],
            previous=previous,
        )
        if turn["review"]:  # the selection waits for the person (before_model)
            return {"tag": turn}
        # The engine's selection, as it returned it.
        by_rule = {v.rule_id: v for v in result.verdicts}
        return self._selected(
            turn, [by_rule[str(d.metadata["rule_id"])] for d in result.documents]
        )

    def _uncertain(self, verdicts: Sequence[Verdict]) -> list[str]:
        if self.review_band is None:
            return []
        low, high = self.review_band
        return [
            v.rule_id
            for v in verdicts
            if v.failed or (v.score is not None and low <= v.score <= high)
        ]

    def _selected(self, turn: TAGTurn, kept: Sequence[Verdict]) -> dict[str, Any]:
        """The state update: `turn` with its matches, and the thread's applied rules.

        Args:
            turn: This turn's matching.
            kept: The verdicts selected, best first.
        """
        rulebook = self.retriever.rulebook
        previous = turn["previous"]
        matched = [
            TAGMatch(
                rule_id=v.rule_id,
                name=getattr(rulebook.get(v.rule_id), "name", v.rule_id),
                score=v.score,
                reason=v.reason,
                previously_applied=v.rule_id in previous,
            )
            for v in kept
        ]
        applied = previous + [
            m["rule_id"] for m in matched if m["rule_id"] not in previous
        ]
        return {
            "tag": {
                **turn,
                "matched": matched,
                "reason": None
                if matched
                else turn["reason"] or "no rule applies after the review",
            },
            "tag_applied_rule_ids": applied,
        }

    # -- before_model: a person confirms uncertain verdicts ---------------------------

    def before_model(
        self, state: TAGAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Ask a person about the turn's uncertain verdicts, once, if there are any.

        An interrupt with LangChain's human-in-the-loop request: one action request
        (`tag_verdict`, args `rule_id` and `applies`) per uncertain verdict. Resume
        with `{"decisions": [...]}`: approve keeps the judge's verdict, reject
        reverses it, edit sets `applies`. A decision that cannot be applied asks
        again, saying why.
        """
        turn = state.get("tag")
        if turn is None or not turn["review"]:
            return None
        verdicts = [Verdict.model_validate(v) for v in turn["verdicts"]]
        by_rule = {v.rule_id: v for v in verdicts}
        actions = [self._action(by_rule[rule_id]) for rule_id in turn["review"]]

        def decide(answer: object) -> dict[str, Verdict]:
            decisions = read_decisions(answer, actions)
            return {
                action["args"]["rule_id"]: _reviewed(
                    by_rule[action["args"]["rule_id"]], decision
                )
                for action, decision in zip(actions, decisions, strict=True)
            }

        decided = ask(actions, decide)
        by_rule.update(decided)
        reviewed = [by_rule[v.rule_id] for v in verdicts]
        done = TAGTurn(
            **{
                **turn,
                "verdicts": [v.model_dump(mode="json") for v in reviewed],
                "failed_rule_ids": [v.rule_id for v in reviewed if v.failed],
                "review": [],
                "reviewed": list(turn["review"]),
            }
        )
        # The engine's selection (`k`, `score_threshold`) of the reviewed verdicts.
        options = self.retriever.options()
        kept = select_applicable(
            reviewed,
            [v.rule_id for v in reviewed],
            k=options.k,
            threshold=options.score_threshold,
        )
        return self._selected(done, kept)

    async def abefore_model(
        self, state: TAGAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async `before_model` (no model call: the same body)."""
        return self.before_model(state, runtime)

    def _action(self, verdict: Verdict) -> ActionRequest:
        rule = self.retriever.rulebook.get(verdict.rule_id)
        said = (
            f"the judgment failed ({verdict.error})"
            if verdict.failed
            else f"the judge said {'YES' if verdict.applies else 'NO'}"
            + ("" if verdict.score is None else f" (score {verdict.score:.2f})")
        )
        name = "" if rule is None else f" ({rule.name})"
        condition = "" if rule is None else f" Condition: {rule.condition}"
        return ActionRequest(
            name=_REVIEW_ACTION,
            args={"rule_id": verdict.rule_id, "applies": verdict.applies},
            description=(
                f"Does rule {verdict.rule_id}{name} apply to the user's latest "
                f"message? {said}.{condition} Approve to keep this verdict, reject "
                "to reverse it, or edit `applies`."
            ),
        )

    # -- wrap_model_call: the actions, and nothing else, to the model -----------------

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult[Any]:
        """Call the model with the matched actions in its system message."""
        return handler(self._guided(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult[Any]:
        """Async `wrap_model_call`."""
        return await handler(self._guided(request))

    def _guided(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        guidance = self.guidance(cast("Mapping[str, Any]", request.state))
        if guidance is None:
            return request
        return request.override(
            system_message=_appended(request.system_message, guidance)
        )

    def guidance(self, state: Mapping[str, Any]) -> str | None:
        """The text appended to the system message in `state`; None: no rule applies.

        The intro line, then `[rule_id] action` per matched rule (the executor's
        format), marked when the rule was applied earlier in the thread.
        """
        turn = state.get("tag")
        if not turn or not turn["matched"]:
            return None
        lines = [self.guidance_intro]
        for match in turn["matched"]:
            rule = self.retriever.rulebook.get(match["rule_id"])
            if rule is None:  # the rulebook changed under a checkpointed thread
                continue
            mark = PREVIOUSLY_APPLIED if match["previously_applied"] else ""
            lines.append(format_actions([rule]) + mark)
        return None if len(lines) == 1 else "\n".join(lines)


def judged_text(
    message: HumanMessage | Sequence[HumanMessage],
    earlier: Sequence[AnyMessage],
    history: int,
) -> str:
    """What the judge reads: the message(s), after up to `history` earlier messages.

    With no history (or none to show) it is the messages' text alone, so a
    retriever and the middleware share cached verdicts. Otherwise the earlier
    human and AI messages, one line each, and the message are delimited blocks
    whose tags carry a digest of both, so neither can contain a tag of either,
    and a first line says which block is judged.
    """
    messages = [message] if isinstance(message, HumanMessage) else list(message)
    text = "\n\n".join(m.text for m in messages)
    if history == 0:
        return text
    shown = [
        f"{'user' if isinstance(m, HumanMessage) else 'assistant'}: "
        + " ".join(m.text.split())  # one line a message: no line poses as a turn
        for m in earlier
        if isinstance(m, HumanMessage | AIMessage) and m.text.strip()
    ][-history:]
    if not shown:
        return text
    context = "\n".join(shown)
    both = f"{context}\x00{text}"
    message_tag, context_tag = data_tag("message", both), data_tag("context", both)
    return (
        _CONTEXT_NOTE.format(message=message_tag, context=context_tag)
        + f"\n\n<{context_tag}>\n{context}\n</{context_tag}>\n\n"
        + f"<{message_tag}>\n{text}\n</{message_tag}>"
    )


def _is_summary(message: HumanMessage) -> bool:
    """A summary of earlier messages that `SummarizationMiddleware` wrote."""
    return message.additional_kwargs.get("lc_source") == "summarization"


def _checked_band(
    band: tuple[float, float] | None, retriever: TAGRetriever
) -> tuple[float, float] | None:
    if band is None:
        return None
    try:
        low, high = (float(bound) for bound in band)
    except (TypeError, ValueError):
        low = high = -1.0
    if not 0.0 <= low <= high <= 1.0:
        msg = (
            f"review_band must be (low, high) with 0 <= low <= high <= 1, got {band!r}."
        )
        raise ValueError(msg)
    if getattr(retriever.judge, "logprobs", True) is False:
        msg = (
            "review_band routes verdicts by their score, and this judge gives "
            "none: use ApplicabilityJudge(llm=..., logprobs=True) with a model "
            "that returns logprobs (e.g. ChatOpenAI), or a decision model (its "
            "probability is the score)."
        )
        raise ValueError(msg)
    return low, high


_BOOLEANS = {"true": True, "false": False}


def _reviewed(verdict: Verdict, decision: Mapping[str, Any]) -> Verdict:
    """The verdict a person decided: it ranks as certain (no score).

    Raises:
        ValueError: An edit changes the rule id or sets `applies` to a non-boolean.
    """
    kind: Literal["approve", "edit", "reject"] = decision["type"]
    applies = verdict.applies  # a failed judgment's is False: not applicable
    if kind == "reject":
        applies = not applies
    elif kind == "edit":
        args = decision["edited_action"]["args"]
        # Agent Chat UI sends each edited arg as the text of its box.
        edited = _BOOLEANS.get(str(args.get("applies")).strip().lower())
        if args.get("rule_id", verdict.rule_id) != verdict.rule_id or edited is None:
            msg = (
                f"The edit of {verdict.rule_id!r} must keep its rule_id and set "
                f"'applies' to true or false, got args {args!r}."
            )
            raise ValueError(msg)
        applies = edited
    note = decision.get("message")
    return Verdict(
        rule_id=verdict.rule_id,
        applies=applies,
        reason=f"decided by a person ({kind})" + (f": {note}" if note else ""),
        decided_by="person",
    )


def _appended(system: SystemMessage | None, text: str) -> SystemMessage:
    if system is None:
        return SystemMessage(text)
    if isinstance(system.content, str):
        joined = f"{system.content}\n\n{text}" if system.content else text
        return SystemMessage(joined)
    # Content blocks (e.g. with cache-control markers) stay as they are.
    return SystemMessage([*system.content, {"type": "text", "text": text}])


def _judging_config() -> RunnableConfig:
    """The judgments' config: child runs of the hook, kept out of message streams.

    Tagged `nostream`, as LangChain's own middleware tags its model calls: an
    agent streamed with `stream_mode="messages"` shows its model's tokens, not the
    judge's verdicts.
    """
    hook = get_config()
    return {
        "callbacks": hook.get("callbacks"),
        "tags": [*hook.get("tags", []), TAG_NOSTREAM],
        "metadata": dict(hook.get("metadata") or {}),
    }
