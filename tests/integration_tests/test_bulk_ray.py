"""`tag run --engine ray` / `BulkJob(backend="ray")`: one job over a Ray pool.

One local Ray (2 CPUs, loopback) for the module; the judge is `ChatOpenAI` at a
loopback `FakeOpenAIServer`, whose request count, in this process, is what the
workers paid for.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from langchain_tag import cli
from langchain_tag.bulk import BulkInput, BulkJob, Shard, match_dataset, read_inputs
from langchain_tag.cache import open_verdict_cache
from langchain_tag.errors import BulkInputError
from langchain_tag.rules import Rulebook
from langchain_tag.settings import MatchSettings
from langchain_tag.testing import FakeOpenAIServer, Refusal, RuleAwareFakeChatModel

ray = pytest.importorskip("ray")

RULEBOOK = str(Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json")
RULES = 9
SNIPPETS = [
    "from os import *\n",
    "square = lambda x: x * x\n",
    "print('hello')\n",
    "if x == None:\n    pass\n",
]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """One Ray for the file: every run joins it (and leaves it running)."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    """The provider; refuses (400) any request about an input saying BROKEN."""

    def refuse(request: dict[str, Any]) -> Refusal | None:
        if "BROKEN" in json.dumps(request["messages"]):
            return Refusal(status=400, headers={}, message="refused", code="bad")
        return None

    with (
        FakeOpenAIServer(RuleAwareFakeChatModel(), refuse=refuse) as fake,
        pytest.MonkeyPatch.context() as env,
    ):
        # The workers get these: the driver forwards OPENAI_* and TAG_* variables.
        env.setenv("OPENAI_BASE_URL", fake.base_url)
        env.setenv("OPENAI_API_KEY", "unused")
        yield fake


def _inputs(path: Path, count: int, broken: str | None = None) -> Path:
    lines = [
        {"id": f"i{n}" if n % 3 else n, "input": f"{SNIPPETS[n % 4]}# {n}\n"}
        for n in range(count)
    ]
    if broken is not None:
        lines.append({"id": broken, "input": "BROKEN = 1\n"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _records(path: Path) -> dict[str, dict[str, Any]]:
    """The output per id, each id written once."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_id = {json.dumps(record["id"]): record for record in lines}
    assert len(by_id) == len(lines), "an id was written twice"
    return by_id


def _uncached(path: Path) -> dict[str, dict[str, Any]]:
    records = _records(path)
    for record in records.values():
        for verdict in record["verdicts"]:
            verdict.pop("cached", None)
    return records


def _run(*options: str) -> int:
    return cli.main(["run", RULEBOOK, *options])


def _paid(server: FakeOpenAIServer, since: int) -> list[str]:
    return [json.dumps(body["messages"]) for body in server.requests[since:]]


