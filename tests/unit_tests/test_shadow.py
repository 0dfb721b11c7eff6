"""Shadow judging: explored pairs, the recall estimate, and `ShadowJudging`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from langchain_tag import Rule, Rulebook
from langchain_tag.learning.learned_prefilter import LabelledExample, LearnedPrefilter
from langchain_tag.learning.shadow import ShadowJudging, estimate_recall, explore_pairs
from langchain_tag.learning.verdict_log import SQLiteVerdictLog
from langchain_tag.matching import Verdict
from langchain_tag.testing import trigger_rulebook

RULES = trigger_rulebook(8)
RULE_IDS = [rule.rule_id for rule in RULES.rules]
FILLER = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota")
# Names no rule's trigger: every rule the prefilter models is skipped for it.
QUIET = "alpha beta gamma delta epsilon zeta eta theta iota"


def examples(n: int, seed: int) -> list[LabelledExample]:
    """The fake judge's verdicts on every rule for `n` inputs (R-007 never applies)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        triggered = rng.choice(7, size=rng.choice([0, 1, 1, 2]), replace=False)
        words = [*rng.choice(FILLER, size=12), *(f"trigger-{t:03d}" for t in triggered)]
        rng.shuffle(words)
        text = " ".join(words)
        gold = {f"R-{t:03d}" for t in triggered}
        out += [LabelledExample(text, r, r in gold) for r in RULE_IDS]
    return out


@pytest.fixture(scope="module")
def trained() -> LearnedPrefilter:
    prefilter = LearnedPrefilter(RULES, target_recall=0.95)
    prefilter.fit(examples(200, seed=1))
    return prefilter


# --- explore_pairs, estimate_recall --------------------------------------------------


def test_explored_pairs_are_reproducible_and_order_free() -> None:
    skipped = [f"R-{i:03d}" for i in range(400)]
    first = explore_pairs(skipped, "digest-1", rate=0.1, seed=3)
    assert first == explore_pairs(skipped, "digest-1", rate=0.1, seed=3)
    assert sorted(explore_pairs(skipped[::-1], "digest-1", rate=0.1, seed=3)) == first
    assert first != explore_pairs(skipped, "digest-1", rate=0.1, seed=4)
    assert first != explore_pairs(skipped, "digest-2", rate=0.1, seed=3)
    assert 20 <= len(first) <= 60  # about 40
    assert explore_pairs(skipped, "d", rate=0.0) == []
    assert explore_pairs(skipped, "d", rate=1.0) == skipped
    with pytest.raises(ValueError, match="rate"):
        explore_pairs(skipped, "d", rate=1.5)


def test_recall_estimate_and_its_wilson_interval() -> None:
    estimate = estimate_recall(1000, 2, 0.05)
    assert estimate.estimate == pytest.approx(50 / 52)
    assert estimate.low == pytest.approx(0.8702, abs=1e-3)
    assert estimate.high == pytest.approx(0.9894, abs=1e-3)
    nothing_missed = estimate_recall(1000, 0, 0.05)
    assert nothing_missed.estimate == 1.0
    assert nothing_missed.high == 1.0
    assert nothing_missed.low == pytest.approx(50 / (50 + 1.959964**2), abs=1e-4)
    unknown = estimate_recall(0, 0, 0.05)
    assert (unknown.estimate, unknown.low, unknown.high) == (1.0, 0.0, 1.0)
    assert estimate_recall(10, 1, 0.05, confidence=0.5).low > estimate.low - 1
    with pytest.raises(ValueError, match=">= 0"):
        estimate_recall(-1, 0, 0.05)
    with pytest.raises(ValueError, match="explore"):
        estimate_recall(1, 0, 0.0)


