"""The learned prefilter: cold start, selection, unknown rules, screening.

Training is in test_training.py, the thresholds in test_thresholds.py, the
features in test_features.py and the file in test_prefilter_file.py; they share
this module's inputs and trained prefilter.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from langchain_tag import Rule, Rulebook, TAGRetriever
from langchain_tag.learning.learned_prefilter import LabelledExample, LearnedPrefilter
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

RULES = trigger_rulebook(8)
RULE_IDS = [rule.rule_id for rule in RULES.rules]
FILLER = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota")


def make_inputs(n: int, seed: int) -> list[tuple[str, set[str]]]:
    """Inputs naming 0-2 triggers among filler words, with the rules they trigger.

    Rule R-007 is never triggered; the fake judge's verdicts are these labels.
    """
    rng = np.random.default_rng(seed)
    inputs = []
    for _ in range(n):
        triggered = rng.choice(7, size=rng.choice([0, 1, 1, 2]), replace=False)
        words = [*rng.choice(FILLER, size=12), *(f"trigger-{t:03d}" for t in triggered)]
        rng.shuffle(words)
        inputs.append((" ".join(words), {f"R-{t:03d}" for t in triggered}))
    return inputs


def examples(inputs: list[tuple[str, set[str]]]) -> list[LabelledExample]:
    return [
        LabelledExample(text, rule_id, rule_id in gold)
        for text, gold in inputs
        for rule_id in RULE_IDS
    ]


def train_prefilter() -> LearnedPrefilter:
    """A prefilter at target 0.95, trained on 200 inputs' verdicts on every rule."""
    prefilter = LearnedPrefilter(RULES, target_recall=0.95)
    prefilter.fit(examples(make_inputs(200, seed=1)))
    return prefilter


QUIET_TEXT = "alpha beta gamma delta epsilon zeta eta theta iota"
"""An input that names no trigger."""


@pytest.fixture(scope="module")
def trained() -> LearnedPrefilter:
    return train_prefilter()


# --- cold start ----------------------------------------------------------------------


def test_untrained_prefilter_passes_every_rule_in_rulebook_order() -> None:
    prefilter = LearnedPrefilter(RULES)
    assert not prefilter.fitted
    assert prefilter.report is None
    assert prefilter.select("anything trigger-003") == RULE_IDS
    docs = prefilter.invoke("anything")
    assert [d.metadata["rule_id"] for d in docs] == RULE_IDS
    assert [d.id for d in docs] == RULE_IDS


def test_cold_start_is_exactly_plain_tag() -> None:
    text = "alpha trigger-002 beta trigger-005"
    results = []
    for prefilter in (None, LearnedPrefilter(RULES)):
        llm = RuleAwareFakeChatModel()
        judge = ApplicabilityJudge(llm=llm, cache=None)
        retriever = TAGRetriever(rulebook=RULES, judge=judge, prefilter=prefilter)
        result = retriever.match(text)
        results.append((llm.calls, sorted(llm.prompts), result.verdicts))
    assert results[0] == results[1]
    assert results[0][0] == len(RULE_IDS)
    assert [v.rule_id for v in results[0][2] if v.applies] == ["R-002", "R-005"]


def test_too_little_history_is_always_judged() -> None:
    prefilter = LearnedPrefilter(RULES, min_examples=10)
    report = prefilter.fit(examples(make_inputs(9, seed=2)))
    assert report.count("little_history") == len(RULE_IDS)
    assert prefilter.select("alpha") == RULE_IDS


def test_a_recall_target_of_one_skips_nothing() -> None:
    prefilter = LearnedPrefilter(RULES, target_recall=1.0)
    report = prefilter.fit(examples(make_inputs(100, seed=3)))
    assert report.expected_recall == 1.0
    assert prefilter.select("alpha beta") == RULE_IDS


# --- selection -------------------------------------------------------------------


def test_learns_to_skip_the_rules_that_will_not_apply(
    trained: LearnedPrefilter,
) -> None:
    report = trained.report
    assert report is not None
    assert report.inputs == 200
    assert report.examples == 200 * len(RULE_IDS)
    assert report.rules["R-007"].status == "skipped"  # never applied
    assert report.count("learned") == 7
    assert report.expected_recall >= 0.95
    held_out = make_inputs(100, seed=4)
    judged = kept = yes = 0
    for text, gold in held_out:
        selected = trained.select(text)
        judged += len(selected)
        yes += len(gold)
        kept += len(gold & set(selected))
    assert kept / yes >= 0.95
    assert judged / (len(held_out) * len(RULE_IDS)) < 0.5


