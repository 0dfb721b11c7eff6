"""The chat model the `tag` commands run, from their options and the environment."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel


def model_from(args: argparse.Namespace) -> BaseChatModel:
    """The chat model `--model` and `--service-tier` name, from the environment."""
    from langchain_tag.models import default_chat_model  # noqa: PLC0415

    settings = {
        name: value
        for name, value in (("model", args.model), ("service_tier", args.service_tier))
        if value is not None
    }
    return default_chat_model(**settings)
