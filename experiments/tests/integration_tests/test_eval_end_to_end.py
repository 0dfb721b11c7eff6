"""`tag eval` end to end over HTTP: ChatOpenAI from the environment, a loopback server.

The server answers with deterministic fakes (judge, executor, VFR judge), so the
whole path a user runs, from the command line to the report files, is exercised
offline. Figures are the fakes', not a model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_tag_experiments.evaluation.datasets import load_wnc
from langchain_tag_experiments.evaluation.methods import standard_methods

from langchain_tag import Rule, Rulebook, cli
from langchain_tag.rule_schemas import NBA_SCHEMA
from langchain_tag.testing import (
    ExtractionFakeChatModel,
    FakeOpenAIServer,
    NPOVFakeChatModel,
    RuleAwareFakeChatModel,
)

FAKE_EMBEDDINGS = "langchain_tag.testing.embeddings:HashingFakeEmbeddings"
LIMIT = 3


def _rows(out: Path) -> dict[str, dict[str, Any]]:
    rows = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return {row["method"]: row for row in rows}


def _point_at(monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    monkeypatch.setenv("TAG_MODEL", "fake")


def _argv(task: str, out: Path, *extra: str) -> list[str]:
    return [
        *("eval", task, "--limit", str(LIMIT), "--out", str(out)),
        *("--embeddings", FAKE_EMBEDDINGS, "--no-embedding-cache", "--no-plot"),
        *extra,
    ]


def test_every_npov_method_and_the_vfr_judge_over_http(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = load_wnc(data_dir)[:LIMIT]
    model = NPOVFakeChatModel(neutral={p.biased: p.neutral for p in pairs})
    out = tmp_path / "out"
    with FakeOpenAIServer(model) as server:
        _point_at(monkeypatch, server)
        assert cli.main(_argv("npov", out, "--data-dir", str(data_dir))) == 0
        requests = len(server.requests)
    rows = _rows(out)
    ran = {name for name, row in rows.items() if row["status"] == "ok"}
    # Everything but what needs gold labels (none in WNC) or a cheap judge.
    assert ran == {m.name for m in standard_methods("npov")} - {
        "oracle",
        "oracle-decision",  # no gold labels
        "oracle+hybrid-n40",
        "oracle+learned",
        "tag+learned",
        "tag-cascade",
        "tag-decision",
    }
    for name in ran:
        row = rows[name]
        assert (row["n"], row["failures"], row["malformed"]) == (LIMIT, 0, 0), row
        assert row["executor_calls"] == LIMIT
        assert row["vfr"] is not None
        assert row["bleu"] is not None
    # Every request was a judgment, an execution or a VFR grading, all counted.
    assert requests == sum(rows[n]["llm_calls"] + rows[n]["grader_calls"] for n in ran)
    assert rows["m0-no-retrieval"]["grader_calls"] == 0  # copies: pass-through


def nba_rulebook() -> Rulebook:
    """An 'extracted' rulebook in the NBA matcher's schema, mapped by metadata."""
    return Rulebook.from_rules(
        [
            Rule(
                rule_id=f"R-{n:03d}",
                name=f"{label.replace('_', ' ')} rule",
                condition=f"The transaction uses the `{word}`",
                applies_when=f"The transaction uses the `{word}`",
                constraint="The amounts stay within the limits.",
                violation_check="Compare the amounts with the limits.",
                does_not_apply_to="Other transactions.",
                action=f"Check the {word} limits.",
                metadata={"catalogue_id": label},
            )
            for n, (label, word) in enumerate(
                [
                    ("salary_cap_no_exceed_without_exception", "salary cap"),
                    ("standard_traded_player_exception", "traded player exception"),
                    ("mid_level_exception", "mid-level"),  # maps nowhere
                ]
            )
        ]
    )


def test_nba_with_an_extracted_rulebook_over_http(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "nba.rulebook.json"
    nba_rulebook().save(path)
    out = tmp_path / "out"
    with FakeOpenAIServer(RuleAwareFakeChatModel()) as server:
        _point_at(monkeypatch, server)
        argv = _argv(
            "nba",
            out,
            *("--data-dir", str(data_dir), "--nba-rulebook", str(path)),
            *("--methods", "m1-*,tag,rules-sim,oracle"),
        )
        assert cli.main(argv) == 0
        judged = [
            r
            for r in server.requests
            if '"applicable"' in " ".join(str(m["content"]) for m in r["messages"])
        ]
    rows = _rows(out)
    tag = rows["tag"]
    # The rules carry the constraint schema: the NBA matcher profile judged them.
    assert len(judged) >= LIMIT * 3
    assert tag["status"] == "ok"
    assert tag["llm_calls"] == LIMIT * 3 + LIMIT  # judgments + executions
    # The fake executor echoes its prompt: every answer malformed, scored wrong.
    assert tag["malformed"] == LIMIT
    assert tag["strict_accuracy"] == 0.0
    assert tag["strict_l0"] == 0.0
    # Two rules map onto the catalogue; the labels they cover are in every gold.
    assert tag["recall_micro"] is not None
    assert any("through the 2 of 3 rules" in note for note in tag["notes"])
    assert "rules-sim: k=" in " ".join(rows["rules-sim"]["notes"])


def test_an_nba_rulebook_extracted_in_the_nba_schema_is_judged_by_its_matcher(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `tag extract --schema nba` on the CBA, then `tag eval nba --nba-rulebook`,
    # each over HTTP to a loopback server playing the model.
    path = tmp_path / "nba.rulebook.json"
    cba = data_dir / "rulearena_nba" / "reference_rules.txt"
    with FakeOpenAIServer(ExtractionFakeChatModel()) as server:
        _point_at(monkeypatch, server)
        argv = ["extract", "--schema", "nba", str(cba), "-o", str(path)]
        assert cli.main([*argv, "--domain", "NBA CBA", "--no-checkpoint", "-q"]) == 0
    rulebook = Rulebook.load(path)
    assert rulebook.rule_schema == NBA_SCHEMA
    assert len(rulebook) > 50
    assert all(r.applies_when and r.constraint for r in rulebook.rules)
    out = tmp_path / "out"
    with FakeOpenAIServer(RuleAwareFakeChatModel()) as server:
        _point_at(monkeypatch, server)
        argv = _argv(
            "nba",
            out,
            *("--data-dir", str(data_dir), "--nba-rulebook", str(path)),
            *("--methods", "tag"),
        )
        assert cli.main(argv) == 0
        prompts = [
            " ".join(str(m["content"]) for m in r["messages"]) for r in server.requests
        ]
    judged = [p for p in prompts if '"applicable"' in p]
    # Every rule judged for every input, by the NBA matcher's profile.
    assert len(judged) == LIMIT * len(rulebook)
    assert all("violation_check" in p for p in judged)
    assert all(r.action not in p for r in rulebook.rules[:20] for p in judged)
    assert _rows(out)["tag"]["status"] == "ok"
