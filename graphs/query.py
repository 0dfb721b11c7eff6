"""The TAG query graph for LangGraph Studio: match a query against a rulebook, execute.

Models come from the environment (`OPENAI_API_KEY` / `OPENAI_BASE_URL`, `TAG_MODEL`);
the server provides the checkpointer.
"""

from langchain_tag.query_graph import build_query_graph

graph = build_query_graph()
