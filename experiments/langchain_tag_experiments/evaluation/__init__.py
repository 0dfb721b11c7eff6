"""Evaluation: tasks, methods, a runner that scores them with their cost, reports.

- `datasets`: RuleArena-NBA, ObliQA, HumanEval and the WNC pairs from the shared
  data directory, and a user's labelled inputs (`load_labelled`).
- `tasks`: each task's inputs, what methods retrieve from, and its quality metrics.
- `methods`: the methods compared (no retrieval ... TAG ... the oracle), as data.
- `runner`: `aevaluate` runs methods over a task into `EvalResult` rows.
- `report`: the results as Markdown, CSV and JSON, and a cost-quality plot.
- `metrics`: rule-selection precision/recall/F1, Recall@k, MAP@k, ROC-AUC, and the
  prefilter size that keeps a share of the gold.
- `oracle`: `OracleChatModel`, a judge that answers from gold labels (upper bounds).
- `diagnostic`: how well similarity predicts applicability on a labelled set.
- `humaneval`: run HumanEval checks in a subprocess and score code with pylint.
- `embedding_cache`: embeddings shared by a run's methods, kept across runs.
- `usage`: `CallCounter`, model calls and reported tokens.
- `npov`: NPOV rewriting's LLM-free metrics and the VFR judge.
- `estimate`: what a run would cost (calls, tokens, dollars), calling no model.
- `suites`: the phase ablations, one extraction per skipped phase.

Importing this package loads none of `tasks`, `methods`, `runner`, `report`,
`npov`, `estimate`, `suites` or `diagnostic` (the executor, the baselines, the
prefilter's numpy and rank-bm25);
`from langchain_tag_experiments.evaluation import mismatch_diagnostic` loads the
diagnostic on first use.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from langchain_tag_experiments.evaluation.datasets import (
    DataNotFoundError,
    DatasetError,
    HumanEvalProblem,
    NBADataset,
    NBAProblem,
    ObliQADataset,
    ObliQAPassage,
    ObliQAQuestion,
    load_humaneval,
    load_nba,
    load_obliqa,
    obliqa_document_key,
    pep8_path,
)
from langchain_tag_experiments.evaluation.humaneval import (
    CheckResult,
    apylint_score,
    arun_check,
    check_program,
    extract_code,
    pylint_score,
    run_check,
)
from langchain_tag_experiments.evaluation.metrics import (
    AggregateScores,
    SelectionScores,
    aggregate,
    average_precision_at_k,
    n_for_recall,
    recall_at_k,
    roc_auc,
    selection_scores,
)
from langchain_tag_experiments.evaluation.oracle import (
    OracleChatModel,
    OracleError,
    oracle_judge,
)

if TYPE_CHECKING:
    from langchain_tag_experiments.evaluation.diagnostic import (
        MismatchReport,
        mismatch_diagnostic,
    )

_LAZY = {
    "MismatchReport": "langchain_tag_experiments.evaluation.diagnostic",
    "mismatch_diagnostic": "langchain_tag_experiments.evaluation.diagnostic",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    msg = f"module 'langchain_tag_experiments.evaluation' has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "AggregateScores",
    "CheckResult",
    "DataNotFoundError",
    "DatasetError",
    "HumanEvalProblem",
    "MismatchReport",
    "NBADataset",
    "NBAProblem",
    "ObliQADataset",
    "ObliQAPassage",
    "ObliQAQuestion",
    "OracleChatModel",
    "OracleError",
    "SelectionScores",
    "aggregate",
    "apylint_score",
    "arun_check",
    "average_precision_at_k",
    "check_program",
    "extract_code",
    "load_humaneval",
    "load_nba",
    "load_obliqa",
    "mismatch_diagnostic",
    "n_for_recall",
    "obliqa_document_key",
    "oracle_judge",
    "pep8_path",
    "pylint_score",
    "recall_at_k",
    "roc_auc",
    "run_check",
    "selection_scores",
]