def test_selection_partitions_the_rulebook(trained: LearnedPrefilter) -> None:
    judged, skipped = trained.partition("alpha trigger-004 beta")
    assert sorted(judged + skipped) == sorted(RULE_IDS)
    assert "R-004" in judged
    assert "R-007" in skipped
    assert judged == [r for r in RULE_IDS if r in judged]  # rulebook order
    assert trained.select("alpha trigger-004 beta") == judged
    margins = trained.margins("alpha trigger-004 beta")
    assert margins["R-004"] >= 0
    docs = trained.invoke("alpha trigger-004 beta")
    assert [d.metadata["rule_id"] for d in docs] == judged
    assert docs[[d.id for d in docs].index("R-004")].metadata["margin"] >= 0


def test_the_retriever_judges_only_the_selected_rules(
    trained: LearnedPrefilter,
) -> None:
    text = "gamma trigger-001 delta"
    llm = RuleAwareFakeChatModel()
    retriever = TAGRetriever(
        rulebook=RULES, judge=ApplicabilityJudge(llm=llm, cache=None), prefilter=trained
    )
    result = retriever.match(text)
    assert llm.calls == len(trained.select(text)) < len(RULE_IDS)
    assert [d.metadata["rule_id"] for d in result.documents] == ["R-001"]


def test_a_changed_or_new_rule_is_always_judged(
    trained: LearnedPrefilter, tmp_path: Path
) -> None:
    path = trained.save(tmp_path / "model.npz")
    text = "alpha beta gamma delta trigger-005 epsilon zeta eta theta"
    before = trained.select(text)
    assert "R-003" not in before
    edited = [
        rule.model_copy(update={"condition": rule.condition + " (edited)"})
        if rule.rule_id == "R-003"
        else rule
        for rule in RULES.rules
    ]
    new = Rule(rule_id="R-NEW", name="New", condition="`brand-new`", action="Act")
    changed = Rulebook(rules=[*edited, new])
    reloaded = LearnedPrefilter.load(path, changed)
    assert reloaded.select(text) == [
        rule.rule_id
        for rule in changed.rules
        if rule.rule_id in {*before, "R-003", "R-NEW"}
    ]


# --- unknown rules -------------------------------------------------------------------


def test_partition_over_another_rulebooks_candidates(
    trained: LearnedPrefilter, caplog: pytest.LogCaptureFixture
) -> None:
    edited = RULES.rules[3].model_copy(update={"name": "R-003 renamed"})
    new = Rule(rule_id="R-NEW", name="New", condition="`brand-new`", action="Act")
    candidates = [new, *RULES.rules[:3], edited, *RULES.rules[4:]]
    kept, skipped = trained.partition(QUIET_TEXT)
    assert "R-003" in skipped
    with caplog.at_level(logging.WARNING):
        judged, skipped_now = trained.partition(QUIET_TEXT, candidates)
        trained.partition(QUIET_TEXT, candidates)
    assert judged == [
        r.rule_id for r in candidates if r.rule_id in {*kept, "R-NEW", "R-003"}
    ]
    assert skipped_now == [r for r in skipped if r != "R-003"]
    assert caplog.text.count("unknown to the learned prefilter") == 1
    assert trained.known_rules["R-003"] == RULES.rules[3].content_hash()


def test_screen_says_what_the_model_expects_of_the_skipped_rules(
    trained: LearnedPrefilter,
) -> None:
    judged, skipped, skipped_yes = trained.screen(QUIET_TEXT)
    assert (judged, skipped) == tuple(trained.partition(QUIET_TEXT))
    assert list(skipped_yes) == skipped
    report = trained.report
    assert report is not None
    for rule_id, rate in skipped_yes.items():
        assert 0.0 < rate == report.rules[rule_id].skipped_yes < 0.5
    assert LearnedPrefilter(RULES).screen(QUIET_TEXT).skipped_yes == {}