def test_recall_interval_covers_the_true_recall() -> None:
    """Simulated shadow judging: the 95% interval holds the truth about 95% of runs."""
    rng = np.random.default_rng(0)
    covered = runs = 0
    for kept_yes, missed_yes, explore in [
        (200, 10, 0.05),
        (1000, 50, 0.05),
        (1000, 20, 0.05),
        (500, 50, 0.1),
        (2000, 100, 0.02),
    ]:
        truth = kept_yes / (kept_yes + missed_yes)
        for _ in range(400):
            shadow = int(rng.binomial(missed_yes, explore))
            estimate = estimate_recall(kept_yes, shadow, explore)
            covered += estimate.low <= truth <= estimate.high
            runs += 1
    assert covered / runs >= 0.93


# --- ShadowJudging.partition ---------------------------------------------------------


def test_partition_judges_the_kept_and_the_explored_in_candidate_order(
    trained: LearnedPrefilter,
) -> None:
    shadow = ShadowJudging(trained, explore=0.5)
    texts = [QUIET, *(f"{QUIET} trigger-{i:03d}" for i in range(7))]
    explored_any = False
    for text in texts:
        judged, explored = shadow.partition(text, RULES.rules)
        kept, skipped = trained.partition(text)
        assert [r.rule_id for r in judged] == [
            r for r in RULE_IDS if r in {*kept, *explored}
        ]
        assert set(explored) <= set(skipped)
        assert set(explored.values()) <= {0.5}
        explored_any = explored_any or bool(explored)
    assert explored_any
    assert shadow.partition(QUIET, []) == ([], {})
    # Without exploring: exactly the prefilter's selection.
    none = ShadowJudging(trained, explore=0.0)
    judged, explored = none.partition(QUIET, RULES.rules)
    assert [r.rule_id for r in judged] == trained.select(QUIET)
    assert explored == {}
    with pytest.raises(ValueError, match="explore"):
        ShadowJudging(trained, explore=1.5)


def test_candidates_the_prefilter_does_not_know_are_always_judged(
    trained: LearnedPrefilter, caplog: pytest.LogCaptureFixture
) -> None:
    """New and edited rules of another rulebook object than the prefilter's are judged.

    Before, a new rule was never judged and an edited one could be skipped.
    """
    skipped_before = set(trained.partition(QUIET).skipped)
    assert {"R-003", "R-007"} <= skipped_before
    edited = RULES.rules[3].model_copy(
        update={"condition": RULES.rules[3].condition + " (edited)"}
    )
    new = Rule(rule_id="R-NEW", name="New", condition="`brand-new`", action="Act")
    callers = Rulebook(rules=[*RULES.rules[:3], edited, *RULES.rules[4:], new])
    shadow = ShadowJudging(trained, explore=0.0)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # one warning, not one per retrieval
            judged, _ = shadow.partition(QUIET, callers.rules)
            ids = [r.rule_id for r in judged]
            assert "R-003" in ids
            assert "R-NEW" in ids
            assert "R-007" not in ids  # known and unchanged: still skipped
    warnings = [r for r in caplog.records if "unknown to the learned" in r.message]
    assert len(warnings) == 1
    assert "2 candidate rule(s)" in warnings[0].message
    assert "R-003" in warnings[0].message
    assert "R-NEW" in warnings[0].message
    # Another unknown rule: warned about once more.
    newer = Rule(rule_id="R-NEWER", name="Newer", condition="`x`", action="Act")
    with caplog.at_level(logging.WARNING):
        judged, _ = shadow.partition(QUIET, [*callers.rules, newer])
    assert "R-NEWER" in [r.rule_id for r in judged]
    warnings = [r for r in caplog.records if "unknown to the learned" in r.message]
    assert len(warnings) == 2


def test_an_untrained_prefilter_judges_a_rule_of_another_rulebook() -> None:
    prefilter = LearnedPrefilter(RULES)
    new = Rule(rule_id="R-NEW", name="New", condition="`brand-new`", action="Act")
    judged, explored = ShadowJudging(prefilter).partition(QUIET, [*RULES.rules, new])
    assert [r.rule_id for r in judged] == [*RULE_IDS, "R-NEW"]
    assert explored == {}


