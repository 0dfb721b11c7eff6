"""The TAG query graph for LangGraph Studio: match a query against a rulebook, execute.

Models come from the environment (`OPENAI_API_KEY` / `OPENAI_BASE_URL`, `TAG_MODEL`);
the server provides the checkpointer. A rulebook path in a run's input is opened only
inside `$TAG_RULEBOOK_DIR` (none unless set): clients send rulebooks as JSON.
"""

import os

from langchain_tag.query_graph import RULEBOOK_DIR_ENV, build_query_graph

graph = build_query_graph(rulebook_dir=os.environ.get(RULEBOOK_DIR_ENV) or None)
