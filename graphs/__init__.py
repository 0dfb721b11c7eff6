"""LangGraph Studio entry points (see langgraph.json)."""
