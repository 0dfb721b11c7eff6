"""Chat models: the default one from the environment, settings, identity, retries.

Any LangChain `BaseChatModel` works everywhere in langchain-tag; `default_chat_model`
is only what is used when none is passed. One module per concern: `_environment`
(the default model and its settings), `_retry` (which errors are transient, and
`CallRetry`), `_identity` (what names a model in cache keys) and `_structured`
(structured output, with a JSON fallback).
"""

from langchain_tag.models._environment import (
    FLEX_TIMEOUT,
    ConfiguredModel,
    configured_model,
    default_chat_model,
    environment_configures_model,
    with_settings,
)
from langchain_tag.models._identity import model_identity, model_label, without_password
from langchain_tag.models._retry import (
    ONE_ATTEMPT,
    CallRetry,
    is_capacity_shortage,
    is_rate_limit,
)
from langchain_tag.models._structured import (
    STRUCTURED_PARSE_ERRORS,
    StructuredFallback,
)

__all__ = [
    "FLEX_TIMEOUT",
    "ONE_ATTEMPT",
    "STRUCTURED_PARSE_ERRORS",
    "CallRetry",
    "ConfiguredModel",
    "StructuredFallback",
    "configured_model",
    "default_chat_model",
    "environment_configures_model",
    "is_capacity_shortage",
    "is_rate_limit",
    "model_identity",
    "model_label",
    "with_settings",
    "without_password",
]
