"""`tag run RULEBOOK --inputs IN.jsonl -o OUT.jsonl`: a corpus, resumable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import Rulebook, cli
from langchain_tag.testing import (
    BatchScript,
    FakeAnthropicBatchServer,
    FakeBatchServer,
    RuleAwareFakeChatModel,
)

RULEBOOK = str(Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json")
INPUTS = {
    "a": "from os import *\n",
    "b": "square = lambda x: x * x\n",
    "c": "print('hello')\n",
}


@pytest.fixture
def models(monkeypatch: pytest.MonkeyPatch) -> list[RuleAwareFakeChatModel]:
    made: list[RuleAwareFakeChatModel] = []

    def model(**kwargs: Any) -> RuleAwareFakeChatModel:
        made.append(RuleAwareFakeChatModel())
        return made[-1]

    monkeypatch.setattr("langchain_tag.models.default_chat_model", model)
    return made


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(json.dumps({"id": k, "input": v}) + "\n" for k, v in INPUTS.items())
    )
    return path


@pytest.fixture
def batch_api(
    loopback: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeBatchServer]:
    """A loopback Batch API, where the environment's model points."""
    with FakeBatchServer(RuleAwareFakeChatModel()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "unused")
        yield server


@pytest.fixture
def anthropic_api(
    loopback: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeAnthropicBatchServer]:
    """Anthropic's loopback Messages and Message Batches, where ChatAnthropic points."""
    with FakeAnthropicBatchServer(RuleAwareFakeChatModel()) as server:
        monkeypatch.delenv("ANTHROPIC_API_URL", raising=False)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "unused")
        yield server


def _records(path: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_a_bulk_run_writes_records_and_a_rerun_resumes(
    tmp_path: Path,
    inputs: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    assert cli.main(["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert f"3 input(s) written to {out}" in printed.out
    assert "judgments: 27 (0 from the cache); executor calls: 3; via online" in (
        printed.out
    )
    assert "tag run: 3/3 inputs (100%)" in printed.err  # progress, not a terminal
    records = _records(out)
    assert records["a"]["matched"] == ["PEP8-IMPORT-WILDCARD"]
    assert "answer" in records["a"]
    assert (tmp_path / "out.jsonl.cache.sqlite").exists()  # the default cache
    assert (tmp_path / "out.jsonl.run.json").exists()  # the manifest

    assert cli.main(["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out)]) == 0
    assert "0 input(s) written to" in (again := capsys.readouterr().out)
    assert "(3 already there, skipped)" in again
    assert models[-1].calls == 0


def test_match_only_and_a_shard(
    tmp_path: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    inputs = tmp_path / "in.jsonl"
    ids = [f"id-{n}" for n in range(10)]
    inputs.write_text(
        "".join(json.dumps({"id": i, "input": f"x = {i!r}"}) + "\n" for i in ids)
    )
    written: list[str] = []
    for shard in ("1/2", "2/2"):
        out = tmp_path / f"out.{shard[0]}.jsonl"
        argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out)]
        assert cli.main([*argv, "--match-only", "--shard", shard]) == 0
        records = _records(out)
        assert all("answer" not in r for r in records.values())
        written += records
    assert sorted(written) == sorted(ids)
    assert sum(m.calls for m in models) == 90  # judgments only


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "nothing to run: give the input text"),
        (["x", "--inputs", "IN"], "give one input"),
        (["x", "--match-only"], "--match-only goes with --inputs"),
        (["--inputs", "IN"], "--inputs needs -o OUT.jsonl"),
    ],
)
def test_bulk_options_are_checked(
    argv: list[str],
    message: str,
    inputs: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [str(inputs) if a == "IN" else a for a in argv]
    assert cli.main(["run", RULEBOOK, *argv]) == 2
    assert message in capsys.readouterr().err
    assert not models  # refused before any model was made


def test_a_bad_input_line_is_named_without_a_traceback(
    tmp_path: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"id": "a", "input": "x"}\n{"id": "b"}\n')
    out = tmp_path / "out.jsonl"
    assert cli.main(["run", RULEBOOK, "--inputs", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, line 2: no 'input' key" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_a_bad_shard_is_an_argument_error(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(
            ["run", RULEBOOK, "--inputs", str(inputs), "-o", "o", "--shard", "3/2"]
        )
    assert stopped.value.code == 2
    assert "argument --shard: shard 3/2 does not exist" in capsys.readouterr().err


def test_other_settings_on_an_existing_output_are_refused(
    tmp_path: Path,
    inputs: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out), "--match-only"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert cli.main([*argv, "-k", "1"]) == 2
    err = capsys.readouterr().err
    assert "was written by a job with other settings" in err
    assert "write to another file" in err


def test_estimate_prices_what_is_left_and_calls_nothing(
    tmp_path: Path,
    inputs: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out)]
    prices = ["--price-in", "2", "--price-out", "8"]
    before = sorted(tmp_path.iterdir())
    log = ["--verdict-log", str(tmp_path / "log.sqlite")]
    assert cli.main([*argv, "--estimate", *prices, *log]) == 0
    # An estimate writes nothing: no output, no cache file, no verdict log.
    assert sorted(tmp_path.iterdir()) == before
    printed = capsys.readouterr().out
    assert "estimate for 3 input(s) to do; no model was called" in printed
    assert "judgments: 27 pairs, 0 already in the verdict cache; 27 judge call(s)" in (
        printed
    )
    assert "executor calls: 3" in printed
    assert "at list prices" in printed
    assert "at batch prices" in printed
    assert all(m.calls == 0 for m in models)
    assert not out.exists()  # an estimate writes nothing

    # Another job sharing the cache paid for these verdicts: they cost nothing.
    cache = str(tmp_path / "shared.sqlite")
    other = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(tmp_path / "o.jsonl")]
    assert cli.main([*other, "--cache", cache, "--match-only"]) == 0
    capsys.readouterr()
    assert cli.main([*argv, "--cache", cache, "--estimate"]) == 0
    printed = capsys.readouterr().out
    assert "27 pairs, 27 already in the verdict cache; 0 judge call(s)" in printed
    assert "give --price-in and --price-out" in printed


def test_estimate_needs_inputs(
    models: list[RuleAwareFakeChatModel], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", RULEBOOK, "x", "--estimate"]) == 2
    assert "--estimate goes with --inputs" in capsys.readouterr().err


def test_via_batch_against_a_loopback_batch_api(
    tmp_path: Path,
    inputs: Path,
    batch_api: FakeBatchServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out)]
    batch = ["--via", "batch", "--poll-interval", "0", "--batch-max-requests", "10"]
    assert cli.main([*argv, *batch]) == 0
    assert batch_api.hits.get("POST /v1/chat/completions", 0) == 0
    # 27 judgments in files of 10 at most, then the 3 executions in one.
    assert batch_api.hits["POST /v1/batches"] == 3 + 1
    printed = capsys.readouterr()
    assert "3 input(s) written" in printed.out
    assert "via batch" in printed.out
    assert "tag run: batch " in printed.err  # polls are shown
    assert _records(out)["a"]["matched"] == ["PEP8-IMPORT-WILDCARD"]


def test_batches_still_running_exit_75_and_resume(
    tmp_path: Path,
    inputs: Path,
    batch_api: FakeBatchServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out), "--match-only"]
    batch = [*argv, "--via", "batch", "--poll-interval", "0"]
    assert cli.main([*batch, "--max-wait", "0"]) == 75
    err = capsys.readouterr().err
    assert "still in running batches" in err
    assert "run the same command again later" in err
    assert not out.read_text()  # nothing written yet, nothing lost
    assert cli.main(batch) == 0
    assert batch_api.hits["POST /v1/batches"] == 1  # polled again, not re-sent
    assert sorted(_records(out)) == ["a", "b", "c"]


def test_a_torn_line_is_reported_and_an_estimate_leaves_it(
    tmp_path: Path,
    inputs: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out), "--match-only"]
    assert cli.main(argv) == 0
    torn = out.read_bytes()[:-10]
    out.write_bytes(torn)
    assert cli.main([*argv, "--estimate"]) == 0
    assert "estimate for 1 input(s) to do (2 already written)" in (
        capsys.readouterr().out
    )
    assert out.read_bytes() == torn  # an estimate changes nothing
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "1 input(s) written" in printed
    assert "the output's last line was torn" in printed


