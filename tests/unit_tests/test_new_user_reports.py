"""Regressions for what a new user hit (each test failed on the code it fixed).

Tried against an OpenAI-compatible server on loopback, the README quickstart, the
CLI and the query graph; see the comment on each test for what went wrong before.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from langchain_tag import ApplicabilityJudge, Rule, Rulebook, TAGRetriever, cli
from langchain_tag.query_graph import QueryContext, build_query_graph
from langchain_tag.rules import RulebookError
from langchain_tag.testing import (
    ExtractionFakeChatModel,
    RuleAwareFakeChatModel,
    trigger_rulebook,
)

RULEBOOK = str(Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json")
QUERY = "trigger-000 trigger-001 trigger-002"


def retriever(**kwargs: Any) -> tuple[TAGRetriever, RuleAwareFakeChatModel]:
    model = RuleAwareFakeChatModel()
    return TAGRetriever(rulebook=trigger_rulebook(5), llm=model, **kwargs), model


# --- per-call options are checked before anything is judged ---------------------------


def test_every_applicable_rule_comes_back_without_k() -> None:
    tag, _ = retriever()
    assert len(tag.invoke(QUERY)) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # Before: kept[:-1] silently dropped the last of three matches.
        ({"k": -1}, "k must be None or an integer >= 0"),
        # Before: a slicing TypeError after all five rules had been judged.
        ({"k": "2"}, "k must be None or an integer >= 0"),
        ({"k": 1.5}, "k must be None or an integer >= 0"),
        ({"k": True}, "k must be None or an integer >= 0"),
        ({"score_threshold": 1.5}, r"score_threshold must be .* in \[0, 1\]"),
        ({"score_threshold": -0.1}, r"score_threshold must be .* in \[0, 1\]"),
    ],
)
async def test_bad_per_call_options_fail_before_any_model_call(
    options: dict[str, Any], message: str
) -> None:
    tag, model = retriever()
    with pytest.raises(ValueError, match=message):
        tag.invoke(QUERY, **options)
    with pytest.raises(ValueError, match=message):
        await tag.ainvoke(QUERY, **options)
    with pytest.raises(ValueError, match=message):
        tag.match(QUERY, **options)
    assert model.calls == 0


def test_unknown_per_call_keywords_are_refused() -> None:
    # Before: silently ignored, so a typo (`treshold`) changed nothing.
    tag, model = retriever()
    with pytest.raises(TypeError, match=r"unknown keyword argument.*treshold"):
        tag.invoke(QUERY, treshold=0.5)
    assert model.calls == 0


def test_query_context_refuses_a_negative_k() -> None:
    with pytest.raises(ValueError, match="k must be None or an integer >= 0"):
        QueryContext(k=-1)
    with pytest.raises(ValueError, match="score_threshold"):
        QueryContext(score_threshold=2)
    assert QueryContext(k=0, score_threshold=1).k == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-k", "-1"], "argument -k: must be an integer >= 0, got '-1'"),
        (["-k", "1.5"], "argument -k: must be an integer >= 0, got '1.5'"),
        (
            ["--max-concurrency", "0"],
            "argument --max-concurrency: must be an integer >= 1, got '0'",
        ),
        (["--score-threshold", "2"], "argument --score-threshold: must be a number"),
    ],
)
def test_tag_run_names_the_bad_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: `-k -1` printed "matched 0 of 9" and exited 0; `--max-concurrency 0`
    # said "max_workers must be greater than 0".
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", RULEBOOK, "x", *argv])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


# --- ids checked at use ---------------------------------------------------------------


def test_a_duplicate_id_added_after_construction_is_refused() -> None:
    # Before: the dict of ids kept the later rule, so the rule that matched was
    # reported with the other rule's name and action.
    tag, model = retriever()
    first = tag.rulebook.rules[0]
    tag.rulebook.rules.append(
        first.model_copy(update={"condition": "never", "action": "Do the other"})
    )
    with pytest.raises(RulebookError, match=r"'R-000' is used by more than one rule"):
        tag.invoke(QUERY)
    assert model.calls == 0


# --- the run config's max_concurrency -------------------------------------------------


def test_the_run_configs_max_concurrency_is_honoured() -> None:
    # Before: `config={"max_concurrency": 1}` was ignored: 8 judgments in flight.
    model = RuleAwareFakeChatModel(latency=0.05)
    judge = ApplicabilityJudge(llm=model, cache=None)  # every call reaches the model
    tag = TAGRetriever(rulebook=trigger_rulebook(6), judge=judge)
    tag.invoke(QUERY)
    assert model.peak_in_flight > 1  # the retriever's own bound is 8

    model.reset()
    tag.invoke(QUERY, config={"max_concurrency": 1})
    assert model.peak_in_flight == 1

    model.reset()
    tag.batch([QUERY, "trigger-004"], config={"max_concurrency": 1})
    assert model.peak_in_flight == 1

    model.reset()
    tag.invoke(QUERY, config={"max_concurrency": 2})
    assert model.peak_in_flight == 2


async def test_the_run_configs_max_concurrency_is_honoured_async() -> None:
    model = RuleAwareFakeChatModel(latency=0.05)
    judge = ApplicabilityJudge(llm=model, cache=None)
    tag = TAGRetriever(rulebook=trigger_rulebook(6), judge=judge)
    await tag.abatch([QUERY, "trigger-004"], config={"max_concurrency": 1})
    assert model.peak_in_flight == 1


# --- rough edges ----------------------------------------------------------------------


@pytest.mark.parametrize("rulebook", [Rulebook(), trigger_rulebook(2)])
def test_a_non_string_query_gets_a_clear_type_error(rulebook: Rulebook) -> None:
    # Before, with nothing to judge: TypeError: unhashable type: 'slice'.
    tag = TAGRetriever(rulebook=rulebook, llm=RuleAwareFakeChatModel())
    with pytest.raises(TypeError, match="The query must be a str, got dict"):
        tag.invoke({"question": "x"})  # type: ignore[arg-type]


def test_a_lone_surrogate_is_refused_with_the_fix() -> None:
    # Before: UnicodeEncodeError deep inside the cache key's hashing.
    tag, model = retriever()
    broken = "trigger-000 \udcff"
    with pytest.raises(ValueError, match=r"lone surrogate '\\udcff' at position 12"):
        tag.invoke(broken)
    with pytest.raises(ValueError, match="lone surrogate"):
        ApplicabilityJudge(llm=model).invoke((broken, tag.rulebook.rules[0]))
    assert model.calls == 0


@pytest.mark.parametrize("version", [0, -1])
def test_a_format_version_below_one_is_refused(version: int) -> None:
    data = Rulebook().model_dump(mode="json") | {"format_version": version}
    with pytest.raises(RulebookError, match="format_version"):
        Rulebook.from_data(data)


def test_score_threshold_without_scores_warns_once() -> None:
    # Before: the threshold silently did nothing (unscored verdicts rank as 1.0).
    tag, _ = retriever(score_threshold=0.5)
    with pytest.warns(UserWarning, match="no effect on verdicts without a score"):
        assert len(tag.invoke(QUERY)) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tag.invoke(QUERY)


def test_the_query_graph_names_the_bad_field_of_a_rulebook() -> None:
    # Before: a raw pydantic ValidationError.
    data = trigger_rulebook(2).model_dump(mode="json")
    data["rules"][1]["condition"] = None
    graph = build_query_graph()
    with pytest.raises(
        RulebookError, match=r"rules\[1\]\.condition \(rule_id 'R-001'\)"
    ):
        graph.invoke(
            {"query": "x", "rulebook": data},
            context=QueryContext(judge_model=RuleAwareFakeChatModel()),
        )


UNREADABLE = Rule(
    rule_id="R-1", name="Anything", condition="The input is text", action="Act"
)


def test_tag_run_advice_fits_the_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: "try again later" for an answer that cannot be read (deterministic at
    # temperature 0), and JudgmentError's advice named an option `tag run` lacked.
    path = str(Rulebook(rules=[UNREADABLE]).save(tmp_path / "r.json"))
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: FakeListChatModel(responses=["Perhaps."] * 4),
    )
    assert cli.main(["run", path, "x"]) == 2
    error = capsys.readouterr().err
    assert "try again later" not in error
    assert "--on-error not_applicable" in error

    with pytest.warns(UserWarning, match="judgments failed"):
        assert cli.main(["run", path, "x", "--on-error", "not_applicable"]) == 0
    out = capsys.readouterr().out
    assert "matched 0 of 1 rules" in out
    assert "1 judgment(s) failed and were treated as not applicable" in out


# --- tag extract -o checked before the first model call -------------------------------


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (".", "is a directory"),
        ("doc.md/rulebook.json", "is not a directory"),
    ],
)
def test_tag_extract_checks_the_output_path_first(
    output: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: a raw traceback after the whole extraction had run (and been paid).
    monkeypatch.chdir(tmp_path)
    Path("doc.md").write_text("# Rules\n\nImports must be on separate lines.\n")
    model = ExtractionFakeChatModel()
    monkeypatch.setattr("langchain_tag.models.default_chat_model", lambda **_: model)
    code = cli.main(["extract", "doc.md", "-o", output, "--no-checkpoint", "-q"])
    assert code == 2
    assert message in capsys.readouterr().err
    assert model.calls == 0
