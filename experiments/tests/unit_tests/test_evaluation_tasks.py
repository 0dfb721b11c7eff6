"""The NPOV and custom tasks, the suites, and the CLI options of issue 13.

NPOV runs on the real WNC pairs (skipped without the shared data) and on a few
pairs written here; a custom set is written to a temporary directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_tag_experiments.evaluation import report
from langchain_tag_experiments.evaluation.datasets import (
    DatasetError,
    LabelledInput,
    WNCPair,
    load_labelled,
    load_wnc,
)
from langchain_tag_experiments.evaluation.estimate import estimate_methods
from langchain_tag_experiments.evaluation.methods import (
    SUITES,
    select_methods,
    standard_methods,
)
from langchain_tag_experiments.evaluation.runner import EvalResult, aevaluate
from langchain_tag_experiments.evaluation.suites import VARIANTS, aphase_ablation
from langchain_tag_experiments.evaluation.tasks import custom_task, load_task, npov_task

from langchain_tag import Rule, Rulebook, cli
from langchain_tag.resources import curated_rulebook
from langchain_tag.testing import (
    HashingFakeEmbeddings,
    JudgeAndExtractorFakeChatModel,
    NPOVFakeChatModel,
    RuleAwareFakeChatModel,
)

FAKE_EMBEDDINGS = "langchain_tag.testing.embeddings:HashingFakeEmbeddings"

PAIRS = [
    WNCPair(
        id="p1",
        biased="the legendary band released a new album in 1999 .",
        neutral="the band released a new album in 1999 .",
        source_split="train",
        source_line=0,
    ),
    WNCPair(
        id="p2",
        biased="the so-called expert testified before the senate .",
        neutral="the expert testified before the senate .",
        source_split="train",
        source_line=1,
    ),
    WNCPair(
        id="p3",
        biased="the river flows north through the valley .",
        neutral="the river flows north through the valley .",
        source_split="train",
        source_line=2,
    ),
]


def by_method(results: list[EvalResult]) -> dict[str, EvalResult]:
    return {r.method: r for r in results}


def npov_fake(pairs: list[WNCPair]) -> NPOVFakeChatModel:
    return NPOVFakeChatModel(neutral={p.biased: p.neutral for p in pairs})


# --- NPOV -------------------------------------------------------------------------


async def test_npov_without_an_executor_scores_the_identity_baseline() -> None:
    results = by_method(
        await aevaluate(
            npov_task(PAIRS),
            methods=["m0-*", "m1-*", "m2-chunks-k5"],
            embeddings=HashingFakeEmbeddings(),
        )
    )
    m0 = results["m0-no-retrieval"]
    # Only p3's neutral sentence equals its input; the copy removed nothing.
    assert m0.metrics["exact_match"] == pytest.approx(1 / 3)
    assert (m0.metrics["edit_recall"], m0.metrics["edit_precision"]) == (0.0, 1.0)
    assert m0.metrics["pass_through"] == 1.0
    assert 0 < m0.metrics["bleu"] < 100
    assert "vfr" not in m0.metrics
    assert any("identity baseline" in note for note in m0.notes)
    # Every method scores the same identity rewrite; M1 gives all curated rules.
    assert results["m1-all-rules"].metrics == m0.metrics
    assert results["m1-all-rules"].mean_units == len(curated_rulebook("npov").rules)
    assert results["m2-chunks-k5"].mean_units == 5.0


async def test_every_npov_method_and_the_vfr_judge_run_end_to_end() -> None:
    model = npov_fake(PAIRS)
    results = by_method(
        await aevaluate(
            npov_task(PAIRS),
            judge_model=model,
            executor_model=model,
            embeddings=HashingFakeEmbeddings(),
            max_concurrency=4,
        )
    )
    ran = {name for name, r in results.items() if r.status == "ok"}
    expected = {m.name for m in standard_methods("npov")} - {
        "oracle",
        "oracle-decision",  # no gold labels
        "oracle+hybrid-n40",
        "oracle+learned",
        "tag+learned",  # no gold labels to learn from
        "tag-cascade",  # no cheap judge
        "tag-decision",  # no decision model
    }
    assert ran == expected
    for result in results.values():
        if result.status == "ok":
            assert result.failures == 0, (result.method, result.first_error)
    m0, tag = results["m0-no-retrieval"], results["tag"]
    # No guidance: the fake copies the input, which the pass-through guard fails
    # without calling the VFR judge.
    assert m0.metrics["vfr"] == 0.0
    assert m0.grader_calls == 0
    # TAG matched a rule on p1 ('legendary') and p2 ('so-called'): rewritten to the
    # neutral sentence, fixed by the VFR judge; p3 matched nothing: copied.
    assert tag.metrics["exact_match"] == 1.0
    assert tag.metrics["vfr"] == pytest.approx(2 / 3)
    assert tag.metrics["edit_recall"] == 1.0
    assert tag.grader_calls == 2
    assert tag.metrics["avg"] == pytest.approx((4 + 5 + 4 + 5) / 4)
    table = report.markdown_table(list(results.values()))
    assert "## NPOV rewriting (WNC sample)" in table
    assert "| VFR |" in table or " VFR " in table


async def test_npov_estimate_bounds_the_vfr_calls_and_counts_the_rest() -> None:
    model = npov_fake(PAIRS)
    task = npov_task(PAIRS)
    names = ["m0-*", "tag", "tag-b5", "rules-sim"]
    results = by_method(
        await aevaluate(
            task,
            methods=names,
            judge_model=model,
            executor_model=model,
            embeddings=HashingFakeEmbeddings(),
        )
    )
    estimates = estimate_methods(
        task,
        select_methods(standard_methods("npov"), names),
        judge=True,
        cheap_judge=False,
        executor=True,
        embeddings=HashingFakeEmbeddings(),
    )
    for found in estimates:
        result = results[found.method]
        assert found.judge_calls + found.executor_calls == result.llm_calls
        # The VFR judge skips copies: one grading call per input at most.
        assert found.grader_calls == len(PAIRS) >= result.grader_calls
        assert not found.exact_calls
    assert results["m0-no-retrieval"].grader_calls == 0


async def test_npov_2x2_suite_reports_units_by_selection() -> None:
    model = npov_fake(PAIRS)
    results = await aevaluate(
        npov_task(PAIRS),
        methods=list(SUITES["2x2"]),
        judge_model=model,
        executor_model=model,
        embeddings=HashingFakeEmbeddings(),
    )
    assert sorted(r.method for r in results) == sorted(SUITES["2x2"])
    table = report.markdown_table(results)
    assert "units x selection (vfr)" in table
    assert "| rules (rules-sim, tag) |" in table


def test_npov_offline_on_real_data(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = load_wnc(data_dir)
    assert len(pairs) == 1000
    argv = [
        *("eval", "npov", "--data-dir", str(data_dir), "--offline"),
        *("--methods", "m0-*,m1-*,m2-*", "--embeddings", FAKE_EMBEDDINGS),
        *("--out", str(tmp_path / "out"), "--no-embedding-cache", "--no-plot"),
    ]
    assert cli.main(argv) == 0
    rows = {
        row["method"]: row
        for row in json.loads((tmp_path / "out" / "results.json").read_text())
    }
    assert set(rows) == {
        "m0-no-retrieval",
        "m1-all-rules",
        *(f"m2-chunks-k{k}" for k in (5, 10, 15, 20)),
    }
    m0 = rows["m0-no-retrieval"]
    # The identity baseline on all 1,000 dev pairs: 4 pairs are unchanged.
    assert m0["n"] == 1000
    assert m0["exact_match"] == pytest.approx(0.004)
    assert m0["edit_recall"] == 0.0
    assert m0["edit_precision"] == 1.0
    assert m0["bleu"] == pytest.approx(76.41, abs=0.01)
    assert "## NPOV rewriting (WNC sample)" in capsys.readouterr().out


# --- A user's labelled set ------------------------------------------------------------


def labelled_rulebook() -> Rulebook:
    return Rulebook.from_rules(
        [
            Rule(
                rule_id=f"R{i}",
                name=f"rule about {word}",
                condition=f"The request mentions `{word}`",
                action=f"Handle the {word}.",
            )
            for i, word in enumerate(("refund", "invoice", "password", "delivery"))
        ]
    )


def write_inputs(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


RECORDS = [
    {"input": "I want a refund for my invoice", "applicable": ["R0", "R1"]},
    {"input": "reset my password please", "applicable": ["R2"], "reference": "ok"},
    {"id": "late", "input": "where is my delivery", "applicable": ["R3"]},
    {"input": "hello there", "applicable": []},
]


def test_labelled_inputs_are_read_with_clear_errors(tmp_path: Path) -> None:
    inputs = load_labelled(write_inputs(tmp_path / "in.jsonl", RECORDS))
    assert [i.id for i in inputs] == ["line-1", "line-2", "late", "line-4"]
    assert inputs[1] == LabelledInput(
        id="line-2",
        input="reset my password please",
        applicable=("R2",),
        reference="ok",
    )
    bad = write_inputs(tmp_path / "bad.jsonl", [{"input": "x", "aplicable": ["R0"]}])
    with pytest.raises(DatasetError, match=r"bad\.jsonl line 1: .*applicable"):
        load_labelled(bad)
    (tmp_path / "nojson.jsonl").write_text("{", encoding="utf-8")
    with pytest.raises(DatasetError, match="line 1 is not valid JSON"):
        load_labelled(tmp_path / "nojson.jsonl")
    with pytest.raises(ValueError, match="'R9'"):
        custom_task(
            labelled_rulebook(),
            [LabelledInput(id="a", input="x", applicable=("R9",))],
        )


async def test_custom_task_scores_tag_the_prefilters_and_the_oracle(
    tmp_path: Path,
) -> None:
    rulebook = tmp_path / "rules.json"
    labelled_rulebook().save(rulebook)
    task = load_task(
        "custom",
        rulebook=rulebook,
        inputs=write_inputs(tmp_path / "in.jsonl", RECORDS),
    )
    results = by_method(
        await aevaluate(
            task,
            judge_model=RuleAwareFakeChatModel(),
            embeddings=HashingFakeEmbeddings(),
        )
    )
    # 4 rules: prefilter sizes are 10/25/50% of them.
    assert {"prefilter-bm25-n1", "prefilter-bm25-n2", "tag+hybrid-n2"} <= set(results)
    for name in ("m2-chunks-k5", "chunks+applicability"):
        assert results[name].skip_reason == (
            "the task has no documents to split into chunks"
        )
    for name in ("tag", "oracle"):
        assert results[name].metrics["f1_micro"] == 1.0
    # The oracle judges as many pairs as TAG, by look-ups.
    assert results["tag"].llm_calls == results["oracle"].oracle_lookups == 4 * 4
    assert (results["tag"].oracle_lookups, results["oracle"].llm_calls) == (0, 0)
    assert "recall_micro" in results["rules-sim"].metrics
    assert "answers against the references: need an executor model" in (
        results["tag"].notes
    )


def test_cli_eval_custom_offline_and_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rulebook = tmp_path / "rules.json"
    labelled_rulebook().save(rulebook)
    inputs = write_inputs(tmp_path / "in.jsonl", RECORDS)
    argv = [
        *("eval", "custom", "--rulebook", str(rulebook), "--inputs", str(inputs)),
        *("--embeddings", FAKE_EMBEDDINGS, "--no-embedding-cache", "--no-plot"),
        *("--out", str(tmp_path / "out")),
    ]
    assert cli.main([*argv, "--offline"]) == 0
    out = capsys.readouterr().out
    assert "## Your labelled set" in out
    assert "| oracle | rules | 4 | 1.000 |" in out
    assert "similarity as a predictor of the gold rules" in out
    assert cli.main([*argv, "--estimate", "--price-in", "1", "--price-out", "2"]) == 0
    assert "| tag |" in capsys.readouterr().out
    assert cli.main(["eval", "custom", "--inputs", str(inputs)]) == 2
    assert "needs --rulebook" in capsys.readouterr().err
    assert cli.main(["eval", "nba", "--inputs", str(inputs)]) == 2
    assert "--inputs: not an option of tag eval nba" in capsys.readouterr().err
    assert cli.main([*argv, "--price-in", "1"]) == 2
    assert "without --estimate" in capsys.readouterr().err


# --- The phase ablations ------------------------------------------------------------


async def test_phase_suite_extracts_and_evaluates_each_variant(tmp_path: Path) -> None:
    model = JudgeAndExtractorFakeChatModel()
    task = npov_task(PAIRS[:2])
    rows = await aphase_ablation(
        task,
        extraction_model=model,
        judge_model=model,
        embeddings=HashingFakeEmbeddings(),
        checkpoint_dir=tmp_path / "phases",
    )
    assert [r.method for r in rows] == [
        "tag [full]",
        "tag [w/o phase 1: span detection]",
        "tag [w/o phase 2: atomic decomposition]",
        "tag [w/o phase 3: operationalisation]",
        "tag [w/o phase 4: dedup and conflicts]",
        "tag [w/o phase 5: verification]",
    ]
    assert len(VARIANTS) == len(rows)
    for row in rows:
        assert row.status == "ok", row.skip_reason
        assert any(note.startswith("rulebook [") for note in row.notes)
    # A second run resumes from the kept answers: no extraction call at all.
    fresh = JudgeAndExtractorFakeChatModel()
    again = await aphase_ablation(
        task,
        extraction_model=fresh,
        judge_model=RuleAwareFakeChatModel(),
        variants=VARIANTS[:1],
        checkpoint_dir=tmp_path / "phases",
    )
    assert again[0].method == "tag [full]"
    assert fresh.extractor.calls == 0


def test_cli_suite_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eval", "npov", "--suite", "phases", "--offline"]) == 2
    assert "--suite phases extracts" in capsys.readouterr().err
    assert cli.main(["eval", "nba", "--suite", "2x2", "--methods", "tag"]) == 2
    assert "--suite chooses the methods" in capsys.readouterr().err


async def test_every_input_failing_is_reported_not_a_crash() -> None:
    rulebook = labelled_rulebook()
    down = {rule.rule_id: [ValueError("down")] * 10 for rule in rulebook.rules}
    task = custom_task(
        rulebook, [LabelledInput(id="a", input="refund me", applicable=("R0",))]
    )
    results = by_method(
        await aevaluate(
            task,
            methods=["tag", "rules-sim"],
            judge_model=RuleAwareFakeChatModel(faults=down),
            embeddings=HashingFakeEmbeddings(),
        )
    )
    tag = results["tag"]
    assert (tag.status, tag.failures, tag.metrics) == ("ok", 1, {})
    assert "rules-sim: k=10, since every input of TAG failed" in (
        results["rules-sim"].notes
    )


class UnreadableVFR(NPOVFakeChatModel):
    """Answers the VFR judge with prose it cannot read."""

    def _answer(self, prompt: str) -> Any:
        if "The rewrite to grade" in prompt:
            return AIMessage("I think it is better now.")
        return super()._answer(prompt)


async def test_a_failed_vfr_judgment_keeps_the_llm_free_scores() -> None:
    model = UnreadableVFR(neutral={p.biased: p.neutral for p in PAIRS})
    [tag] = await aevaluate(
        npov_task(PAIRS),
        methods=["tag"],
        judge_model=model,
        executor_model=model,
        embeddings=HashingFakeEmbeddings(),
    )
    assert tag.failures == 0
    assert tag.metrics["exact_match"] == 1.0
    # p1 and p2 were rewritten and their judgments failed; p3's copy passed
    # through without a call (VFR 0).
    assert tag.metrics["vfr"] == 0.0
    assert "VFR: 2 judgments failed (see the log), left out of the VFR means" in (
        tag.notes
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["all", "--rulebook", "r.json"], "--rulebook: not an option of tag eval all"),
        (
            ["nba", "--suite", "phases", "--nba-rulebook", "r.json"],
            "drop --nba-rulebook",
        ),
        (["nba", "--suite", "phases", "--estimate"], "drop --estimate"),
        (
            ["custom", "--rulebook", "r", "--inputs", "i", "--suite", "2x2"],
            "a custom task has only its rulebook",
        ),
        (["nba", "--estimate", "--price-in", "1"], "go together"),
        (["nba", "--estimate", "--price-in", "1", "--price-out", "-1"], ">= 0"),
    ],
)
def test_cli_refuses_options_a_run_would_ignore(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["eval", *argv]) == 2
    assert message in capsys.readouterr().err
