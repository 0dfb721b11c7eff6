"""Stage 2: pairwise applicability matching.

One judgment per (input, rule), the rule's action withheld from the judge.

- `judge`: `ApplicabilityJudge` (one model call per pair), `Verdict`, the errors,
  and `BaseJudge`, which owns the concurrency-bounded fan-out over many rules.
- `cascade`: `CascadeJudge`, a cheap judge first and a strong one where unsure.
- `profiles`: what the judge sees of a rule and how it answers (`NBA_PROFILE`, ...).
- `prompts`, `parsing`: the judge's messages, and reading its answers.
- `limiter`: one bound on judgments in flight, across threads and event loops.
- `prefilters`, `store`: shortlists by similarity (BM25, dense, hybrid, a Chroma
  rule store) before judging; import them from their modules (they load numpy,
  rank-bm25 and chromadb).
- `verdict_log`, `learned`, `shadow`: the judge's verdicts logged (SQLite or
  PostgreSQL), a prefilter learned from them (`LearnedPrefilter`), and shadow
  judging of the pairs it skips, which keeps its recall measured.
"""

from langchain_tag.matching.cascade import CascadeJudge, CascadeStats
from langchain_tag.matching.judge import (
    ApplicabilityJudge,
    BaseJudge,
    JudgmentError,
    UnreliableMatchWarning,
    Verdict,
)
from langchain_tag.matching.profiles import (
    CONDITION_PROFILE,
    NBA_PROFILE,
    RuleSchemaProfile,
    constraint_profile,
)

__all__ = [
    "CONDITION_PROFILE",
    "NBA_PROFILE",
    "ApplicabilityJudge",
    "BaseJudge",
    "CascadeJudge",
    "CascadeStats",
    "JudgmentError",
    "RuleSchemaProfile",
    "UnreliableMatchWarning",
    "Verdict",
    "constraint_profile",
]
