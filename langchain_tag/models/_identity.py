"""A model's identity (for cache keys) and its label, without passwords."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from langchain_core.language_models import BaseChatModel

if TYPE_CHECKING:
    pass

_ENDPOINT_FIELDS = ("openai_api_base", "base_url", "api_base", "endpoint_url", "host")
_ENDPOINT = "endpoint:"
"""How `model_identity` marks the endpoint fields among a model's settings."""
_NOT_IDENTITY = ("service_tier",)
"""Settings that change what a call costs and how long it takes, not its answer."""
_NAME_FIELDS = ("model", "model_name", "model_id", "deployment_name", "repo_id")
"""Settings that name the model, in the order `model_label` looks for one."""
_URL_PASSWORD = re.compile(r"://([^:/@]*):.*@")
"""Up to the last "@": a password may hold one unencoded (`tag:s3cr@t@db`)."""
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)\S+")


def model_identity(llm: BaseChatModel) -> str:
    """A string naming the model, its settings and its endpoint, for cache keys.

    `module.Class:{settings as JSON}`; `model_label` shortens it for display. The
    endpoint matters: two OpenAI-compatible servers may serve different models
    under one name, and `_identifying_params` leaves the address out. The service
    tier does not (`flex` or not, the same model answers): a verdict judged on one
    tier is found on the others.
    """
    params = dict(llm._identifying_params)  # noqa: SLF001 - the public-facing identity
    for name in _NOT_IDENTITY:
        params.pop(name, None)
    for name in _ENDPOINT_FIELDS:
        value = getattr(llm, name, None)
        if isinstance(value, str) and value:
            params[f"{_ENDPOINT}{name}"] = value
    return f"{type(llm).__module__}.{type(llm).__qualname__}:" + json.dumps(
        params, sort_keys=True, default=str
    )


def model_label(identity: str) -> str:
    """A model's identity (`model_identity`) as a short label: `name @ endpoint`.

    The identity is the model's class and every setting, as JSON: too long for a
    line. The name is the model's setting that names it, else its class; the
    endpoint is shown without the password its URL may carry. Anything else (a
    name a caller logged) is returned as it is.
    """
    kind, _, settings = identity.partition(":")
    try:
        params = json.loads(settings)
    except ValueError:
        return identity
    if not isinstance(params, dict):
        return identity
    name = next(
        (str(params[key]) for key in _NAME_FIELDS if params.get(key)),
        kind.rsplit(".", 1)[-1],
    )
    endpoint = next(
        (str(v) for k, v in sorted(params.items()) if k.startswith(_ENDPOINT) and v),
        None,
    )
    return name if endpoint is None else f"{name} @ {without_password(endpoint)}"


def without_password(url: str) -> str:
    """`url` with the password it may carry as ***, for messages.

    Both forms: a URL's (`scheme://user:password@host`) and a libpq connection
    string's (`host=db password=secret`).
    """
    return _KEYWORD_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"://\1:***@", url))
