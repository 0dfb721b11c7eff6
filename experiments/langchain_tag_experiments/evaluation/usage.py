"""Counting an evaluation's model calls, telling the oracle's look-ups apart.

`CallCounter` is `langchain_tag.usage.UsageCounter` (calls and the tokens they
report, cached input tokens included) that also counts the evaluation oracle's
answers apart: `OracleChatModel`'s and `OracleDecisionModel`'s requests are
look-ups in the gold labels, not model calls. The chat oracle reports no tokens;
the decision oracle reports what its requests would send a decision model
(`decision_request_tokens`), so its rows show what a decision request costs.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

from langchain_tag.usage import (
    TokenUsage,
    UsageCounter,
    decision_request_tokens,
    sent_instructions,
)

__all__ = [
    "ORACLE_LLM_TYPE",
    "ORACLE_PROVIDER",
    "CallCounter",
    "decision_request_tokens",
    "sent_instructions",
]

ORACLE_LLM_TYPE = "tag-oracle"
"""The `_llm_type` of `OracleChatModel`, which answers from the gold labels."""

ORACLE_PROVIDER = "oracle"
"""The `_provider` of `OracleDecisionModel` (its runs' `ls_provider` metadata)."""


class CallCounter(UsageCounter):
    """`UsageCounter` that also counts the oracle's look-ups apart.

    Fakes and some local servers report no usage: then `reported` is False, and
    `usage` says the tokens are unknown rather than 0. `calls` counts the
    oracle's answers too (a judge model would make as many calls);
    `oracle_calls` says how many of them were the oracle's (a chat oracle's
    judgments, a decision oracle's requests), and `usage` counts only the calls
    that reached a model, with the tokens reported: the decision oracle's are
    counted ones, what its requests would send.
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

    def on_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, **kwargs: Any
    ) -> None:
        """Count a decision model's request, or the decision oracle's."""
        super().on_chain_start(serialized, inputs, **kwargs)
        if kwargs.get("run_type") == "llm" and _is_decision_oracle(kwargs):
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


def _is_decision_oracle(event: dict[str, Any]) -> bool:
    """Whether a decision model's run is the oracle's (by its `ls_provider`)."""
    metadata = event.get("metadata") or {}
    return metadata.get("ls_provider") == ORACLE_PROVIDER


# --- What a decision request sends --------------------------------------------------