@pytest.mark.parametrize(
    "option",
    [
        ["--via", "batch"],
        ["--shard", "1/2"],
        ["--cache", "c.sqlite"],
        ["--learned-prefilter", "m.npz"],
    ],
)
def test_bulk_options_are_refused_for_one_input(
    option: list[str],
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["run", RULEBOOK, "x", *option]) == 2
    assert "goes with --inputs (a bulk run)" in capsys.readouterr().err
    assert not models


def test_the_inputs_file_is_no_output(
    inputs: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = inputs.read_bytes()
    assert cli.main(["run", RULEBOOK, "--inputs", str(inputs), "-o", str(inputs)]) == 2
    assert "is the --inputs file" in capsys.readouterr().err
    assert inputs.read_bytes() == before


def test_a_batch_api_failure_is_one_line(
    tmp_path: Path,
    inputs: Path,
    batch_api: FakeBatchServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out), "--match-only"]
    batch = [*argv, "--via", "batch", "--poll-interval", "0"]
    batch_api.scripts = [BatchScript(end="failed")]
    assert cli.main(batch) == 2
    err = capsys.readouterr().err
    assert "tag run: error: --via batch: The Batch API refused" in err
    assert "Traceback" not in err

    # No server at all: the files endpoint is unreachable.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert cli.main([*batch, "-o", str(tmp_path / "o2.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "does this endpoint serve OpenAI's /v1/files and /v1/batches?" in err
    assert "Traceback" not in err


