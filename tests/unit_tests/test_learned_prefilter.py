"""The learned prefilter, and the pure pieces of shadow judging."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.feature_extraction.text import (  # type: ignore[import-untyped]
    HashingVectorizer,
)

from langchain_tag import ApplicabilityJudge, Rule, Rulebook, TAGRetriever
from langchain_tag.matching.learned import (
    FeatureHashing,
    HashedFeatures,
    LabelledExample,
    LearnedPrefilter,
)
from langchain_tag.matching.shadow import RetrainPolicy, estimate_recall, explore_pairs
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


@pytest.fixture(scope="module")
def trained() -> LearnedPrefilter:
    prefilter = LearnedPrefilter(RULES, target_recall=0.95)
    prefilter.fit(examples(make_inputs(200, seed=1)))
    return prefilter


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


# --- learning ------------------------------------------------------------------------


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


def test_the_last_verdict_on_a_pair_counts_and_unknown_rules_are_ignored() -> None:
    inputs = make_inputs(60, seed=5)
    flipped = [LabelledExample(text, "R-000", applies=True) for text, _ in inputs]
    unknown = [LabelledExample(text, "R-GONE", applies=True) for text, _ in inputs]
    prefilter = LearnedPrefilter(RULES)
    report = prefilter.fit([*flipped, *examples(inputs), *unknown])
    assert report.ignored == len(inputs)
    assert report.rules["R-000"].positives == sum("R-000" in g for _, g in inputs)


def test_examples_take_an_optional_weight_and_refuse_bad_ones() -> None:
    prefilter = LearnedPrefilter(RULES)
    report = prefilter.fit(
        [("text one", "R-000", False, 20.0), ("text two", "R-001", True)]
    )
    assert report.examples == 2
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive weight"):
            prefilter.fit([("text", "R-000", False, bad)])


def test_max_inputs_keeps_the_most_recent() -> None:
    inputs = make_inputs(50, seed=6)
    prefilter = LearnedPrefilter(RULES, max_inputs=20)
    report = prefilter.fit(examples(inputs))
    assert report.inputs == 20
    assert report.rules["R-000"].examples == 20


# --- features ------------------------------------------------------------------------


def test_hashing_is_sklearns_hashing_vectorizer() -> None:
    hashing = FeatureHashing()
    text = "A 3-year contract, a 3-year CONTRACT; trigger-001."
    features = hashing.hash(text)
    row = HashingVectorizer(**hashing.vectorizer_options()).transform([text])
    row.sort_indices()
    assert features.indices == tuple(row.indices.tolist())
    assert features.counts == tuple(int(c) for c in row.data)
    assert features.scheme == hashing.scheme
    assert FeatureHashing(ngram_max=1).scheme != hashing.scheme
    assert sum(features.counts) == 10 + 9  # 10 words ("a", "3", "year", ...), 9 pairs


def test_training_on_hashed_features_equals_training_on_texts() -> None:
    inputs = make_inputs(120, seed=7)
    hashing = FeatureHashing()
    hashed = [
        LabelledExample(hashing.hash(e.input), e.rule_id, e.applies)  # type: ignore[arg-type]
        for e in examples(inputs)
    ]
    from_texts, from_features = LearnedPrefilter(RULES), LearnedPrefilter(RULES)
    from_texts.fit(examples(inputs))
    from_features.fit(hashed)
    for text, _ in make_inputs(30, seed=8):
        assert from_texts.margins(text) == pytest.approx(from_features.margins(text))


def test_features_hashed_under_another_scheme_are_refused() -> None:
    other = FeatureHashing(ngram_max=1).hash("alpha trigger-001")
    with pytest.raises(ValueError, match="scheme"):
        LearnedPrefilter(RULES).fit([(other, "R-001", True)])


def test_hashed_features_are_checked() -> None:
    with pytest.raises(ValueError, match="ascending"):
        HashedFeatures(scheme="s", indices=(3, 1), counts=(1, 1))
    with pytest.raises(ValueError, match="each bucket needs its count"):
        HashedFeatures(scheme="s", indices=(1,), counts=())


# --- persistence ---------------------------------------------------------------------


def test_save_and_load_round_trip(trained: LearnedPrefilter, tmp_path: Path) -> None:
    path = trained.save(tmp_path / "models" / "prefilter.npz")
    assert [p.name for p in path.parent.iterdir()] == ["prefilter.npz"]  # no temp
    loaded = LearnedPrefilter.load(path, RULES)
    assert loaded.report == trained.report
    for text, _ in make_inputs(20, seed=9):
        assert loaded.select(text) == trained.select(text)
        assert loaded.margins(text) == pytest.approx(trained.margins(text), abs=1e-5)
    with np.load(path, allow_pickle=False) as arrays:  # nothing pickled inside
        assert set(arrays.files) >= {"header", "weights", "thresholds"}


def test_loading_refuses_what_is_not_a_saved_model(
    trained: LearnedPrefilter, tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="not a saved learned prefilter"):
        LearnedPrefilter.load(garbage, RULES)
    path = trained.save(tmp_path / "model.npz")
    with zipfile.ZipFile(path) as archive:
        kept = {n: archive.read(n) for n in archive.namelist() if n != "bias.npy"}
    truncated = tmp_path / "truncated.npz"
    with zipfile.ZipFile(truncated, "w") as archive:
        for name, data in kept.items():
            archive.writestr(name, data)
    with pytest.raises(ValueError, match="not a saved learned prefilter"):
        LearnedPrefilter.load(truncated, RULES)


def test_an_untrained_prefilter_has_nothing_to_save(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not trained"):
        LearnedPrefilter(RULES).save(tmp_path / "x.npz")


# --- shadow judging ------------------------------------------------------------------


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


def test_retrain_policy_counts_new_verdicts() -> None:
    policy = RetrainPolicy(every=20)
    assert not policy.due(19)
    assert policy.due(20)
    assert not policy.due(39, trained_at=20)
    assert policy.due(40, trained_at=20)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RetrainPolicy(every=0)
