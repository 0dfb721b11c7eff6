"""A fake tool-calling chat model for agents (`langchain.agents.create_agent`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import PrivateAttr

from langchain_tag.testing.scripted import ScriptedFakeChatModel


class ToolLoopFakeChatModel(ScriptedFakeChatModel):
    """An agent model that calls a tool `tool_rounds` times, then answers.

    Deterministic and content-aware: after each human message it asks for the tool
    (`tool_name`, with the message's text as `query`) until `tool_rounds` tool
    results follow that message, then answers with the number of rounds and the
    system message's last line. Every call's messages are recorded, so a test can
    read what each model call of an agent was given (`system_prompts`); `latency`,
    faults and call counts are `ScriptedFakeChatModel`'s.
    """

    tool_name: str = "lookup"
    tool_rounds: int = 2

    _llm_name: ClassVar[str] = "tool-loop-fake"
    _identifying_fields: ClassVar[tuple[str, ...]] = ("tool_name", "tool_rounds")

    _received_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _received: list[list[BaseMessage]] = PrivateAttr(default_factory=list)

    @property
    def received(self) -> list[list[BaseMessage]]:
        """Each call's messages, in call order."""
        with self._received_lock:
            return [list(messages) for messages in self._received]

    @property
    def system_prompts(self) -> list[str | None]:
        """Each call's system message text (None when it had none)."""
        return [
            next((m.text for m in messages if isinstance(m, SystemMessage)), None)
            for messages in self.received
        ]

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The tools are known by name only: the model itself answers."""
        return self

    def _fault_key(self, prompt: str) -> str:
        return self.tool_name

    def _reply(self, messages: Sequence[BaseMessage], prompt: str) -> AIMessage:
        with self._received_lock:
            self._received.append(list(messages))
            number = len(self._received)
        last_human = max(
            (i for i, m in enumerate(messages) if isinstance(m, HumanMessage)),
            default=-1,
        )
        rounds = sum(isinstance(m, ToolMessage) for m in messages[last_human + 1 :])
        if rounds < self.tool_rounds:
            query = messages[last_human].text if last_human >= 0 else ""
            call = {"name": self.tool_name, "args": {"query": query}}
            return AIMessage("", tool_calls=[{**call, "id": f"call-{number}"}])
        system = next((m.text for m in messages if isinstance(m, SystemMessage)), "")
        last_line = system.splitlines()[-1] if system else ""
        return AIMessage(f"done after {rounds} tool call(s); {last_line}")