def test_prefilter_options_need_the_prefilter(
    tmp_path: Path,
    inputs: Path,
    models: list[RuleAwareFakeChatModel],
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(tmp_path / "o.jsonl")]
    assert cli.main([*argv, "--explore", "0.1", "--target-recall", "0.9"]) == 2
    assert "--target-recall, --explore: options of --learned-prefilter" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        cli.main([*argv, "--target-recall", "0"])
    assert "must be a number in (0, 1]" in capsys.readouterr().err
    assert not models


def test_a_decision_model_judges_each_input_in_one_request(
    tmp_path: Path,
    inputs: Path,
    models: list[RuleAwareFakeChatModel],
    loopback: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from langchain_tag.testing.decisions import FakeDecisionsServer  # noqa: PLC0415

    out = tmp_path / "out.jsonl"
    with FakeDecisionsServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        command = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out)]
        decided = [*command, "--decision-model", "gpt-6-luna"]
        assert cli.main([*decided, "--match-only"]) == 0
        assert server.request_count == len(INPUTS)  # one request per input
        assert all(len(b["questions"]) == 9 for b in server.requests)
        assert _records(out)["a"]["matched"] == ["PEP8-IMPORT-WILDCARD"]
        assert "judgments: 27 (0 from the cache)" in capsys.readouterr().out
        assert models == []  # no chat model: match only
        # The executor is the chat model; the verdicts come from the cache.
        out2 = tmp_path / "answered.jsonl"
        answered = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out2)]
        cache = ["--cache", f"{out}.cache.sqlite", "--decision-model", "gpt-6-luna"]
        assert cli.main([*answered, *cache]) == 0
        assert server.request_count == len(INPUTS)
        assert "answer" in _records(out2)["a"]
        assert len(models) == 1


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        (["--decision-model", "m", "--logprobs"], "--logprobs judge with a chat"),
        (["--decision-model", "m", "--rules-per-call", "5"], "--rules-per-call"),
        (["--questions-per-request", "8"], "options of --decision-model"),
    ],
)
def test_decision_options_are_checked(
    tmp_path: Path,
    inputs: Path,
    extra: list[str],
    refused: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    command = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out), *extra]
    assert cli.main(command) == 2
    assert refused in capsys.readouterr().err


def test_via_batch_with_an_anthropic_model(
    tmp_path: Path,
    inputs: Path,
    anthropic_api: FakeAnthropicBatchServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = ["--model", "anthropic:claude-haiku-4-5"]
    argv = ["run", RULEBOOK, "--inputs", str(inputs), *model]
    assert cli.main([*argv, "-o", str(tmp_path / "online.jsonl")]) == 0
    online = _records(tmp_path / "online.jsonl")
    anthropic_api.requests.clear()
    out = tmp_path / "out.jsonl"
    batch = [*argv, "-o", str(out), "--via", "batch", "--poll-interval", "0"]
    assert cli.main(batch) == 0
    assert "via batch" in capsys.readouterr().out
    assert anthropic_api.hits["POST /v1/messages/batches"] == 2  # judge, execute
    records = _records(out)
    assert {k: r["matched"] for k, r in records.items()} == {
        k: r["matched"] for k, r in online.items()
    }
    assert records["a"]["matched"] == ["PEP8-IMPORT-WILDCARD"]
    # No judgment ever carries an action; the executions carry the matched ones.
    actions = [rule.action for rule in Rulebook.load(RULEBOOK).rules]
    judged = json.dumps(anthropic_api.batch_requests("msgbatch_1"))
    assert not [action for action in actions if action in judged]
    sent = json.dumps(anthropic_api.requests)
    matched = {m for r in records.values() for m in r["matched"]}
    unmatched = [
        r.action for r in Rulebook.load(RULEBOOK).rules if r.rule_id not in matched
    ]
    assert not [action for action in unmatched if action in sent]


def test_anthropic_batches_still_running_exit_75_and_resume(
    tmp_path: Path,
    inputs: Path,
    anthropic_api: FakeAnthropicBatchServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out), "--match-only"]
    batch = [*argv, "--model", "anthropic:claude-haiku-4-5", "--via", "batch"]
    assert cli.main([*batch, "--poll-interval", "0", "--max-wait", "0"]) == 75
    assert "still in running batches" in capsys.readouterr().err
    assert cli.main([*batch, "--poll-interval", "0"]) == 0
    assert anthropic_api.hits["POST /v1/messages/batches"] == 1  # polled, not re-sent
    assert anthropic_api.hits["POST /v1/messages"] == 0
    assert sorted(_records(out)) == ["a", "b", "c"]
    assert cli.main([*batch, "--service-tier", "flex"]) == 2
    assert "--service-tier is OpenAI's" in capsys.readouterr().err


def test_an_unreachable_anthropic_batch_api_is_one_line(
    tmp_path: Path,
    inputs: Path,
    loopback: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_URL", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "unused")
    out = tmp_path / "out.jsonl"
    argv = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(out), "--match-only"]
    model = ["--model", "anthropic:claude-haiku-4-5"]
    assert cli.main([*argv, *model, "--via", "batch", "--poll-interval", "0"]) == 2
    err = capsys.readouterr().err
    assert "does this endpoint serve Anthropic's /v1/messages/batches?" in err
    assert "Traceback" not in err
