"""Stage 3: action-only execution.

- `executor`: `ActionOnlyExecutor`, the task done with the matched actions only.
- `templates`: `ExecutionTemplate` and the built-in tasks (generic, NPOV, code, NBA),
  their output parsers, and `format_actions`.
- `prompts`: what the executor is told.
"""

from langchain_tag.execution.executor import ActionOnlyExecutor
from langchain_tag.execution.templates import (
    CODE_TEMPLATE,
    GENERIC_TEMPLATE,
    NBA_TEMPLATE,
    NPOV_TEMPLATE,
    ExecutionTemplate,
    NBAVerdict,
    NPOVResult,
    format_actions,
)

__all__ = [
    "CODE_TEMPLATE",
    "GENERIC_TEMPLATE",
    "NBA_TEMPLATE",
    "NPOV_TEMPLATE",
    "ActionOnlyExecutor",
    "ExecutionTemplate",
    "NBAVerdict",
    "NPOVResult",
    "format_actions",
]
