"""`tag eval` (`langchain_tag_experiments.cli`): its tables, advice and warnings.

A custom labelled set written to a temporary directory stands for the data; the
`requires_data` test runs the command on the real NBA dev set when it is present.
"""

from __future__ import annotations

import csv
import functools
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import Rule, Rulebook, cli
from langchain_tag.errors import UnreliableMatchWarning
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.testing import RuleAwareFakeChatModel, TransientFakeError

FAKE_EMBEDDINGS = "langchain_tag.testing.embeddings:HashingFakeEmbeddings"
WORDS = ("refund", "invoice", "password", "delivery")
RECORDS = [
    {"input": "I want a refund for my invoice", "applicable": ["R0", "R1"]},
    {"input": "reset my password please", "applicable": ["R2"]},
    {"input": "where is my delivery", "applicable": ["R3"]},
    {"input": "hello there", "applicable": []},
]


@pytest.fixture
def custom(tmp_path: Path) -> list[str]:
    """`tag eval custom` arguments for four rules and four labelled inputs."""
    rulebook = tmp_path / "rules.json"
    Rulebook.from_rules(
        [
            Rule(
                rule_id=f"R{i}",
                name=f"rule about {word}",
                condition=f"The request mentions `{word}`",
                action=f"Handle the {word}.",
            )
            for i, word in enumerate(WORDS)
        ]
    ).save(rulebook)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), "utf-8")
    return [
        *("eval", "custom", "--rulebook", str(rulebook), "--inputs", str(inputs)),
        *("--embeddings", FAKE_EMBEDDINGS, "--no-embedding-cache", "--no-plot"),
        *("--out", str(tmp_path / "out")),
    ]


