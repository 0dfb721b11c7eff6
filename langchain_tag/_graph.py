"""Helpers of both graphs: their inputs as a LangGraph server passes them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from langchain_core.documents import Document

ContextT = TypeVar("ContextT")


def as_documents(items: Iterable[Document | Mapping[str, Any]]) -> list[Document]:
    """Documents as given in Python, or as the JSON a LangGraph server passes on."""
    return [
        item if isinstance(item, Document) else Document.model_validate(item)
        for item in items
    ]


def coerce_context(context: object, schema: type[ContextT]) -> ContextT:
    """A graph's run context as its dataclass.

    Python callers pass the dataclass, and LangGraph turns a dict (as a server
    passes the JSON a client sent) into it once per run; a dict that reaches a node
    another way has fields this version does not know ignored; no context means the
    defaults.
    """
    if isinstance(context, schema):
        return context
    if isinstance(context, Mapping):
        known = {f.name for f in fields(schema)}  # type: ignore[arg-type]
        return schema(**{k: v for k, v in context.items() if k in known})
    return schema()
