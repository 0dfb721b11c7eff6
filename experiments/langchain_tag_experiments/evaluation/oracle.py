"""An ORACLE judge for upper bounds: it answers from the gold labels, not a model.

`OracleChatModel` is a chat model that plays the applicability judge perfectly: it
reads the input and the rule id out of the judge's prompt and answers YES exactly
when that rule is gold for that input. Put it where a real judge model goes
(`ApplicabilityJudge`, `TAGRetriever`, the query graph's `judge_model`) and the
whole pipeline runs as usual, every judgment one counted call, with perfect
matching: the result is what TAG would score with a flawless judge. It is an
evaluation oracle and must never be reported as a model: `CallCounter` counts its
answers as `oracle_calls`, and the results tables as oracle look-ups (what a judge
model would have to be called for), not LLM calls.

`OracleDecisionModel` is the same oracle as a decision model
(`langchain_core.decisions.BaseDecisionModel`), for `DecisionJudge`: every
candidate rule of an input one question, all in one request. Its requests are
look-ups too; the tokens it reports are those the request would send a decision
model, counted, so its rows show what one decision request per input costs.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.decisions import (
    BaseDecisionModel,
    ClassifierResponse,
    Noul,
    Question,
    State,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr

from langchain_tag._delimiters import escape_delimiters
from langchain_tag.errors import TAGError
from langchain_tag.matching import (
    CONDITION_PROFILE,
    ApplicabilityJudge,
    DecisionJudge,
    RuleSchemaProfile,
)
from langchain_tag.matching.decision import noul_response
from langchain_tag.matching.prompts import read_decision_question, read_judge_message
from langchain_tag.usage import token_counter
from langchain_tag_experiments.evaluation.usage import (
    ORACLE_LLM_TYPE,
    ORACLE_PROVIDER,
    decision_request_tokens,
)

_SHOWN = 80
"""Characters of an unknown input quoted in the error."""


class OracleError(TAGError, LookupError):
    """The oracle was asked something the gold labels cannot answer."""


def _gold_digest(gold: Mapping[str, AbstractSet[str]]) -> str:
    """SHA-256 of the gold labels: verdict caches of oracles with other gold differ."""
    canonical = json.dumps(sorted((text, sorted(ids)) for text, ids in gold.items()))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _unknown_input(owner: str, text: str, known: int) -> str:
    """The error message of an input without gold labels."""
    shown = text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
    return (
        f"{owner} has no gold labels for the input {shown!r} ({known} inputs "
        "known); key `gold` by the exact text that is judged."
    )


class OracleChatModel(BaseChatModel):
    """An oracle judge: YES iff the judged rule is gold for the judged input.

    Answers in the format the prompt asks for: `{"applicable": ..., "reason": ...}`
    when the prompt asks for `"applicable"` (constraint profiles such as
    `NBA_PROFILE`), else `{"verdict": "YES"|"NO"}`. An input that is not in `gold`,
    or a prompt that is not a judge prompt (an executor's, say), raises
    `OracleError`: the oracle never guesses, and in particular never answers a
    silent NO. Stateless apart from a locked call counter, so safe to share across
    threads and tasks.

    Args:
        gold: Input text, exactly as it is judged -> the ids of its gold rules.
    """

    gold: Mapping[str, AbstractSet[str]]

    _answers: dict[str, frozenset[str]] = PrivateAttr(default_factory=dict)
    _digest: str = PrivateAttr(default="")
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _calls: int = PrivateAttr(default=0)

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        # The prompt carries the input escaped; look it up the same way.
        self._answers = {
            escape_delimiters(text): frozenset(ids) for text, ids in self.gold.items()
        }
        self._digest = _gold_digest(self.gold)

    @property
    def _llm_type(self) -> str:
        # What `CallCounter` tells the oracle's look-ups from model calls by.
        return ORACLE_LLM_TYPE

    @property
    def _identifying_params(self) -> dict[str, Any]:
        # Verdict caches key on this: oracles with other gold must not share them.
        return {"oracle": True, "gold_sha256": self._digest}

    @property
    def calls(self) -> int:
        """Judge prompts answered so far."""
        return self._calls

    def answer(self, prompt: str) -> str:
        """The oracle's answer to one judge prompt (all messages' text joined).

        Raises:
            OracleError: Not a judge prompt, or an input not in `gold`.
        """
        parsed = read_judge_message(prompt)
        if parsed is None:
            msg = (
                "OracleChatModel only answers applicability-judge prompts (an input "
                "and a rule); give the executor its own model."
            )
            raise OracleError(msg)
        text, fields = parsed
        gold = self._answers.get(text)
        if gold is None:
            msg = _unknown_input("OracleChatModel", text, len(self._answers))
            raise OracleError(msg)
        rule_id = fields.get("rule_id", "")
        holds = rule_id in gold
        if '"applicable"' in prompt:
            reason = "oracle: gold rule" if holds else "oracle: not a gold rule"
            return json.dumps({"applicable": holds, "reason": reason})
        return json.dumps({"verdict": "YES" if holds else "NO"})

    def _respond(self, messages: list[BaseMessage]) -> ChatResult:
        content = self.answer("\n".join(str(m.content) for m in messages))
        with self._lock:
            self._calls += 1
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content))])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._respond(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._respond(messages)


def oracle_judge(
    gold: Mapping[str, AbstractSet[str]],
    profile: RuleSchemaProfile = CONDITION_PROFILE,
    **judge_options: Any,
) -> ApplicabilityJudge:
    """An `ApplicabilityJudge` whose model is `OracleChatModel(gold=gold)`.

    Args:
        gold: Input text -> its gold rule ids.
        profile: The rule-schema profile whose prompts the oracle answers.
        **judge_options: Further `ApplicabilityJudge` fields (cache, on_error, ...).
    """
    return ApplicabilityJudge(
        llm=OracleChatModel(gold=gold), profile=profile, **judge_options
    )


class OracleDecisionModel(BaseDecisionModel):
    """An oracle decision model: P(yes) 1.0 iff the question's rule is gold.

    Answers `Noul` questions rendered by `render_decision_question` (what
    `DecisionJudge` asks): 1.0 when the rule is gold for the state, else 0.0. The
    state is the input text as judged, sent unescaped, so `gold` is keyed by the
    raw text. A state not in `gold`, or a question that is no TAG decision
    question (another type, instructions that are not a rendered rule), raises
    `OracleError`: never a silent NO. `calls` counts requests and `lookups`
    questions, under a lock, so it is safe to share across threads and tasks.

    The usage it reports is a count of what the request would send, never a
    measurement: the state once plus each question's instructions with its
    criteria appended, as `OpenAIClassifier` sends them
    (`decision_request_tokens`), counted by the estimates' tokenizer
    (`token_counter`); no output tokens, none cached, as the Decisions API bills.
    `CallCounter` counts its requests as oracle look-ups, not model calls.

    Args:
        gold: Input text, exactly as it is judged -> the ids of its gold rules.
    """

    model: str = ORACLE_PROVIDER
    gold: Mapping[str, AbstractSet[str]]

    _answers: dict[str, frozenset[str]] = PrivateAttr(default_factory=dict)
    _digest: str = PrivateAttr(default="")
    _count: Callable[[str], int] = PrivateAttr()
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _calls: int = PrivateAttr(default=0)
    _lookups: int = PrivateAttr(default=0)

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        self._answers = {text: frozenset(ids) for text, ids in self.gold.items()}
        self._digest = _gold_digest(self.gold)
        self._count = token_counter().count

    @property
    def _provider(self) -> str:
        # What `CallCounter` tells the oracle's requests from model calls by.
        return ORACLE_PROVIDER

    @property
    def identity_params(self) -> dict[str, Any]:
        """What `decision_identity` adds to verdict cache keys: the gold's digest.

        Oracles with other gold must not share cached verdicts.
        """
        return {"oracle": True, "gold_sha256": self._digest}

    @property
    def calls(self) -> int:
        """Requests answered so far."""
        with self._lock:
            return self._calls

    @property
    def lookups(self) -> int:
        """Questions answered so far."""
        with self._lock:
            return self._lookups

    def _asked(self, name: str, question: Question) -> tuple[Noul, str]:
        """The question and the id of the rule it asks about.

        Raises:
            OracleError: Not a TAG decision question.
        """
        if isinstance(question, Noul) and isinstance(question.instructions, str):
            fields = read_decision_question(question.instructions)
            if fields is not None:
                return question, fields.get("rule_id", "")
        msg = (
            "OracleDecisionModel only answers TAG decision questions (a Noul "
            f"rendered by render_decision_question); {name!r} is not one."
        )
        raise OracleError(msg)

    def _classify(
        self, state: State, questions: dict[str, Question]
    ) -> ClassifierResponse:
        if not isinstance(state, str):
            msg = (
                "OracleDecisionModel looks up text states only, not "
                f"{type(state).__name__}."
            )
            raise OracleError(msg)
        gold = self._answers.get(state)
        if gold is None:
            msg = _unknown_input("OracleDecisionModel", state, len(self._answers))
            raise OracleError(msg)
        asked = {name: self._asked(name, q) for name, q in questions.items()}
        answers = {
            name: 1.0 if rule_id in gold else 0.0
            for name, (_, rule_id) in asked.items()
        }
        tokens = decision_request_tokens(
            self._count, state, [question for question, _ in asked.values()]
        )
        with self._lock:
            self._calls += 1
            self._lookups += len(questions)
            number = self._calls
        return noul_response(
            self.model,
            answers,
            tokens,
            f"oracle-{number}",
        )

    async def _aclassify(
        self, state: State, questions: dict[str, Question]
    ) -> ClassifierResponse:
        # A look-up: no I/O, so no executor thread.
        return self._classify(state, questions)


def oracle_decision_judge(
    gold: Mapping[str, AbstractSet[str]],
    profile: RuleSchemaProfile = CONDITION_PROFILE,
    **options: Any,
) -> DecisionJudge:
    """A `DecisionJudge` whose model is `OracleDecisionModel(gold=gold)`.

    Args:
        gold: Input text -> its gold rule ids.
        profile: The rule-schema profile whose questions the oracle answers.
        **options: Further `DecisionJudge` fields (cache, questions_per_request,
            on_error, ...).
    """
    return DecisionJudge(
        model=OracleDecisionModel(gold=gold), profile=profile, **options
    )