def table_row(markdown: str, method: str) -> dict[str, str]:
    """The cells of `method`'s row in the first results table, by heading."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method |"))
    headings = [c.strip() for c in lines[start].strip("|").split("|")]
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == method:
            return dict(zip(headings, cells, strict=True))
    pytest.fail(f"no row for {method}")


# --- item 1: the oracle's answers are look-ups, not LLM calls ------------------------


def test_offline_oracle_rows_count_lookups_not_llm_calls(
    custom: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "LLM calls" 16 for the oracle, which calls no model.
    argv = [*custom, "--offline", "--methods", "m1-*,oracle"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    oracle = table_row(out, "oracle")
    assert oracle["LLM calls"] == "0"
    assert oracle["oracle look-ups"] == "16"  # 4 inputs x 4 rules
    assert oracle["calls/input"] == "0.000"
    assert table_row(out, "m1-all-rules")["oracle look-ups"] == "0"
    assert (
        "Oracle look-ups of oracle: 16 (4.0 per input), answered from the gold "
        "labels, not LLM calls: no model ran, no tokens, nothing paid. A judge "
        "model in the oracle's place would make 16 calls, at its price."
    ) in out
    # The files count them as the table does: look-ups, not LLM calls. Before:
    # their llm_calls was 16, the look-ups counted as calls.
    rows = json.loads((Path(custom[-1]) / "results.json").read_text())
    [saved] = [r for r in rows if r["method"] == "oracle"]
    assert (saved["llm_calls"], saved["oracle_lookups"]) == (0, 16)
    with (Path(custom[-1]) / "results.csv").open(encoding="utf-8") as handle:
        [row] = [r for r in csv.DictReader(handle) if r["method"] == "oracle"]
    assert (row["llm_calls"], row["oracle_lookups"]) == ("0", "16")


def test_tables_without_the_oracle_have_no_lookups_column(
    custom: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*custom, "--offline", "--methods", "m1-*"]) == 0
    out = capsys.readouterr().out
    assert "oracle look-ups" not in out
    assert "Oracle look-ups" not in out


@pytest.mark.requires_data
def test_nba_offline_oracle_is_labelled_as_lookups(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        *("eval", "nba", "--data-dir", str(data_dir), "--offline", "--limit", "2"),
        *("--methods", "oracle", "--embeddings", FAKE_EMBEDDINGS),
        *("--no-embedding-cache", "--no-plot", "--out", str(tmp_path / "out")),
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    oracle = table_row(out, "oracle")
    # 55 catalogue rules judged per problem.
    assert (oracle["LLM calls"], oracle["oracle look-ups"]) == ("0", "110")
    assert "a judge model in the oracle's place would make 110 calls" in out.lower()


@pytest.mark.requires_data
def test_one_input_leaves_out_the_learned_methods_saying_why(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "k-fold needs at least 2 folds" after the other methods had run.
    argv = [
        *("eval", "nba", "--data-dir", str(data_dir), "--offline", "--limit", "1"),
        *("--methods", "oracle,oracle+learned", "--embeddings", FAKE_EMBEDDINGS),
        *("--no-embedding-cache", "--no-plot", "--out", str(tmp_path / "out")),
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "oracle+learned: needs at least 2 inputs" in out
    assert table_row(out, "oracle")["LLM calls"] == "0"


# --- item 2: advice in the command's own options -------------------------------------


@pytest.mark.parametrize(
    ("fault", "advice"),
    [
        ("Perhaps.", "use a stronger judge model (--judge-model, or judge_model=)"),
        (
            TransientFakeError(headers={"retry-after": "0"}),
            "run again later, or with fewer calls in flight (--max-concurrency",
        ),
    ],
)
def test_failure_advice_names_only_options_tag_eval_has(
    fault: Exception | str,
    advice: str,
    custom: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: "retry later, or set on_error='not_applicable'" for every failure;
    # tag eval has no such option, and an unreadable answer comes again.
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: RuleAwareFakeChatModel(faults={"R1": [fault] * 40}),
    )
    assert cli.main([*custom, "--methods", "tag"]) == 0
    captured = capsys.readouterr()
    assert "Failures of tag: 4, the first: retrieval: JudgmentError" in captured.out
    assert advice in captured.out
    assert "on_error" not in captured.out + captured.err
    if isinstance(fault, str):
        assert "retry later" not in captured.out
        assert "run again later" not in captured.out


# --- item 3: one line for failed judgments -------------------------------------------


def test_failed_judgments_are_summed_in_one_line(
    custom: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # TAG's judge flags failures instead of raising, as under --on-error.
    lenient: Any = functools.partial(ApplicabilityJudge, on_error="not_applicable")
    monkeypatch.setattr(
        "langchain_tag_experiments.evaluation.methods.ApplicabilityJudge", lenient
    )
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: RuleAwareFakeChatModel(faults={"R1": ["Perhaps."] * 40}),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreliableMatchWarning)  # none escapes
        assert cli.main([*custom, "--methods", "tag"]) == 0
    warned = [
        line for line in capsys.readouterr().err.splitlines() if "warning" in line
    ]
    # Before: a warning per input (four), each with a source line.
    assert warned == [
        (
            "tag eval: warning: 4 judgments failed and were treated as not "
            "applicable; rules: R1."
        )
    ]


# --- the estimate: cached input tokens, list and batch prices -----------------------


def test_estimate_prints_cached_tokens_at_list_and_batch_prices(
    custom: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    prices = ("--price-in", "2", "--price-out", "8", "--price-cached-input", "0.5")
    argv = [*custom, "--estimate", "--methods", "tag", *prices]
    # OpenAI's 1,024-token minimum: the short prompts here are never cached.
    assert cli.main(argv) == 0
    plain = table_row(capsys.readouterr().out, "tag")
    assert plain["cached input"] == "0"
    # A provider caching 32-token prefixes serves what the judgments share.
    assert cli.main([*argv, "--cache-min-tokens", "32"]) == 0
    out = capsys.readouterr().out
    tag = table_row(out, "tag")
    assert tag["input tokens"] == plain["input tokens"]
    cached = int(tag["cached input"].replace(",", ""))
    assert 0 < cached < int(tag["input tokens"].replace(",", ""))
    assert float(tag["USD"].strip("$")) < float(plain["USD"].strip("$"))
    assert float(tag["USD batch"].strip("$")) == pytest.approx(
        float(tag["USD"].strip("$")) / 2, abs=1e-4
    )
    assert "$0.5 per million cached input tokens" in out
    assert "once that prefix reaches 32 tokens" in out
    assert cli.main([*argv, "--batch-discount", "0.25"]) == 0
    quarter = table_row(capsys.readouterr().out, "tag")
    assert float(quarter["USD batch"].strip("$")) == pytest.approx(
        float(plain["USD"].strip("$")) * 0.75, abs=1e-4
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--estimate", "--price-cached-input", "1"], "beside --price-in"),
        (
            [
                *("--estimate", "--price-in", "1", "--price-out", "2"),
                *("--price-cached-input", "-1"),
            ],
            ">= 0 (got -1.0)",
        ),
        (["--batch-discount", "0.5"], "--batch-discount: options of --estimate"),
        (["--estimate", "--batch-discount", "1"], "from 0 to below 1"),
        (["--estimate", "--cache-min-tokens", "0"], "at least 1, got 0"),
    ],
)
def test_estimate_price_options_are_checked(
    custom: list[str],
    options: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([*custom, *options]) == 2
    assert message in capsys.readouterr().err


# --- a decision model: tag-decision, oracle-decision -------------------------------


def test_decision_model_is_refused_offline(
    custom: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*custom, "--offline", "--decision-model", "gpt-6-luna"]) == 2
    assert "drop --judge-model, --executor-model, --cheap-judge-model and " in (
        capsys.readouterr().err
    )


def test_offline_oracle_decision_counts_one_lookup_per_input(
    custom: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*custom, "--offline", "--methods", "tag-decision,oracle-decision"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    row = table_row(out, "oracle-decision")
    # Four inputs, their four rules asked in one request each.
    assert (row["LLM calls"], row["oracle look-ups"]) == ("0", "4")
    assert int(row["tokens in"]) > 0
    assert row["tokens out"] == "0"
    assert "tag-decision: needs a decision model: pass --decision-model NAME" in out


@pytest.mark.filterwarnings("ignore:The class `OpenAIClassifier` is in beta")
def test_tag_decision_runs_with_a_decision_model(
    custom: list[str],
    loopback: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from langchain_tag.testing.decisions import FakeDecisionsServer  # noqa: PLC0415

    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: RuleAwareFakeChatModel(),
    )
    argv = [*custom, "--methods", "tag-decision,oracle", "--decision-model", "luna"]
    with FakeDecisionsServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        assert cli.main(argv) == 0
    assert server.request_count == 4  # one request per input
    rows = {
        r["method"]: r
        for r in json.loads((Path(custom[-1]) / "results.json").read_text())
    }
    tag, oracle = rows["tag-decision"], rows["oracle"]
    assert tag["status"] == "ok"
    assert tag["llm_calls"] == 4 + tag["executor_calls"]
    assert tag["recall_micro"] == oracle["recall_micro"] == 1.0
    assert table_row(capsys.readouterr().out, "tag-decision")["failures"] == "0"


def test_estimate_with_a_decision_model_estimates_tag_decision(
    custom: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    prices = ("--price-in", "0.15", "--price-out", "0.60")
    argv = [*custom, "--estimate", "--methods", "tag-decision,oracle-decision"]
    # No key is needed: an estimate builds no model.
    assert cli.main([*argv, *prices, "--offline"]) == 0
    offline = capsys.readouterr().out
    assert (
        "skipped: needs a decision model" in table_row(offline, "tag-decision")["notes"]
    )
    assert cli.main([*argv, *prices, "--decision-model", "gpt-6-luna"]) == 0
    out = capsys.readouterr().out
    tag, oracle = table_row(out, "tag-decision"), table_row(out, "oracle-decision")
    assert tag["judge calls"] == "4"  # requests: an input's rules in one each
    assert tag["calls"] == str(4 + int(tag["executor calls"]))
    assert oracle["judge calls"] == "0"
    # The same requests and executor prompts (the gold rules stand for the
    # decision model's picks): the same tokens, priced alike. Only the
    # executor's answers have output tokens.
    for column in ("input tokens", "output tokens", "USD"):
        assert tag[column] == oracle[column], column
    assert tag["USD"] != "$0"
    assert "decision oracle's count the input tokens" in out
