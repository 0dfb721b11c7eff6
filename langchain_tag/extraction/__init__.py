"""Stage 1: extract a verified rulebook from instruction documents.

Five phases, in order: normative spans -> atomic units -> operational rules ->
duplicates and conflicts -> programmatic verification.

- `graph`: the phases as a LangGraph graph (`build_extraction_graph`).
- `run`: `extract_rules` / `aextract_rules`, the graph run to completion under a
  checkpointer and a durable store of the model's answers (resumable).
- `prompts`, `phases`: what phases 1-4 ask and how their answers are read.
- `sectioning`: documents split into sections; `verification`: phase 5.
- `report`: `ExtractionReport`, what each phase kept, dropped and cost.
"""

from langchain_tag.extraction.graph import (
    ExtractionInput,
    ExtractionSettings,
    build_extraction_graph,
)
from langchain_tag.extraction.report import ExtractionReport, PhaseReport
from langchain_tag.extraction.run import (
    DEFAULT_CHECKPOINT,
    aextract_rules,
    extract_rules,
    run_id_for,
)

__all__ = [
    "DEFAULT_CHECKPOINT",
    "ExtractionInput",
    "ExtractionReport",
    "ExtractionSettings",
    "PhaseReport",
    "aextract_rules",
    "build_extraction_graph",
    "extract_rules",
    "run_id_for",
]
