"""The learned prefilter: training, selection, unknown rules, persistence."""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import numpy as np
import pytest
from scipy import sparse  # type: ignore[import-untyped]
from sklearn.feature_extraction.text import (  # type: ignore[import-untyped]
    HashingVectorizer,
)
from sklearn.metrics import roc_auc_score  # type: ignore[import-untyped]

from langchain_tag import Rule, Rulebook, TAGRetriever
from langchain_tag.learning.learned_prefilter import (
    FeatureHashing,
    HashedFeatures,
    LabelledExample,
    LearnedPrefilter,
    SkippedPair,
    _Masses,
    _rows,
    _tf_idf_matrix,
    _tf_idf_row,
    _threshold_options,
    _weighted_auc,
)
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
        assert set(arrays.files) >= {"header", "weights", "options", "chosen"}


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


# --- re-thresholding on load ---------------------------------------------------------


@pytest.mark.parametrize("target", [0.8, 0.99, 1.0])
def test_loading_at_another_target_re_thresholds(
    trained: LearnedPrefilter, tmp_path: Path, target: float
) -> None:
    """Before, `load(..., target_recall=x)` kept the saved thresholds silently."""
    path = trained.save(tmp_path / "model.npz")
    loaded = LearnedPrefilter.load(path, RULES, target_recall=target)
    refitted = LearnedPrefilter(RULES, target_recall=target)
    refitted.fit(examples(make_inputs(200, seed=1)))
    assert loaded.target_recall == target
    assert loaded.report is not None
    assert refitted.report is not None
    assert loaded.report.target_recall == target
    assert loaded.report.rules == refitted.report.rules
    assert loaded.report.expected_recall == pytest.approx(
        refitted.report.expected_recall
    )
    for text, _ in make_inputs(30, seed=9):
        assert loaded.select(text) == refitted.select(text)
    assert trained.report is not None
    saved = trained.report.expected_judged
    if target > trained.target_recall:
        assert loaded.report.expected_judged > saved
    else:
        assert loaded.report.expected_judged <= saved
    if target == 1.0:  # a recall target of one skips nothing
        assert loaded.select(QUIET_TEXT) == RULE_IDS


def test_a_model_without_options_refuses_another_target(
    trained: LearnedPrefilter, tmp_path: Path
) -> None:
    """A version-1 file loads as it was; it cannot be re-thresholded."""
    assert trained.report is not None
    path = trained.save(tmp_path / "model.npz")
    with np.load(path, allow_pickle=False) as arrays:
        header = json.loads(bytes(arrays["header"]).decode())
        kept = np.flatnonzero(arrays["chosen"] > 0)
        offsets, chosen = arrays["offsets"], arrays["chosen"]
        thresholds = arrays["options"][offsets[:-1] + chosen, 0][kept]
        old = {
            "columns": arrays["columns"],
            "idf": arrays["idf"],
            "weights": arrays["weights"][:, kept],
            "bias": arrays["bias"][kept],
            "thresholds": thresholds,
        }
    header = {
        **{
            k: v
            for k, v in header.items()
            if k not in {"trained_rules", "yes_rate_total"}
        },
        "version": 1,
        "rule_ids": [header["rule_ids"][i] for i in kept],
        "rule_hashes": [header["rule_hashes"][i] for i in kept],
    }
    v1 = tmp_path / "v1.npz"
    with v1.open("wb") as out:
        np.savez_compressed(
            out, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **old
        )
    loaded = LearnedPrefilter.load(v1, RULES)
    for text, _ in make_inputs(20, seed=9):
        assert loaded.select(text) == trained.select(text)
    same = LearnedPrefilter.load(v1, RULES, target_recall=trained.report.target_recall)
    assert same.select(QUIET_TEXT) == trained.select(QUIET_TEXT)
    with pytest.raises(ValueError, match=r"v1\.npz.*re-threshold.*Train it again"):
        LearnedPrefilter.load(v1, RULES, target_recall=0.99)


QUIET_TEXT = "alpha beta gamma delta epsilon zeta eta theta iota"


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


