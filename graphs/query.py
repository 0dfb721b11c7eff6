"""The TAG query graph for LangGraph Studio: match a query against a rulebook, execute.

Models come from the environment (`OPENAI_API_KEY` / `OPENAI_BASE_URL`, `TAG_MODEL`);
the server provides the checkpointer. A rulebook path in a run's input is opened only
inside `$TAG_RULEBOOK_DIR` (none unless set): clients send rulebooks as JSON.

`graph` is a factory returning `compiled`, so that a run's context is checked as the
client sent it: the server drops keys missing from the context schema before the
graph sees them, and a misspelt option (`{"filtr": ...}`) would otherwise be a
silent default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from langgraph.graph.state import CompiledStateGraph
from langgraph_sdk.runtime import ServerRuntime

from langchain_tag.query_graph import (
    RULEBOOK_DIR_ENV,
    build_query_graph,
    check_context_keys,
)

compiled = build_query_graph(rulebook_dir=os.environ.get(RULEBOOK_DIR_ENV) or None)


def graph(runtime: ServerRuntime[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The query graph; for a run, its context's keys are checked first.

    Raises:
        ValueError: The run's context has keys the graph does not know.
    """
    execution = runtime.execution_runtime
    if execution is not None and isinstance(execution.context, Mapping):
        check_context_keys(execution.context)
    return compiled
