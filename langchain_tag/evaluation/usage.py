"""Counting model calls and the tokens they report, for cost columns and the demo.

Tokens are LangChain's `UsageMetadataCallbackHandler`'s (summed per model name);
this only adds the calls, counted whether or not a model reports usage. Calls to
the evaluation oracle (`OracleChatModel`) are counted apart as well: they are
look-ups in the gold labels, not model calls.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import UsageMetadataCallbackHandler
from langchain_core.messages import BaseMessage

__all__ = ["ORACLE_LLM_TYPE", "CallCounter"]

ORACLE_LLM_TYPE = "tag-oracle"
"""The `_llm_type` of `OracleChatModel`, which answers from the gold labels."""


class CallCounter(UsageMetadataCallbackHandler):
    """`UsageMetadataCallbackHandler` that also counts the model calls.

    Fakes and some local servers report no usage: then `reported` is False, and a
    cost table should show the tokens as unknown rather than as 0. `calls` counts
    the oracle's answers too (a judge model would make as many calls);
    `oracle_calls` says how many of them were the oracle's.
    """

    # Counting is an addition under the handler's lock: no worker thread per event.
    run_inline = True

    def __init__(self) -> None:
        """Start from zero."""
        super().__init__()
        self.calls = 0
        self.oracle_calls = 0

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        **kwargs: Any,
    ) -> None:
        """Count a chat model call, or an oracle look-up."""
        oracle = _is_oracle(kwargs)
        with self._lock:
            self.calls += 1
            self.oracle_calls += int(oracle)

    def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], **kwargs: Any
    ) -> None:
        """Count a completion model call."""
        with self._lock:
            self.calls += 1

    @property
    def model_calls(self) -> int:
        """Calls that reached a model: `calls` without the oracle's look-ups."""
        return self.calls - self.oracle_calls

    @property
    def reported(self) -> bool:
        """Whether any call reported its usage."""
        return bool(self.usage_metadata)

    @property
    def input_tokens(self) -> int:
        """Input tokens reported, over all models."""
        return sum(u["input_tokens"] for u in self.usage_metadata.values())

    @property
    def output_tokens(self) -> int:
        """Output tokens reported, over all models."""
        return sum(u["output_tokens"] for u in self.usage_metadata.values())


def _is_oracle(event: dict[str, Any]) -> bool:
    """Whether a chat model start event is the oracle's (by its `_llm_type`)."""
    params = event.get("invocation_params") or {}
    return params.get("_type") == ORACLE_LLM_TYPE
