"""The chat model the `tag` commands run, from their options and the environment."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

ANTHROPIC_PREFIX: Final = "anthropic:"
"""A `--model` (or `$TAG_MODEL`) so prefixed names a `ChatAnthropic` model."""

ANTHROPIC_INSTALL_HINT: Final = 'pip install "langchain-tag[anthropic]"'


def model_from(args: argparse.Namespace) -> BaseChatModel:
    """The chat model `--model` and `--service-tier` name, from the environment.

    `anthropic:NAME` is Anthropic's model NAME (`ChatAnthropic` at temperature 0,
    from `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL`); any other name the default
    `ChatOpenAI`'s.

    Raises:
        CommandError: An Anthropic model with `--service-tier`, or without the
            `anthropic` extra.
    """
    from langchain_tag.models import default_chat_model  # noqa: PLC0415

    name = _name(args)
    if name.startswith(ANTHROPIC_PREFIX):
        return _anthropic_model(name.removeprefix(ANTHROPIC_PREFIX), args)
    settings = {
        name: value
        for name, value in (("model", args.model), ("service_tier", args.service_tier))
        if value is not None
    }
    return default_chat_model(**settings)


def _name(args: argparse.Namespace) -> str:
    return getattr(args, "model", None) or os.environ.get("TAG_MODEL") or ""


def batch_api(args: argparse.Namespace) -> str:
    """The batch endpoints `--via batch` calls for the model `args` name."""
    if _name(args).startswith(ANTHROPIC_PREFIX):
        return "Anthropic's /v1/messages/batches"
    return "OpenAI's /v1/files and /v1/batches"


def _anthropic_model(name: str, args: argparse.Namespace) -> BaseChatModel:
    from langchain_tag.errors import CommandError  # noqa: PLC0415

    if getattr(args, "service_tier", None) is not None:
        msg = "--service-tier is OpenAI's; leave it out with an anthropic: model."
        raise CommandError(msg)
    try:
        from langchain_anthropic import ChatAnthropic  # noqa: PLC0415 - optional
    except ImportError:
        msg = (
            f"an anthropic: model needs langchain-anthropic ({ANTHROPIC_INSTALL_HINT})"
        )
        raise CommandError(msg) from None
    return ChatAnthropic(model_name=name, temperature=0)  # type: ignore[call-arg]
