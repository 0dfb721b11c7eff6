"""Stage 3: action-only execution.

The executor carries out the task on the input with the matched rules' actions as its
only guidance (principle P3): the prompt holds the input and one `[rule_id] action`
line per rule, never a rule's name, condition, source text or tags. What the task
asks and what the answer looks like is an `ExecutionTemplate` (see `templates`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
)
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig, RunnableSerializable
from pydantic import ConfigDict, PrivateAttr
from typing_extensions import TypedDict

from langchain_tag.execution.templates import (
    GENERIC_TEMPLATE,
    ExecutionTemplate,
    format_actions,
)
from langchain_tag.models import with_settings
from langchain_tag.rules import Rule

# --- The executor ---------------------------------------------------------------------


class ExecutionInput(TypedDict):
    """The executor's input: the task input and the matched rules."""

    input: str
    rules: Sequence[Document | Rule]


class ActionOnlyExecutor(RunnableSerializable[ExecutionInput, Any]):
    """A Runnable that performs the task given only the matched rules' actions.

    One model call per input, at temperature 0 unless told otherwise. The prompt
    holds the input and one `[rule_id] action` line per rule (see `format_actions`);
    the output is whatever the template's parser returns (`str`, `NPOVResult`,
    `NBAVerdict`, ...). A malformed answer raises `OutputParserException`.

    Example:
        ```python
        from langchain_core.runnables import RunnablePassthrough
        from langchain_tag import TAGRetriever
        from langchain_tag.execution import NPOV_TEMPLATE, ActionOnlyExecutor

        retriever = TAGRetriever.from_rulebook("npov.rulebook.json", llm=llm)
        executor = ActionOnlyExecutor(llm=llm, template=NPOV_TEMPLATE)
        chain = {"input": RunnablePassthrough(), "rules": retriever} | executor
        chain.invoke("The brilliant senator gave a speech.")
        # NPOVResult(applied_rules=['NPOV-017'], reasoning='...', rewrite='...')
        ```

    Chunk mode (a similarity retriever in place of `TAGRetriever`) uses the same
    prompt with the passages numbered in the guidance slot.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: BaseChatModel
    """The chat model that executes."""
    template: ExecutionTemplate = GENERIC_TEMPLATE
    """The task's prompts and output parser."""
    temperature: float | None = 0.0
    """Set on a copy of the model when it has a `temperature` field; None leaves it."""

    _model: BaseChatModel = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        self._model, _ = with_settings(self.llm, temperature=self.temperature)

    @property
    def configured_llm(self) -> BaseChatModel:
        """The model as each call uses it (`temperature` set on a copy of `llm`)."""
        return self._model

    def messages(
        self, text: str, rules: Sequence[Document | Rule]
    ) -> list[BaseMessage]:
        """The exact messages sent for `text` and `rules` (actions only)."""
        return self.template.messages(text, format_actions(rules))

    def _execute(
        self,
        request: ExecutionInput,
        run_manager: CallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Any:
        text, rules = _unpack(request)
        message = self._model.invoke(self.messages(text, rules), config)
        return self.template.output_parser.invoke(message, config)

    async def _aexecute(
        self,
        request: ExecutionInput,
        run_manager: AsyncCallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Any:
        text, rules = _unpack(request)
        message = await self._model.ainvoke(self.messages(text, rules), config)
        return await self.template.output_parser.ainvoke(message, config)

    def invoke(
        self, input: ExecutionInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        """Execute the task on `input["input"]` with the actions of `input["rules"]`."""
        return self._call_with_config(self._execute, input, config, **kwargs)

    async def ainvoke(
        self, input: ExecutionInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        """Execute the task, asynchronously."""
        return await self._acall_with_config(self._aexecute, input, config, **kwargs)


def _unpack(request: Mapping[str, Any]) -> tuple[str, Sequence[Document | Rule]]:
    if not isinstance(request, Mapping) or not {"input", "rules"} <= request.keys():
        got = (
            sorted(map(str, request.keys()))
            if isinstance(request, Mapping)
            else type(request).__name__
        )
        msg = (
            'ActionOnlyExecutor takes {"input": str, "rules": [Document | Rule, ...]}, '
            f"got {got}. In a chain: "
            '{"input": RunnablePassthrough(), "rules": retriever} | executor.'
        )
        raise TypeError(msg)
    text, rules = request["input"], request["rules"]
    if not isinstance(text, str):
        msg = f'ActionOnlyExecutor: "input" must be a str, not {type(text).__name__}.'
        raise TypeError(msg)
    if isinstance(rules, str) or not isinstance(rules, Sequence):
        msg = (
            'ActionOnlyExecutor: "rules" must be a sequence of Documents or Rules, '
            f"not {type(rules).__name__}."
        )
        raise TypeError(msg)
    return text, rules
