"""Bulk jobs: inputs read strictly, shards, resumable output, manifest, failures."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from langchain_openai import ChatOpenAI

from langchain_tag import Rulebook
from langchain_tag.batch import BatchSettings
from langchain_tag.bulk import BulkInput, BulkJob, Shard, iter_records, read_inputs
from langchain_tag.cache import SQLiteVerdictCache
from langchain_tag.engine import MatchEngine, MatchOptions
from langchain_tag.errors import (
    BulkInputError,
    BulkJobMismatchError,
    BulkOutputBusyError,
    BulkRunError,
)
from langchain_tag.execution import ActionOnlyExecutor
from langchain_tag.learning import LearnedPrefilter
from langchain_tag.learning.verdict_log import SQLiteVerdictLog
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.models import CallRetry
from langchain_tag.testing import FakeBatchServer, FakeClock, RuleAwareFakeChatModel

RULEBOOK = Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json"
SNIPPETS = {
    "a": "from os import *\n",
    "b": "square = lambda x: x * x\n",
    "c": "print('hello')\n",
    "d": "from sys import *\nf = lambda: 0\n",
}


def _inputs(path: Path, items: dict[str, str] | None = None) -> Path:
    items = SNIPPETS if items is None else items
    path.write_text(
        "".join(json.dumps({"id": k, "input": v}) + "\n" for k, v in items.items())
    )
    return path


def _job(
    tmp_path: Path,
    model: RuleAwareFakeChatModel,
    *,
    match_only: bool = False,
    **changes: Any,
) -> BulkJob:
    rulebook = Rulebook.load(RULEBOOK)
    judge = ApplicabilityJudge(
        llm=model,
        cache=SQLiteVerdictCache(tmp_path / "cache.sqlite"),
        retry=CallRetry(max_attempts=1),
    )
    executor = None if match_only else ActionOnlyExecutor(llm=model)
    return BulkJob(MatchEngine(judge), rulebook.rules, executor, **changes)


# --- inputs --------------------------------------------------------------------------


def test_read_inputs_keeps_ids_as_given(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": 1, "input": "x"}\n\n{"id": "1", "input": "y", "k": 0}\n')
    items = read_inputs(path)
    assert [i.id for i in items] == [1, "1"]  # an int and a str are two ids
    assert [i.input for i in items] == ["x", "y"]


def test_read_inputs_keeps_line_separators_written_raw_in_strings(
    tmp_path: Path,
) -> None:
    # json.dumps(ensure_ascii=False) writes these raw; scraped text holds them.
    texts = ["a\u2028b", "c\u2029d", "e\u0085f", "g\x1ch\x1d\x1ei\x0bj\x0ck"]
    path = tmp_path / "in.jsonl"
    records = [
        json.dumps({"id": i, "input": t}, ensure_ascii=False)
        for i, t in enumerate(texts)
    ]
    path.write_text("\r\n".join(records) + "\r\n", encoding="utf-8", newline="")
    assert [i.input for i in read_inputs(path)] == texts
    path.write_text(records[0] + "\nnot json\n", encoding="utf-8")
    with pytest.raises(BulkInputError, match="line 2: not JSON"):
        read_inputs(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not json\n", "in.jsonl, line 1: not JSON"),
        (b'["a"]\n', "line 1: expected a JSON object"),
        (b'{"input": "x"}\n', "line 1: no 'id' key"),
        (b'{"id": "a", "input": 3}\n', 'line 1: "input" must be a string, got int'),
        (b'{"id": true, "input": "x"}\n', '"id" must be a string or an integer'),
        (
            b'{"id": "a", "input": "x"}\n{"id": "a", "input": "y"}\n',
            "line 2: id 'a' was already used on line 1",
        ),
        (b"\n\n", "no inputs"),
        (b'{"id": "a", "input": "caf\xe9"}\n', "is not UTF-8 text"),
    ],
)
def test_read_inputs_names_file_line_and_fix(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    with pytest.raises(BulkInputError, match=message.replace("(", r"\(")) as raised:
        read_inputs(path)
    assert "in.jsonl" in str(raised.value)


def test_read_inputs_from_a_stream_and_a_missing_file(tmp_path: Path) -> None:
    assert read_inputs(io.BytesIO(b'{"id": "a", "input": "x"}\n'))[0].id == "a"
    with pytest.raises(BulkInputError, match="cannot read the inputs"):
        read_inputs(tmp_path / "nope.jsonl")


# --- shards --------------------------------------------------------------------------


def test_shards_split_the_ids_disjointly_and_stably() -> None:
    items = [BulkInput(id=f"id-{n}", input="x") for n in range(300)]
    shards = [Shard(i, 3) for i in (1, 2, 3)]
    owners = [[s for s in shards if item in s] for item in items]
    assert all(len(owner) == 1 for owner in owners)
    sizes = [sum(item in s for item in items) for s in shards]
    assert min(sizes) > 60  # roughly even
    assert [item in Shard(2, 3) for item in items] == [
        item in Shard.parse("2/3") for item in items
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0/3", "shards are numbered 1 to N"),
        ("4/3", "shard 4/3 does not exist"),
        ("2", "expected I/N"),
        ("a/b", "expected I/N"),
    ],
)
def test_a_bad_shard_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Shard.parse(text)


# --- the job -------------------------------------------------------------------------


def test_a_job_writes_one_record_per_input(tmp_path: Path) -> None:
    model = RuleAwareFakeChatModel()
    out = tmp_path / "out.jsonl"
    summary = _job(tmp_path, model).run(
        read_inputs(_inputs(tmp_path / "in.jsonl")), out
    )
    records = {r["id"]: r for r in iter_records(out)}
    assert sorted(records) == ["a", "b", "c", "d"]
    assert records["a"]["matched"] == ["PEP8-IMPORT-WILDCARD"]
    assert set(records["d"]["matched"]) == {
        "PEP8-IMPORT-WILDCARD",
        "PEP8-LAMBDA-ASSIGN",
    }
    assert records["c"]["matched"] == []
    assert records["c"]["reason"].startswith("no rule's condition is satisfied")
    assert "Replace the wildcard import" in records["a"]["answer"]
    assert len(records["a"]["verdicts"]) == 9
    assert summary.done == 4
    assert summary.judgments == 36
    assert summary.executor_calls == 4
    assert model.calls == 36 + 4


def test_a_rerun_skips_written_ids_and_sends_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
    _job(tmp_path, RuleAwareFakeChatModel()).run(inputs, out)
    before = out.read_bytes()
    again = RuleAwareFakeChatModel()
    summary = _job(tmp_path, again).run(inputs, out)
    assert again.calls == 0
    assert (summary.done, summary.already_written) == (0, 4)
    assert out.read_bytes() == before


def test_a_torn_last_line_is_cut_and_redone(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
    _job(tmp_path, RuleAwareFakeChatModel(), match_only=True).run(inputs, out)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # killed
    again = RuleAwareFakeChatModel()
    summary = _job(tmp_path, again, match_only=True).run(inputs, out)
    assert summary.torn_line
    assert summary.done == 2
    assert summary.cached == 18  # the verdicts were cached: nothing paid twice
    assert again.calls == 0
    assert sorted(r["id"] for r in iter_records(out)) == ["a", "b", "c", "d"]


def test_match_only_writes_no_answer(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    model = RuleAwareFakeChatModel()
    _job(tmp_path, model, match_only=True).run(
        read_inputs(_inputs(tmp_path / "in.jsonl")), out
    )
    assert all("answer" not in r for r in iter_records(out))
    assert model.calls == 36


def test_a_shard_does_only_its_inputs(tmp_path: Path) -> None:
    items = {f"id-{n}": SNIPPETS["a"] for n in range(12)}
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl", items))
    written: list[str] = []
    for index in (1, 2):
        out = tmp_path / f"out.{index}.jsonl"
        job = _job(
            tmp_path, RuleAwareFakeChatModel(), match_only=True, shard=Shard(index, 2)
        )
        summary = job.run(inputs, out)
        assert summary.in_shard == summary.done
        written += [r["id"] for r in iter_records(out)]
    assert sorted(written) == sorted(items)


def test_other_settings_on_the_same_output_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
    _job(tmp_path, RuleAwareFakeChatModel(), match_only=True).run(inputs, out)
    changed = _job(
        tmp_path, RuleAwareFakeChatModel(), match_only=True, options=MatchOptions(k=1)
    )
    with pytest.raises(BulkJobMismatchError, match=r"options: .* then, .* now"):
        changed.run(inputs, out)
    with pytest.raises(BulkJobMismatchError, match="executor"):
        _job(tmp_path, RuleAwareFakeChatModel()).run(inputs, out)


def test_a_failed_input_stops_the_job_and_keeps_what_was_paid(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
    broken = RuleAwareFakeChatModel(
        faults={"PEP8-LAMBDA-ASSIGN": [ConnectionError("provider down")] * 10}
    )
    job = _job(tmp_path, broken, match_only=True, concurrency=1)
    with pytest.raises(BulkRunError, match="provider down") as raised:
        job.run(inputs, out)
    assert raised.value.input_id == "a"  # its fan-out judges the lambda rule too
    assert "run the same command again to resume" in str(raised.value)
    failed = sum("PEP8-LAMBDA-ASSIGN" in prompt for prompt in broken.prompts)
    paid = broken.calls - failed
    assert paid > 0  # some of the fan-out went through before it stopped
    healthy = RuleAwareFakeChatModel()
    summary = _job(tmp_path, healthy, match_only=True).run(inputs, out)
    assert summary.done == 4
    # Every judgment that went through was kept: only the rest is paid again.
    assert summary.cached == paid
    assert healthy.calls == 36 - paid


# --- at batch prices -----------------------------------------------------------------


@pytest.mark.usefixtures("loopback")
def test_via_batch_sends_judgments_and_executions_in_batches(tmp_path: Path) -> None:
    clock = FakeClock()
    with FakeBatchServer(RuleAwareFakeChatModel()) as server:
        llm = ChatOpenAI(
            base_url=server.base_url, api_key="unused", model="gpt-4o-mini"
        )
        judge = ApplicabilityJudge(
            llm=llm, cache=SQLiteVerdictCache(tmp_path / "cache.sqlite")
        )
        job = BulkJob(
            MatchEngine(judge),
            Rulebook.load(RULEBOOK).rules,
            ActionOnlyExecutor(llm=llm),
            via="batch",
            batch_settings=BatchSettings(sleep=clock.sleep, clock=clock.time),
        )
        out = tmp_path / "out.jsonl"
        inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
        summary = job.run(inputs, out)
        hits = dict(server.hits)
        again = job.run(inputs, tmp_path / "again.jsonl")  # every verdict cached
    records = {r["id"]: r for r in iter_records(out)}
    assert records["a"]["matched"] == ["PEP8-IMPORT-WILDCARD"]
    assert "Replace the wildcard import" in records["a"]["answer"]
    assert hits.get("POST /v1/chat/completions", 0) == 0  # nothing online
    assert hits["POST /v1/batches"] == 2  # one for the judgments, one to execute
    assert summary.batch is not None
    assert summary.batch["judgments"]["from_batch"] == 36
    assert summary.batch["executions"]["from_batch"] == 4
    # Before: every paid batch verdict was marked "cached" (and counted so),
    # because matching read them back from the cache.
    verdicts = [v for r in records.values() for v in r["verdicts"]]
    assert {v["from"] for v in verdicts} == {"batch"}
    assert not any(v.get("cached") for v in verdicts)
    assert summary.cached == 0
    cached = [v for r in iter_records(tmp_path / "again.jsonl") for v in r["verdicts"]]
    assert {v["from"] for v in cached} == {"cache"}
    assert all(v["cached"] for v in cached)
    assert again.cached == 36


def test_an_executor_call_is_retried_and_a_lasting_failure_stops_the_job(
    tmp_path: Path,
) -> None:
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl", {"a": SNIPPETS["a"]}))
    retry = CallRetry(max_attempts=3, initial_delay=0, jitter=0)
    # Executor prompts carry no rule id: their faults are listed under "".
    flaky = RuleAwareFakeChatModel(faults={"": [ConnectionError("reset")]})
    summary = _job(tmp_path, flaky, executor_retry=retry).run(
        inputs, tmp_path / "out.jsonl"
    )
    assert summary.done == 1
    assert flaky.calls == 9 + 2  # one executor attempt failed, the next went through

    down = RuleAwareFakeChatModel(faults={"": [ConnectionError("reset")] * 3})
    fresh = tmp_path / "fresh"  # another cache: the answer above is kept in this one
    fresh.mkdir()
    with pytest.raises(BulkRunError, match="reset") as raised:
        _job(fresh, down, executor_retry=retry).run(inputs, tmp_path / "o2.jsonl")
    assert raised.value.input_id == "a"
    assert not (tmp_path / "o2.jsonl").read_text()


def test_an_unreadable_line_before_the_last_is_refused_not_cut(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
    _job(tmp_path, RuleAwareFakeChatModel(), match_only=True).run(inputs, out)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + "\n" + "".join(lines[1:]))  # a blank line edited in
    before = out.read_bytes()
    again = RuleAwareFakeChatModel()
    with pytest.raises(BulkJobMismatchError, match="line 2: not a record"):
        _job(tmp_path, again, match_only=True).run(inputs, out)
    assert out.read_bytes() == before  # records paid for are kept
    assert again.calls == 0


def test_a_first_run_that_wrote_nothing_does_not_fix_the_settings(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.jsonl"
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
    down = RuleAwareFakeChatModel(faults={"": [ConnectionError("down")] * 99})
    with pytest.raises(BulkRunError):
        _job(tmp_path, down, concurrency=1, executor_retry=None).run(inputs[:1], out)
    assert not out.read_text()
    # Other settings now: nothing was written under the old ones.
    summary = _job(tmp_path, RuleAwareFakeChatModel(), match_only=True).run(inputs, out)
    assert summary.done == 4


def test_an_output_without_a_manifest_is_not_resumed(tmp_path: Path) -> None:
    path = _inputs(tmp_path / "in.jsonl")
    with pytest.raises(BulkJobMismatchError, match="is it the inputs file"):
        _job(tmp_path, RuleAwareFakeChatModel()).run(read_inputs(path), path)


def test_batch_prices_and_retraining_do_not_mix(tmp_path: Path) -> None:
    rulebook = Rulebook.load(RULEBOOK)
    prefilter = LearnedPrefilter(rulebook)
    judge = ApplicabilityJudge(
        llm=RuleAwareFakeChatModel(), verdict_log=SQLiteVerdictLog(tmp_path / "l.db")
    )
    engine = MatchEngine(judge, prefilter=prefilter, retrain_every=100)
    with pytest.raises(ValueError, match="would be judged online at list price"):
        BulkJob(engine, rulebook.rules, via="batch")


def test_one_run_writes_an_output_at_a_time(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
    # Another process's run holds the output (flock locks per open file).
    fcntl = pytest.importorskip("fcntl", reason="flock is POSIX")
    with out.open("a") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        model = RuleAwareFakeChatModel()
        with pytest.raises(BulkOutputBusyError, match="being written by another run"):
            _job(tmp_path, model, match_only=True).run(inputs, out)
        assert model.calls == 0
    summary = _job(tmp_path, RuleAwareFakeChatModel(), match_only=True).run(inputs, out)
    assert summary.done == 4


def test_a_paid_executor_answer_is_kept_for_a_resumed_run(tmp_path: Path) -> None:
    # Before: a run killed with executor calls in flight paid for them again when
    # resumed (64 and 61 executor calls for 60 inputs).
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl"))
    first = RuleAwareFakeChatModel()
    summary = _job(tmp_path, first).run(inputs, tmp_path / "out.jsonl")
    assert summary.executor_calls == len(inputs)
    # As if killed after the answers were paid but before the lines were written.
    again = RuleAwareFakeChatModel()
    resumed = _job(tmp_path, again).run(inputs, tmp_path / "o2.jsonl")
    assert (again.calls, resumed.executor_calls) == (0, 0)
    written = {r["id"]: r["answer"] for r in iter_records(tmp_path / "out.jsonl")}
    assert {
        r["id"]: r["answer"] for r in iter_records(tmp_path / "o2.jsonl")
    } == written
