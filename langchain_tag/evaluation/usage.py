"""Counting an evaluation's model calls, telling the oracle's look-ups apart.

`CallCounter` is `langchain_tag.usage.UsageCounter` (calls and the tokens they
report, cached input tokens included) that also counts the evaluation oracle's
answers (`OracleChatModel`) apart: they are look-ups in the gold labels, not
model calls, and cost no tokens.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

from langchain_tag.usage import TokenUsage, UsageCounter

__all__ = ["ORACLE_LLM_TYPE", "CallCounter"]

ORACLE_LLM_TYPE = "tag-oracle"
"""The `_llm_type` of `OracleChatModel`, which answers from the gold labels."""


class CallCounter(UsageCounter):
    """`UsageCounter` that also counts the oracle's look-ups apart.

    Fakes and some local servers report no usage: then `reported` is False, and
    `usage` says the tokens are unknown rather than 0. `calls` counts the
    oracle's answers too (a judge model would make as many calls);
    `oracle_calls` says how many of them were the oracle's, and `usage` counts
    only the calls that reached a model.
    """

    def __init__(self) -> None:
        """Start from zero."""
        super().__init__()
        self.oracle_calls = 0

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        **kwargs: Any,
    ) -> None:
        """Count a chat model call, or an oracle look-up."""
        super().on_chat_model_start(serialized, messages, **kwargs)
        if _is_oracle(kwargs):
            with self._lock:
                self.oracle_calls += 1

    @property
    def model_calls(self) -> int:
        """Calls that reached a model: `calls` without the oracle's look-ups."""
        return self.calls - self.oracle_calls

    @property
    def usage(self) -> TokenUsage:
        """The model calls and their tokens (unknown if none reported them)."""
        with self._lock:
            return TokenUsage.from_metadata(
                list(self.usage_metadata.values()), calls=self.model_calls
            )

    @property
    def input_tokens(self) -> int:
        """Input tokens reported, over all models (0 if none reported)."""
        return self.usage.input_tokens or 0

    @property
    def output_tokens(self) -> int:
        """Output tokens reported, over all models (0 if none reported)."""
        return self.usage.output_tokens or 0


def _is_oracle(event: dict[str, Any]) -> bool:
    """Whether a chat model start event is the oracle's (by its `_llm_type`)."""
    params = event.get("invocation_params") or {}
    return params.get("_type") == ORACLE_LLM_TYPE