# --- scikit-learn where it computes the same ------------------------------------------


def test_tf_idf_is_the_documented_formula(trained: LearnedPrefilter) -> None:
    """Sublinear TF, smoothed IDF, L2 rows: the training matrix and one row agree."""
    texts = [text for text, _ in make_inputs(50, seed=4)]
    counts = _rows(trained.hashing, texts)
    columns, idf, matrix = _tf_idf_matrix(counts.copy(), 2)
    dense = counts[:, columns].toarray()
    df = (dense > 0).sum(axis=0)
    assert idf == pytest.approx(np.log((1 + len(texts)) / (1 + df)) + 1)
    tf = np.where(dense > 0, 1 + np.log(np.where(dense > 0, dense, 1)), 0.0)
    expected = tf * idf
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert sparse.issparse(matrix)
    assert matrix.toarray() == pytest.approx(expected)
    state = trained._state
    assert state is not None
    row = trained.hashing.hash_matrix([texts[0]])
    row.sort_indices()
    values = _tf_idf_row(state.model, np.asarray(row.indices), np.asarray(row.data))
    assert values is not None
    assert np.linalg.norm(values[1]) == pytest.approx(1.0)


def test_weighted_auc_is_sklearns() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(5, 200))
        y = rng.random(n) < 0.3
        y[:2] = [True, False]
        scores = np.round(rng.normal(size=n) + y, 1)  # with ties
        weights = np.where(rng.random(n) < 0.2, 20.0, 1.0)
        assert _weighted_auc(scores, y, weights) == pytest.approx(
            roc_auc_score(y, scores, sample_weight=weights)
        )


def test_weighted_auc_counts_ties_one_half() -> None:
    scores = np.asarray([0.1, 0.4, 0.4, 0.9])
    y = np.asarray([False, True, False, True])
    assert _weighted_auc(scores, y, np.ones(4)) == pytest.approx(0.875)
    # A weight counts the example that many times.
    weights = np.asarray([1.0, 2.0, 1.0, 1.0])
    repeated = np.asarray([0.1, 0.4, 0.4, 0.4, 0.9])
    y_repeated = np.asarray([False, True, True, False, True])
    assert _weighted_auc(scores, y, weights) == pytest.approx(
        _weighted_auc(repeated, y_repeated, np.ones(5))
    )


# --- skipped pairs: fractional YES mass in the threshold step ------------------------


def test_skipped_pairs_weigh_as_fractional_yes_by_hand() -> None:
    # Labelled: input 0 judged YES, 3 judged NO (weight 1); 1 and 2 explored
    # (weight 1 / 0.05), NO and YES, with skip records: they count once.
    pairs = [(0, True, 1.0), (1, False, 20.0), (2, True, 20.0), (3, False, 1.0)]
    # Skipped: 1 and 2 (explored), 4 and 5 without a verdict.
    skipped = [(1, 0.1), (2, 0.1), (4, 0.2), (5, 0.05)]
    masses = _Masses.of(pairs, skipped)
    # S = 1 explored YES of N = 2: q = (1 + 10 q0) / (2 + 10).
    assert masses.imputed_rows.tolist() == [4, 5]
    assert masses.yes.tolist() == pytest.approx([1, 0, 1, 0, 3 / 12, 1.5 / 12])
    assert masses.no.tolist() == pytest.approx([0, 1, 0, 1, 9 / 12, 10.5 / 12])
    assert masses.rate == pytest.approx((2 + 4.5 / 12 + 0.5) / (6 + 1))
    # Without skip records the weights stand: the explored pairs count 20 times.
    plain = _Masses.of(pairs, [])
    assert plain.yes.tolist() == [1, 0, 20, 0]
    assert plain.rate == pytest.approx((21 + 0.5) / (42 + 1))


