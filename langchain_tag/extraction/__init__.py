"""Stage 1: extract a verified rulebook from instruction documents.

Five phases, in order: normative spans -> atomic units -> operational rules ->
duplicates and conflicts -> programmatic verification.

- `graph`: the phases as a LangGraph graph (`build_extraction_graph`).
- `run`: `extract_rules` / `aextract_rules`, the graph run to completion under a
  checkpointer and a durable store of the model's answers (resumable).
- `prompts`, `phases`: what phases 1-4 ask and how their answers are read.
- `sectioning`: documents split into sections; `verification`: phase 5.
- `report`: `ExtractionReport`, what each phase kept, dropped and cost.
- `pairs`: which rules phase 4 compares, at most `max_pairs` pairs (the most
  similar when there are more).
- `estimate`: `estimate_extraction`, the calls and tokens of a run before any call.
"""

from langchain_tag.extraction.estimate import (
    ExtractionEstimate,
    estimate_extraction,
)
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
)

__all__ = [
    "DEFAULT_CHECKPOINT",
    "ExtractionEstimate",
    "ExtractionInput",
    "ExtractionReport",
    "ExtractionSettings",
    "PhaseReport",
    "aextract_rules",
    "build_extraction_graph",
    "estimate_extraction",
    "extract_rules",
]
