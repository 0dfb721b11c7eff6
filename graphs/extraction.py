"""The TAG extraction graph for LangGraph Studio: documents in, verified rulebook out.

Models come from the environment (`OPENAI_API_KEY` / `OPENAI_BASE_URL`, `TAG_MODEL`);
the server provides the checkpointer.
"""

from langchain_tag.extraction import build_extraction_graph

graph = build_extraction_graph()
