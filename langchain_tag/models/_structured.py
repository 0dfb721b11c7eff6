"""Structured output, with a fallback to plain JSON for models without it."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel, ValidationError

from langchain_tag.usage import count_call

if TYPE_CHECKING:
    from langchain_core.runnables import Runnable, RunnableConfig

logger = logging.getLogger(__name__)

STRUCTURED_PARSE_ERRORS = (ValidationError, json.JSONDecodeError, OutputParserException)
"""What a structured-output call raises when the model answered in plain text."""


def _supports_structured_output(llm: BaseChatModel) -> bool:
    """Whether `llm`'s class implements structured output (or tool binding)."""
    cls = type(llm)
    return (
        cls.with_structured_output is not BaseChatModel.with_structured_output
        or cls.bind_tools is not BaseChatModel.bind_tools
    )


def structured_model(
    llm: BaseChatModel,
    schema: type[BaseModel],
    mode: Literal["auto", "always", "never"],
) -> Runnable[Any, Any] | None:
    """`llm` answering `schema` with the raw message (`include_raw`), or None.

    Args:
        llm: The model.
        schema: The answer's pydantic model.
        mode: `auto`: when the model's class implements structured output;
            `always`: required; `never`: None (the caller parses text).

    Raises:
        ValueError: `always`, and the model does not support structured output.
    """
    wanted = mode == "always" or (mode == "auto" and _supports_structured_output(llm))
    if not wanted:
        return None
    try:
        return llm.with_structured_output(schema, include_raw=True)
    except NotImplementedError:
        if mode == "always":
            msg = (
                f"{type(llm).__name__} does not support structured output; use "
                "structured_output='auto' or 'never'."
            )
            raise ValueError(msg) from None
    return None


_JSON_START = re.compile(r"\A\s*(?:```(?:json)?\s*)?[\[{]")


def _answer_in(error: BaseException) -> str | None:
    """The answer text a structured-output parse error carries, if it does."""
    if isinstance(error, json.JSONDecodeError):
        return error.doc
    if isinstance(error, OutputParserException):
        return error.llm_output
    if isinstance(error, ValidationError):
        # The OpenAI SDK parses the answer with pydantic: JSON that is not valid
        # comes back whole as the input of a `json_invalid` error.
        for detail in error.errors():
            if detail["type"] == "json_invalid" and isinstance(detail["input"], str):
                return detail["input"]
    return None


class StructuredFallback:
    """A model asked for structured answers, read from its text when it ignores that.

    The one structured-then-text path of the package's judges (the applicability
    judge, the NPOV grader). Under `auto`, a structured call is made when the
    model's class implements structured output. Some OpenAI-compatible servers
    ignore `response_format` and answer in prose, which the SDK's schema parsing
    refuses before the caller's lenient parser could read it: an answer that is
    not JSON at all switches this instance (and only it) to text calls, and that
    call is made again as a text call. An answer that is JSON but off the schema
    (a value not allowed, a truncated object) leaves structured output on: that one
    answer is handed back as text for the caller's lenient parser (or, when the
    SDK kept no text of it, asked again as text, once).

    Outputs are what the calls return: `{"raw", "parsed", "parsing_error"}` from a
    structured call (`include_raw`), the message from a text call.

    Args:
        llm: The model (the caller's configured copy).
        mode: `auto`, `always` (structured, never a fallback) or `never` (text).
        schemas: The answer schemas the caller asks for.
    """

    def __init__(
        self,
        llm: BaseChatModel,
        mode: Literal["auto", "always", "never"],
        schemas: Sequence[type[BaseModel]],
    ) -> None:
        """Build the structured runnables of `llm` for `schemas` (see `mode`)."""
        self.llm = llm
        self.mode = mode
        self._structured = {
            schema: structured_model(llm, schema, mode) for schema in schemas
        }
        self._ignored = False
        self._lock = threading.Lock()

    @property
    def ignores_structured_output(self) -> bool:
        """Whether the model was seen answering a structured request in prose."""
        return self._ignored

    def remember(self, other: StructuredFallback) -> None:
        """Take over what `other` (on the same model) learnt about the server."""
        if other.ignores_structured_output and self.mode == "auto":
            self._ignored = True

    def structured(self, schema: type[BaseModel]) -> Runnable[Any, Any] | None:
        """The structured runnable asked for `schema`, or None (text calls)."""
        return None if self._ignored else self._structured.get(schema)

    def invoke(
        self,
        messages: list[BaseMessage],
        config: RunnableConfig,
        schema: type[BaseModel],
    ) -> Any:
        """One call for an answer in `schema` (structured, or the text)."""
        runnable = self.structured(schema)
        if runnable is not None:
            try:
                return self._checked(runnable.invoke(messages, config))
            except STRUCTURED_PARSE_ERRORS as error:
                if (recovered := self._refused(error)) is not None:
                    return recovered
            count_call()  # asked again, as text
        return self.llm.invoke(messages, config)

    async def ainvoke(
        self,
        messages: list[BaseMessage],
        config: RunnableConfig,
        schema: type[BaseModel],
    ) -> Any:
        """Async `invoke`."""
        runnable = self.structured(schema)
        if runnable is not None:
            try:
                return self._checked(await runnable.ainvoke(messages, config))
            except STRUCTURED_PARSE_ERRORS as error:
                if (recovered := self._refused(error)) is not None:
                    return recovered
            count_call()  # asked again, as text
        return await self.llm.ainvoke(messages, config)

    def _checked(self, output: Any) -> Any:
        # A structured output whose answer could not be parsed: prose means the
        # server ignored the request (remembered); the caller reads the raw text.
        if isinstance(output, Mapping) and output.get("parsed") is None:
            raw = output.get("raw")
            if isinstance(raw, BaseMessage) and not _JSON_START.match(raw.text):
                self._ignores(raw.text)
        return output

    def _refused(self, error: Exception) -> AIMessage | None:
        """After the SDK refused an answer: the answer to read, or None (ask text).

        Raises:
            Exception: `error` again, unless `mode` is `auto`.
        """
        if self.mode != "auto":
            raise error
        text = _answer_in(error)
        if text is None:
            return None
        if _JSON_START.match(text):
            return AIMessage(text)
        self._ignores(text)
        return None

    def _ignores(self, answer: str) -> None:
        if self.mode != "auto":
            return
        with self._lock:
            first, self._ignored = not self._ignored, True
        if first:
            logger.warning(
                "%s answered a structured-output request in prose (%r); reading "
                "its answers with the text parser from now on.",
                type(self.llm).__name__,
                answer[:200],
            )
