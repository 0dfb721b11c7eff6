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
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr

from langchain_tag._delimiters import escape_delimiters
from langchain_tag.errors import TAGError
from langchain_tag.evaluation.usage import ORACLE_LLM_TYPE
from langchain_tag.matching import (
    CONDITION_PROFILE,
    ApplicabilityJudge,
    RuleSchemaProfile,
)
from langchain_tag.matching.prompts import read_judge_message

_SHOWN = 80
"""Characters of an unknown input quoted in the error."""


class OracleError(TAGError, LookupError):
    """The oracle was asked something the gold labels cannot answer."""


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
        canonical = json.dumps(
            sorted((text, sorted(ids)) for text, ids in self.gold.items())
        )
        self._digest = hashlib.sha256(canonical.encode()).hexdigest()

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
            shown = text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
            msg = (
                f"OracleChatModel has no gold labels for the input {shown!r} "
                f"({len(self._answers)} inputs known); key `gold` by the exact text "
                "that is judged."
            )
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
