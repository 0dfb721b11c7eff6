"""The learning loop: the judge's verdicts teach a prefilter to skip rules.

Every judgment TAG makes is a labelled example (input, rule, applies). The loop:

1. **Log** (`verdict_log`): the judge appends each judgment it makes to a
   `VerdictLog` (`SQLiteVerdictLog` on one machine, `PostgresVerdictLog` across
   several). The log is a side channel: a write that fails warns once and keeps
   the records in memory until the next write succeeds; a retrieval never fails
   because of it.
2. **Learn** (`learned_prefilter`): a `LearnedPrefilter` is trained on the log's
   examples (`VerdictLog.examples(rulebook)`), per rule, and skips the rules it
   predicts the judge would answer NO for, at a target recall of the YES verdicts.
   A rule it does not know (new, or edited since training) is always judged.
3. **Shadow judging** (`shadow`): a small share (`explore`) of the skipped pairs is
   judged anyway (`explore_pairs`), so labels keep flowing for skipped rules and
   the prefilter's recall is estimated live (`estimate_recall`); `ShadowJudging`
   holds one engine's state of it.
   Shadow judging also records the pairs it skipped in the log (skip records,
   not verdicts).
4. **Retrain** (`retraining`): once `every` new verdicts are logged
   (`RetrainPolicy`), a `Retrainer` trains the prefilter again from the log in a
   background thread; the prefilter serves its old model until the new one is
   installed.
5. **Keep the promise** (`promise`): each retraining counts the skipped pairs
   nobody judged as fractional YES, and aims at the internal target a miss-budget
   controller (`MissBudget`) sets from the log, so that the stream's recall
   keeps `target_recall`.

Data flows down: this package uses `langchain_tag.rules` and
`langchain_tag.matching` (the verdicts), never the retriever or the engine. The
prefilter and the log need numpy (and scikit-learn, the `learned` extra, to
train); `shadow` and `retraining` do not.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from langchain_tag.learning.promise import MissBudget
from langchain_tag.learning.retraining import Retrainer, RetrainPolicy
from langchain_tag.learning.shadow import (
    RecallEstimate,
    ShadowJudging,
    estimate_recall,
    explore_pairs,
)

if TYPE_CHECKING:
    from langchain_tag.learning.learned_prefilter import (
        FeatureHashing,
        FitReport,
        LabelledExample,
        LearnedPrefilter,
        Selection,
    )
    from langchain_tag.learning.verdict_log import (
        PostgresVerdictLog,
        Retention,
        SQLiteVerdictLog,
        VerdictLog,
        VerdictLogStats,
        VerdictLogWarning,
        VerdictRecord,
        open_verdict_log,
    )


def __getattr__(name: str) -> Any:
    # The prefilter's and the log's names are imported on first use: they load
    # numpy (and the log SQLite), which shadow judging and retraining need not.
    if name in __all__:
        for module in ("learned_prefilter", "verdict_log"):
            loaded = import_module(f"{__name__}.{module}")
            if name in loaded.__all__:
                return getattr(loaded, name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "FeatureHashing",
    "FitReport",
    "LabelledExample",
    "LearnedPrefilter",
    "MissBudget",
    "PostgresVerdictLog",
    "RecallEstimate",
    "Retention",
    "RetrainPolicy",
    "Retrainer",
    "SQLiteVerdictLog",
    "Selection",
    "ShadowJudging",
    "VerdictLog",
    "VerdictLogStats",
    "VerdictLogWarning",
    "VerdictRecord",
    "estimate_recall",
    "explore_pairs",
    "open_verdict_log",
]
