"""The learned prefilter in the evaluation harness: k-fold methods and diagnostic.

`tag+learned` and `oracle+learned` run TAG behind a `LearnedPrefilter` whose every
input was held out of its training (k-fold); the mismatch diagnostic gains the
"learned from verdicts" row. The `requires_data` tests pin the real NBA figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_tag_experiments.evaluation.diagnostic import (
    DiagnosticResult,
    MismatchReport,
    diagnose,
)
from langchain_tag_experiments.evaluation.learned import (
    KFOLDS,
    KFoldPrefilter,
    LearnedScorer,
    fit_kfold,
    kfold_splits,
)
from langchain_tag_experiments.evaluation.methods import LEARNED_NOTES, standard_methods
from langchain_tag_experiments.evaluation.report import markdown_table
from langchain_tag_experiments.evaluation.runner import EvalResult, run_nba
from langchain_tag_experiments.evaluation.tasks import load_task

from langchain_tag import Rule, Rulebook, cli
from langchain_tag.testing import HashingFakeEmbeddings, RuleAwareFakeChatModel

pytest.importorskip("sklearn")


def by_method(results: list[EvalResult]) -> dict[str, EvalResult]:
    return {r.method: r for r in results}


def test_kfold_splits_partition_the_inputs_deterministically() -> None:
    splits = kfold_splits(23)
    assert len(splits) == KFOLDS
    assert splits == kfold_splits(23)
    tests = [i for _, test in splits for i in test]
    assert sorted(tests) == list(range(23))  # each input held out exactly once
    for train, test in splits:
        assert set(train).isdisjoint(test)
        assert sorted(train + test) == list(range(23))
    with pytest.raises(ValueError, match="k-fold needs"):
        kfold_splits(3)


def small_rulebook() -> Rulebook:
    return Rulebook.from_rules(
        [
            Rule(
                rule_id=word,
                name=word,
                condition=f"The text mentions {word}",
                action=f"Handle {word}.",
            )
            for word in ("apple", "pear", "plum")
        ]
    )


def test_each_input_is_selected_for_by_a_prefilter_trained_without_it() -> None:
    rulebook = small_rulebook()
    texts = [f"order {i}: {fruit}" for i in range(30) for fruit in ("apple", "pear")]
    verdicts = {text: frozenset({text.split(": ")[1]}) for text in texts}
    folded = fit_kfold(rulebook, verdicts)
    assert isinstance(folded, KFoldPrefilter)
    assert set(folded.routes) == set(texts)
    assert len({id(p) for p in folded.routes.values()}) == KFOLDS
    for train, test in kfold_splits(len(texts)):
        prefilter = folded.routes[texts[test[0]]]
        assert all(folded.routes[texts[i]] is prefilter for i in test)
        assert all(folded.routes[texts[i]] is not prefilter for i in train)
    # "plum" never applied: skipped everywhere; the held-out fruit is kept.
    text = texts[0]
    selected = [doc.metadata["rule_id"] for doc in folded.invoke(text)]
    assert "plum" not in selected
    assert "apple" in selected
    margins = LearnedScorer(folded).scores(text)
    assert list(margins) == ["apple", "pear", "plum"]
    assert margins["plum"] == float("-inf")
    with pytest.raises(KeyError, match="not among them"):
        folded.invoke("an input no fold was made for")


def test_few_inputs_get_as_many_folds() -> None:
    verdicts = {f"text {i}": frozenset({"apple"}) for i in range(3)}
    folded = fit_kfold(small_rulebook(), verdicts)
    assert len({id(p) for p in folded.routes.values()}) == 3
    with pytest.raises(ValueError, match="k-fold needs"):
        fit_kfold(small_rulebook(), {"alone": frozenset()})


def test_learned_methods_are_registered_with_their_notes() -> None:
    methods = {m.name: m for m in standard_methods("nba")}
    assert methods["oracle+learned"].needs == ("rulebook", "gold", "folds")
    assert methods["tag+learned"].needs == ("rulebook", "judge", "gold", "folds")
    assert methods["oracle+learned"].scorer == "learned"
    assert "oracle's (gold labels)" in LEARNED_NOTES["oracle"]
    assert "standing in for the judge" in LEARNED_NOTES["model"]
    assert {m.name for m in standard_methods("obliqa")} >= {
        "tag+learned",
        "oracle+learned",
    }


def test_the_learned_row_is_labelled_in_the_report() -> None:
    row = DiagnosticResult(
        task="nba",
        scorer="learned",
        report=MismatchReport(
            n_queries=2,
            units_total=3,
            gold_pairs=2,
            roc_auc_pooled=0.9,
            roc_auc_mean_per_query=0.9,
            recall_at_k={1: 0.5},
            n_for_95_recall=2,
            n_for_99_recall=3,
        ),
    )
    assert "| learned from verdicts (5-fold) | 0.900 |" in markdown_table([], [row])


# --- Real data --------------------------------------------------------------------


@pytest.mark.requires_data
def test_oracle_learned_on_nba_saves_calls_and_keeps_recall(data_dir: Path) -> None:
    results = by_method(
        run_nba(
            data_dir, methods=["oracle+learned"], embeddings=HashingFakeEmbeddings()
        )
    )
    learned = results["oracle+learned"]
    assert learned.status == "ok"
    assert learned.n == 131
    oracle_calls = 131 * 55  # the oracle judges every rule for every problem
    # Measured: 2508 calls (65% saved), micro recall 0.946, macro 0.942.
    assert learned.llm_calls == 0  # the oracle's judgments are look-ups
    assert learned.oracle_lookups < 0.45 * oracle_calls
    assert learned.metrics["recall_micro"] >= 0.92
    assert learned.metrics["recall_macro"] >= 0.92
    # The oracle never says YES wrongly.
    assert learned.metrics["precision_micro"] == 1.0
    assert LEARNED_NOTES["oracle"] in learned.notes


@pytest.mark.requires_data
def test_tag_learned_uses_the_same_folds_as_oracle_learned(data_dir: Path) -> None:
    judge = RuleAwareFakeChatModel()
    results = by_method(
        run_nba(
            data_dir,
            methods=["oracle", "oracle+learned", "tag+learned"],
            limit=25,
            judge_model=judge,
            embeddings=HashingFakeEmbeddings(),
        )
    )
    tag, oracle = results["tag+learned"], results["oracle+learned"]
    assert tag.status == "ok"
    assert tag.llm_calls == oracle.oracle_lookups == judge.calls
    assert oracle.oracle_lookups < results["oracle"].oracle_lookups == 25 * 55
    assert LEARNED_NOTES["model"] in tag.notes


@pytest.mark.requires_data
def test_diagnostic_learned_row_beats_similarity_on_nba(data_dir: Path) -> None:
    task = load_task("nba", data_dir)
    found = {d.scorer: d.report for d in diagnose(task, scorers=["bm25", "learned"])}
    assert list(found) == ["bm25", "learned"]
    learned, bm25 = found["learned"], found["bm25"]
    assert learned.n_queries == bm25.n_queries
    # Measured: N95 25, N99 44, pooled AUC 0.92 (BM25: 51, 54, 0.58).
    assert learned.n_for_95_recall is not None
    assert learned.n_for_95_recall < 35
    assert learned.n_for_99_recall is not None
    assert learned.n_for_99_recall < 55
    assert (learned.roc_auc_pooled or 0.0) > 0.85
    assert bm25.n_for_95_recall is not None
    assert learned.n_for_95_recall < bm25.n_for_95_recall


@pytest.mark.requires_data
def test_cli_eval_shows_the_learned_row(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    argv = [
        *("eval", "nba", "--data-dir", str(data_dir), "--offline", "--limit", "20"),
        *("--no-embedding-cache", "--no-plot", "--methods", "oracle+learned"),
        *("--out", str(out)),
    ]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| oracle+learned | rules | 20 |" in printed
    assert "| learned from verdicts (5-fold) |" in printed
    assert '"scorer": "learned"' in (out / "diagnostic.json").read_text()
