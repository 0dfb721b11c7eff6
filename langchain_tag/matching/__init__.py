"""Stage 2: pairwise applicability matching.

One judgment per (input, rule), the rule's action withheld from the judge.

- `judge`: `ApplicabilityJudge` (one model call per pair) and `BaseJudge`, which
  owns the concurrency-bounded fan-out over many rules (run by `_fanout`).
- `verdicts`: `Verdict`, `JudgmentError`, `VerdictSink`, `UnreliableMatchWarning`.
- `batched`: several rules judged in one call (`rules_per_call > 1`).
- `decision`: `DecisionJudge`, a decision model (`BaseDecisionModel`) answering one
  `Noul` per rule, many rules per request.
- `memory`: `VerdictMemory`, the cache read once per query and the verdict log,
  around every backend.
- `cascade`: `CascadeJudge`, a cheap judge first and a strong one where unsure.
- `profiles`: what the judge sees of a rule and how it answers (`NBA_PROFILE`, ...),
  and the profile of a rule schema or a rulebook (`schema_profile`, `profile_for`).
- `prompts`, `parsing`: the judge's messages, and reading its answers.
- `limiter`: one bound on judgments in flight, across threads and event loops.
- `prefilters`, `store`: shortlists by similarity (BM25, dense, hybrid, a Chroma
  rule store) before judging; import them from their modules (they load numpy,
  rank-bm25 and chromadb).
- The judge's verdicts logged, a prefilter learned from them and shadow judging of
  the pairs it skips are the learning loop: `langchain_tag.learning`.
"""

from langchain_tag.errors import JudgmentError, UnreliableMatchWarning
from langchain_tag.matching.cascade import CascadeJudge, CascadeStats
from langchain_tag.matching.decision import DecisionJudge
from langchain_tag.matching.judge import ApplicabilityJudge, BaseJudge
from langchain_tag.matching.profiles import (
    CONDITION_PROFILE,
    NBA_PROFILE,
    RuleSchemaProfile,
    constraint_profile,
    profile_for,
    schema_profile,
)
from langchain_tag.matching.verdicts import Verdict, VerdictSink

__all__ = [
    "CONDITION_PROFILE",
    "NBA_PROFILE",
    "ApplicabilityJudge",
    "BaseJudge",
    "CascadeJudge",
    "CascadeStats",
    "DecisionJudge",
    "JudgmentError",
    "RuleSchemaProfile",
    "UnreliableMatchWarning",
    "Verdict",
    "VerdictSink",
    "constraint_profile",
    "profile_for",
    "schema_profile",
]
