"""An agent with TAG for LangGraph Studio and Agent Chat UI: a PEP 8 code reviewer.

`create_agent` with `TAGMiddleware` over the PEP 8 rulebook shipped with the
package: each user message is judged against every rule once, and the agent's
model sees only the matched rules' actions. Set `TAG_AGENT_RULEBOOK` to a rulebook
file to use your own.

Models come from the environment (`OPENAI_API_KEY` / `OPENAI_BASE_URL`, `TAG_MODEL`).
Without them the graph is still served and drawn, and a run stops at its first
judgment with what to set; the server provides the checkpointer.
"""

import functools
import os
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from langgraph.graph.state import CompiledStateGraph

from langchain_tag.middleware import TAGMiddleware
from langchain_tag.models import default_chat_model, environment_configures_model
from langchain_tag.resources import curated_rulebook
from langchain_tag.rules import Rulebook

SYSTEM_PROMPT = (
    "You review Python code. Answer the user's message; when rules are given "
    "below, follow them."
)


class _NotConfigured(BaseChatModel):
    """Stands in for the environment's model until one is configured."""

    @property
    def _llm_type(self) -> str:
        return "not-configured"

    def _generate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        default_chat_model()  # raises ModelNotConfiguredError: what to set
        raise AssertionError  # pragma: no cover - a model is configured by now


def _build(model: BaseChatModel) -> CompiledStateGraph:  # type: ignore[type-arg]
    path = os.environ.get("TAG_AGENT_RULEBOOK")
    rulebook = Rulebook.load(path) if path else curated_rulebook("pep8")
    return create_agent(
        model,
        system_prompt=SYSTEM_PROMPT,
        middleware=[TAGMiddleware(rulebook=rulebook, llm=model)],
    )


@functools.cache
def _configured() -> CompiledStateGraph:  # type: ignore[type-arg]
    return _build(default_chat_model())


def graph() -> CompiledStateGraph:  # type: ignore[type-arg]
    """The agent: built once with the configured model (one engine across runs)."""
    if environment_configures_model():
        return _configured()
    return _build(_NotConfigured())