def test_threshold_options_spend_yes_mass_by_hand() -> None:
    scores = np.asarray([0.9, 0.1, 0.5])
    yes = np.asarray([1.0, 0.25, 0.0])
    no = np.asarray([0.0, 0.75, 1.0])
    options = _threshold_options(scores, yes, no, rate=0.4)
    # A threshold at each score carrying YES mass, then always: conformal +1 on
    # the YES mass below (of 1.25), the NO mass below (of 1.75) skipped.
    assert [o.threshold for o in options] == [0.1, 0.9, float("inf")]
    assert [o.miss for o in options] == pytest.approx(
        [0.4 * 1 / 2.25, 0.4 * 1.25 / 2.25, 0.4]
    )
    assert [o.skip for o in options] == pytest.approx([0.0, 0.6, 0.6])


def test_skipped_pairs_without_verdicts_make_the_thresholds_keep_more() -> None:
    """Before, the YES verdicts a model skipped were missing from its next training.

    Half of R-001's YES inputs were skipped and never judged: trained on the
    verdicts alone the rule looks rarer and is skipped more; given the skipped
    pairs, their YES mass comes back.
    """
    inputs = make_inputs(200, seed=5)
    verdicts, skipped = [], []
    hidden = 0
    for text, gold in inputs:
        for rule_id in RULE_IDS:
            if rule_id == "R-001" and (rule_id in gold) and hidden % 2 == 0:
                skipped.append(SkippedPair(text, rule_id, 0.3))
            else:
                verdicts.append(LabelledExample(text, rule_id, rule_id in gold))
            hidden += rule_id == "R-001" and rule_id in gold
    alone = LearnedPrefilter(RULES, target_recall=0.95).fit(verdicts)
    with_skips = LearnedPrefilter(RULES, target_recall=0.95)
    report = with_skips.fit([*verdicts, *skipped])
    assert report.skipped == len(skipped) > 10
    assert report.examples == alone.examples == len(verdicts)
    kept, lost = report.rules["R-001"], alone.rules["R-001"]
    assert kept.positives == lost.positives  # the ridge learns from verdicts only
    assert kept.expected_skip < lost.expected_skip
    assert kept.skipped_yes == pytest.approx(
        kept.expected_miss / (kept.expected_miss + kept.expected_skip)
    )
    with pytest.raises(ValueError, match="skipped_yes is a probability"):
        with_skips.fit([*verdicts, SkippedPair("text", "R-001", 1.5)])


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


def test_an_internal_target_sets_the_thresholds_not_the_promise(
    trained: LearnedPrefilter,
) -> None:
    data = examples(make_inputs(200, seed=1))
    strict = LearnedPrefilter(RULES, target_recall=0.95)
    report = strict.fit(data, internal_target=0.99)
    at_99 = LearnedPrefilter(RULES, target_recall=0.99)
    at_99.fit(data)
    assert (report.target_recall, report.internal_target) == (0.95, 0.99)
    assert strict.target_recall == 0.95
    assert at_99.report is not None
    assert report.rules == at_99.report.rules
    assert trained.report is not None
    assert trained.report.internal_target == 0.95  # without one: the target
    with pytest.raises(ValueError, match="internal_target"):
        strict.fit(data, internal_target=1.5)


def test_a_file_saved_before_internal_targets_loads(
    trained: LearnedPrefilter, tmp_path: Path
) -> None:
    path = trained.save(tmp_path / "model.npz")
    loaded = LearnedPrefilter.load(path, RULES)
    assert loaded.report is not None
    assert loaded.report.internal_target == 0.95
    with np.load(path, allow_pickle=False) as arrays:
        header = json.loads(bytes(arrays["header"]).decode())
        saved = {name: arrays[name] for name in arrays.files if name != "header"}
    del header["report"]["internal_target"], header["report"]["skipped"]
    older = tmp_path / "older.npz"
    np.savez(
        older, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **saved
    )
    report = LearnedPrefilter.load(older, RULES).report
    assert report is not None
    assert (report.internal_target, report.skipped) == (0.95, 0)
    assert LearnedPrefilter.load(older, RULES).select(QUIET_TEXT) == trained.select(
        QUIET_TEXT
    )