# --- ShadowJudging.observe -----------------------------------------------------------


def yes(*rule_ids: str) -> list[Verdict]:
    return [Verdict(rule_id=r, applies=True) for r in rule_ids]


def test_observe_needs_a_trained_prefilter_and_exploring(
    trained: LearnedPrefilter,
) -> None:
    assert ShadowJudging(LearnedPrefilter(RULES)).observe(yes("R-001"), []) is None
    assert ShadowJudging(trained, explore=0.0).observe(yes("R-001"), []) is None


def test_counts_accumulate_across_retrainings() -> None:
    """Before, the counts restarted at each retraining: the interval never narrowed."""
    prefilter = LearnedPrefilter(RULES, target_recall=0.95)
    prefilter.fit(examples(100, seed=2))
    shadow = ShadowJudging(prefilter, explore=0.05)
    first = shadow.observe([*yes("R-001", "R-002"), *yes("R-005")], ["R-005"])
    assert first is not None
    assert (first.kept_yes, first.shadow_yes) == (2, 1)
    prefilter.fit(examples(150, seed=3))  # retrained: the counts go on
    for _ in range(50):
        last = shadow.observe(yes("R-001", "R-002", "R-003"), [])
    assert last is not None
    assert (last.kept_yes, last.shadow_yes) == (152, 1)
    assert shadow.counts == (152, 1)
    assert last.high - last.low < first.high - first.low


def test_observe_is_thread_safe(trained: LearnedPrefilter) -> None:
    shadow = ShadowJudging(trained, explore=0.1)
    barrier = threading.Barrier(8)

    def observe() -> None:
        barrier.wait()
        for _ in range(200):
            shadow.observe(yes("R-001", "R-002"), ["R-002"])

    threads = [threading.Thread(target=observe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert shadow.counts == (1600, 1600)


# --- skip records, and what is promised ----------------------------------------------


def test_partition_records_the_skipped_pairs_in_the_log(
    trained: LearnedPrefilter, tmp_path: Path
) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    shadow = ShadowJudging(trained, explore=0.5, log=log)
    judged, explored = shadow.partition(QUIET, RULES.rules)
    _, skipped, rates = trained.screen(QUIET)
    assert skipped
    assert log.pending == len(skipped)  # with the log's next write, not now
    log.flush()
    assert [(s.text, s.rule_id, s.skipped_yes, s.explore) for s in log.skips()] == [
        (QUIET, rule_id, rates[rule_id], 0.5) for rule_id in skipped
    ]
    # Explored ones are skip records too: their verdicts will say what they were.
    assert set(explored) <= set(skipped)
    assert not set(skipped) - set(explored) & {r.rule_id for r in judged}
    # Nothing skipped, nothing recorded: an untrained prefilter.
    ShadowJudging(LearnedPrefilter(RULES), log=log).partition(QUIET, RULES.rules)
    assert log.pending == 0


class PartitionOnly(BaseRetriever):
    """A prefilter that says what it skipped, but not how likely a YES was."""

    def partition(
        self, text: str, candidates: Sequence[Rule]
    ) -> tuple[list[str], list[str]]:
        ids = [rule.rule_id for rule in candidates]
        return ids[:2], ids[2:]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return []


def test_a_prefilter_without_rates_records_no_skips(tmp_path: Path) -> None:
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    shadow = ShadowJudging(PartitionOnly(), explore=0.0, log=log)  # type: ignore[arg-type]
    judged, _ = shadow.partition(QUIET, RULES.rules)
    assert [r.rule_id for r in judged] == RULE_IDS[:2]
    assert log.pending == 0


def test_the_estimate_carries_the_promise(trained: LearnedPrefilter) -> None:
    estimate = ShadowJudging(trained).observe(yes("R-001"), [])
    assert estimate is not None
    assert estimate.promised == trained.target_recall == 0.95
    assert estimate.estimate == 1.0  # measured: nothing missed yet