def test_ray_writes_what_one_process_writes_and_judges_each_pair_once(
    tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = _inputs(tmp_path / "in.jsonl", 24)
    start = len(server.requests)
    assert _run("--inputs", str(inputs), "-o", str(tmp_path / "one.jsonl")) == 0
    one = _paid(server, start)
    capsys.readouterr()

    start = len(server.requests)
    out = tmp_path / "ray.jsonl"
    ray_run = ["--inputs", str(inputs), "-o", str(out), "--engine", "ray"]
    assert _run(*ray_run, "--workers", "2") == 0
    paid = _paid(server, start)
    printed = capsys.readouterr()
    assert "24 input(s) written" in printed.out
    assert "via online; engine ray, 2 worker(s)" in printed.out
    assert "tag run: 24/24 inputs (100%)" in printed.err
    assert _records(out) == _records(tmp_path / "one.jsonl")
    assert len(paid) == len(one) == 24 * RULES + 24  # judgments, then answers
    assert len(set(paid)) == len(paid)  # no pair (nor answer) paid twice

    start = len(server.requests)
    assert _run(*ray_run) == 0  # resumed: nothing left, Ray not even needed
    assert "0 input(s) written" in capsys.readouterr().out
    assert len(server.requests) == start


def test_an_interrupted_ray_run_resumes_losing_and_repeating_nothing(
    tmp_path: Path,
    server: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    count = 45
    inputs = _inputs(tmp_path / "in.jsonl", count)
    out = tmp_path / "out.jsonl"
    run = ["--inputs", str(inputs), "-o", str(out), "--engine", "ray", "--match-only"]
    shown = cli.bulk._Progress.__call__

    def interrupt(progress: Any, done: int, total: int) -> None:
        shown(progress, done, total)
        if done >= count // 3:
            raise KeyboardInterrupt  # as Ctrl-C in the driver

    monkeypatch.setattr(cli.bulk._Progress, "__call__", interrupt)
    start = len(server.requests)
    assert _run(*run) == 130
    assert "run the same command again to resume" in capsys.readouterr().err
    written = len(_records(out))
    assert count // 3 <= written < count

    monkeypatch.setattr(cli.bulk._Progress, "__call__", shown)
    assert _run(*run, "--workers", "1") == 0  # one worker starts sooner
    assert f"({written} already there, skipped)" in capsys.readouterr().out
    paid = _paid(server, start)
    assert len(_records(out)) == count
    # Only the judgments in flight when the run stopped can be paid twice.
    twice = len(paid) - len(set(paid))
    assert len(set(paid)) == count * RULES
    assert twice <= 0.05 * count * RULES


@dataclass
class _DyingJob(BulkJob):
    """A job whose worker process dies once, after its fifth input (`marker`)."""

    marker: str = ""
    _done: int = 0

    def _one(self, item: BulkInput, config: Any) -> Any:
        record = super()._one(item, config)
        self._done += 1
        if self._done == 5:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return record  # died already: once is the test
            os._exit(1)  # a killed worker: no cleanup, its batch unreturned
        return record


def _job(
    base_url: str, cache: str, backend: str = "local", marker: str = ""
) -> BulkJob:
    from langchain_openai import ChatOpenAI  # noqa: PLC0415

    rulebook = Rulebook.load(RULEBOOK)
    llm = ChatOpenAI(
        model="gpt-4o-mini", base_url=base_url, api_key="unused", max_retries=0
    )
    engine = MatchSettings(llm=llm, cache=open_verdict_cache(cache)).build_engine()
    if backend == "local":
        return BulkJob(engine, rulebook.rules)
    recipe = partial(_job, base_url, cache, backend, marker)
    return _DyingJob(
        engine, rulebook.rules, backend="ray", workers=1, recipe=recipe, marker=marker
    )


def test_a_killed_worker_is_replaced_and_pays_only_what_was_in_flight(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    inputs = read_inputs(_inputs(tmp_path / "in.jsonl", 32))
    start = len(server.requests)
    alone = _job(server.base_url, str(tmp_path / "one.sqlite"))
    alone.run(inputs, tmp_path / "one.jsonl")
    one = len(server.requests) - start

    start = len(server.requests)
    marker = tmp_path / "died"
    job = _job(server.base_url, str(tmp_path / "ray.sqlite"), "ray", str(marker))
    summary = job.run(inputs, tmp_path / "ray.jsonl")
    job.close()
    assert marker.exists()  # a worker did die
    assert summary.done == 32
    # The same records, but for where the dead worker's verdicts came from: its
    # batch was done again from the cache (as a resumed run's would be).
    assert _uncached(tmp_path / "ray.jsonl") == _uncached(tmp_path / "one.jsonl")
    paid = len(server.requests) - start
    in_flight = 8  # the dead worker's judge's max_concurrency
    assert one <= paid <= one + in_flight


def test_a_failed_judgment_follows_on_error_as_in_one_process(
    tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = _inputs(tmp_path / "in.jsonl", 6, broken="bad")
    said = {}
    for engine in ("local", "ray"):
        out = tmp_path / f"{engine}.jsonl"
        run = ["--inputs", str(inputs), "-o", str(out), "--match-only"]
        workers = ["--workers", "1"] if engine == "ray" else []
        assert _run(*run, "--engine", engine, *workers) == 2
        said[engine] = capsys.readouterr().err.splitlines()[-1]
        assert said[engine].startswith("tag run: error: input 'bad' failed (")
        assert "--on-error not_applicable" in said[engine]
        # Refused, the input is not written; the others all are, whoever ran them.
        assert (
            _run(*run, "--engine", engine, *workers, "--on-error", "not_applicable")
            == 0
        )
        records = _records(out)
        assert records['"bad"']["failed_rule_ids"]
        assert records['"bad"']["matched"] == []
    # The same error, but for which rule failed first and what was done before.
    assert _said(said["ray"]) == _said(said["local"])
    assert _records(tmp_path / "ray.jsonl") == _records(tmp_path / "local.jsonl")


def _said(line: str) -> str:
    line = re.sub(r"rule '[^']+'", "rule R", line)
    return re.sub(r"stopped with \d+ input", "stopped with N input", line)


def test_a_python_job_without_a_recipe_is_refused(tmp_path: Path) -> None:
    engine = MatchSettings(llm=RuleAwareFakeChatModel()).build_engine()
    rules = Rulebook.load(RULEBOOK).rules
    with pytest.raises(ValueError, match="needs recipe="):
        BulkJob(engine, rules, backend="ray")
    with pytest.raises(ValueError, match="workers: options of backend='ray'"):
        BulkJob(engine, rules, workers=2)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            ["--workers", "2"],
            "tag run: error: --workers: options of --engine ray.",
        ),
        (
            ["--ray-address", "auto"],
            "tag run: error: --ray-address: options of --engine ray.",
        ),
        (
            ["--engine", "ray", "--via", "batch"],
            "tag run: error: --engine ray with --via batch:",
        ),
        (
            ["--engine", "ray", "--workers", "0"],
            "tag run: error: argument --workers:",
        ),
        (["--engine", "spark"], "tag run: error: argument --engine: invalid choice"),
        (["--engine", "ray", "--ray-workers", "2"], "unrecognized arguments"),
    ],
)
def test_ray_options_misused_are_one_line_errors(
    tmp_path: Path,
    options: list[str],
    said: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inputs = _inputs(tmp_path / "in.jsonl", 2)
    run = ["run", RULEBOOK, "--inputs", str(inputs), "-o", str(tmp_path / "o.jsonl")]
    try:
        status = cli.main([*run, *options])
    except SystemExit as exit_:  # argparse's own refusals
        status = int(exit_.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert said in err[-1]
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "o.jsonl").exists()


def test_retrain_every_is_refused_with_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = _inputs(tmp_path / "in.jsonl", 2)
    model = tmp_path / "m.npz"
    model.write_bytes(b"")
    status = _run(
        "--inputs",
        str(inputs),
        "-o",
        str(tmp_path / "o.jsonl"),
        "--engine",
        "ray",
        "--learned-prefilter",
        str(model),
        "--verdict-log",
        str(tmp_path / "log.sqlite"),
        "--retrain-every",
        "10",
    )
    assert status == 2
    err = capsys.readouterr().err
    assert "--retrain-every with --engine ray" in err
    assert "tag prefilter train" in err


def test_ray_missing_is_one_line_naming_the_install(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails
    inputs = _inputs(tmp_path / "in.jsonl", 2)
    out = tmp_path / "o.jsonl"
    assert _run("--inputs", str(inputs), "-o", str(out), "--engine", "ray") == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = "--engine ray (backend='ray') needs Ray: pip install 'langchain-tag[ray]'."
    assert err == [f"tag run: error: {said}"]
    assert not out.exists()


def test_shard_splits_a_ray_run_too(
    tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = _inputs(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out.jsonl"
    run = ["--inputs", str(inputs), "-o", str(out), "--match-only", "--shard", "1/2"]
    assert _run(*run, "--engine", "ray", "--workers", "1") == 0
    printed = capsys.readouterr().out
    shard = Shard(1, 2)
    mine = {item.key for item in read_inputs(inputs) if item in shard}
    assert f"shard holds {len(mine)} of 12" in printed
    assert set(_records(out)) == mine


def test_a_dataset_of_inputs_maps_to_a_dataset_of_records(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    job = _job(server.base_url, str(tmp_path / "c.sqlite"), "ray")
    rows = [{"id": f"d{n}", "input": SNIPPETS[n]} for n in range(4)]
    mapped = match_dataset(ray.data.from_items(rows), job, workers=1)
    records = {row["id"]: json.loads(row["record"]) for row in mapped.iter_rows()}
    assert sorted(records) == ["d0", "d1", "d2", "d3"]
    assert records["d0"]["matched"] == ["PEP8-IMPORT-WILDCARD"]
    assert all(len(record["verdicts"]) == RULES for record in records.values())


def test_parquet_inputs_are_read_like_json_lines(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    jsonl = _inputs(tmp_path / "in.jsonl", 5)
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    table = pa.table(
        {"id": [str(r["id"]) for r in rows], "input": [r["input"] for r in rows]}
    )
    pq.write_table(table, tmp_path / "in.parquet")
    read = read_inputs(tmp_path / "in.parquet")
    assert [(i.id, i.input) for i in read] == [(str(r["id"]), r["input"]) for r in rows]
    pq.write_table(pa.table({"id": ["a"]}), tmp_path / "bad.parquet")
    with pytest.raises(BulkInputError, match="no 'input' column"):
        read_inputs(tmp_path / "bad.parquet")
