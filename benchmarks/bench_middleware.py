"""Benchmark of `TAGMiddleware` in an agent: the latency it adds per invocation.

What it measures, with fakes standing in for both models (no network, no LLM):

- the judge is `RuleAwareFakeChatModel(latency=L)`, which answers after a fixed
  simulated latency L, behind an `ApplicabilityJudge` with `cache=None`, so every
  invocation judges every rule and nothing is served from a cache;
- the agent's model is `ToolLoopFakeChatModel(tool_rounds=2)` with no latency: each
  invocation is three model calls (tool, tool, answer) with two tool runs between.

For M rules (`trigger_rulebook(M)`) and `max_concurrency` C, at L=100 ms (M in
{24, 64}, C in {8, 16}) and at L=400 ms, a hosted model's typical judgment
(M=64, C in {8, 16}), it times one `agent.invoke(...)` (sync) and one
`await agent.ainvoke(...)` (async) of a `create_agent` agent with
`TAGMiddleware(rulebook=..., judge=..., max_concurrency=C)`, and of the same agent
without the middleware. The added latency is the difference of the two (best of
`--repeats` runs each), against the ideal ceil(M/C)·L: the judgments run C at a
time and the agent model adds nothing. Next to it, the same matching by the
`TAGRetriever` alone (`retriever.match(query)` / `await retriever.amatch(query)`,
same judge and C, best of `--repeats`) separates what the matching engine costs
from what the middleware adds around it.

Each invocation with the middleware is also checked: exactly M judgments (the
fake's `calls`: judged once per invocation, not once per model call), no more than
C in flight, the three model calls each with the matched rules' actions, and only
those, in their system message, and the matched rules in the state (`tag`).

Target (from the issue): added latency within 1.10x of ceil(M/C)·L. What the ideal
leaves out is the CPU time of each judgment (prompt, callbacks, langchain-core's
chat-model call, the fake's parsing: about 0.7 ms here, see `bench_matching.py`):
the async path runs it on one event loop, so each round of C judgments adds about
C x 0.7 ms, which at L=100 ms and C=16 is over a tenth of L.

Run from the repository root:

    python benchmarks/bench_middleware.py [--repeats 3] [--json results.json]

The exit status is 1 if an invocation judged the wrong number of rules, exceeded
the concurrency bound, gave a model call the wrong system message or matched the
wrong rules; a missed target is reported as FAIL but does not change it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import _common
from langchain.agents import create_agent
from langchain_core.tools import tool

from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.middleware import GUIDANCE_INTRO, TAGMiddleware
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rulebook
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook
from langchain_tag.testing.agents import ToolLoopFakeChatModel

CASES = (
    (0.1, 24, 8),
    (0.1, 24, 16),
    (0.1, 64, 8),
    (0.1, 64, 16),
    (0.4, 64, 8),
    (0.4, 64, 16),
)
"""(L seconds, M rules, C concurrency) measured."""
PATHS = ("sync", "async")
"""How the agent is called: `agent.invoke` or `await agent.ainvoke`."""
TOOL_ROUNDS = 2
MODEL_CALLS = TOOL_ROUNDS + 1
TARGET_RATIO = 1.10
BASELINE_RUNS = 10
"""Timed runs of the agent without the middleware, per path (each takes ms)."""

SYSTEM = "You are a code reviewer. Use the lookup tool before answering."
APPLICABLE = (3, 17, 23)
"""Rules whose trigger the input contains (all below the smallest M)."""
QUERY = (
    "Please review this change: it renames trigger-003 and drops trigger-017, and "
    "the config still mentions trigger-023. Anything else I should look at?"
)


@tool
def lookup(query: str) -> str:
    """Look the query up in the team's notes."""
    return f"notes on: {query[:40]}"


@dataclass
class Run:
    """One timed agent invocation."""

    path: str
    latency: float
    rules: int
    concurrency: int
    middleware: bool
    wall_s: float
    judgments: int = 0
    peak_in_flight: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class Row:
    """The best runs of one (path, M, C), with and without the middleware."""

    path: str
    latency: float
    rules: int
    concurrency: int
    runs: int
    with_s: float
    without_s: float
    added_s: float
    retriever_s: float
    ideal_s: float
    ratio: float
    judgments: int
    max_peak_in_flight: int


def expected_system_prompt(rulebook: Rulebook) -> str:
    """The system message every model call must get: SYSTEM plus the actions.

    Args:
        rulebook: The rules judged; those of APPLICABLE match.

    Returns:
        The text.
    """
    actions = [
        f"[{rulebook.rules[i].rule_id}] {rulebook.rules[i].action}" for i in APPLICABLE
    ]
    return "\n".join([SYSTEM, "", GUIDANCE_INTRO, *actions])


def build_agent(
    latency: float, rulebook: Rulebook, concurrency: int, *, middleware: bool
) -> tuple[Any, ToolLoopFakeChatModel, RuleAwareFakeChatModel | None]:
    """A fresh agent (and its fakes), with or without `TAGMiddleware`.

    Args:
        latency: The fake judge's L, in seconds.
        rulebook: The rules to judge.
        concurrency: The middleware's `max_concurrency`.
        middleware: Whether the agent has the middleware.

    Returns:
        The compiled agent, its model and the judge's fake (None without).
    """
    model = ToolLoopFakeChatModel(tool_rounds=TOOL_ROUNDS)
    if not middleware:
        return create_agent(model, tools=[lookup], system_prompt=SYSTEM), model, None
    judge_llm = RuleAwareFakeChatModel(latency=latency)
    tag = TAGMiddleware(
        rulebook=rulebook,
        judge=ApplicabilityJudge(llm=judge_llm, cache=None),
        max_concurrency=concurrency,
    )
    agent = create_agent(model, tools=[lookup], system_prompt=SYSTEM, middleware=[tag])
    return agent, model, judge_llm


def run_agent(
    path: str,
    latency: float,
    rulebook: Rulebook,
    concurrency: int,
    *,
    middleware: bool,
) -> Run:
    """Time one invocation of a fresh agent on QUERY, and check what it did.

    The async path times `await agent.ainvoke(...)` inside the event loop, so
    starting the loop is not counted; the sync path times `agent.invoke(...)`.
    Building the agent is not timed.

    Args:
        path: "sync" or "async".
        latency: The fake judge's L, in seconds.
        rulebook: The rules to judge.
        concurrency: The middleware's `max_concurrency`.
        middleware: Whether the agent has the middleware.

    Returns:
        The timed run, with any problem found.
    """
    agent, model, judge_llm = build_agent(
        latency, rulebook, concurrency, middleware=middleware
    )
    request = {"messages": [{"role": "user", "content": QUERY}]}

    async def invoke_async() -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        state = await agent.ainvoke(request)
        return time.perf_counter() - started, state

    if path == "async":
        wall, state = asyncio.run(invoke_async())
    else:
        started = time.perf_counter()
        state = agent.invoke(request)
        wall = time.perf_counter() - started
    run = Run(
        path=path,
        latency=latency,
        rules=len(rulebook),
        concurrency=concurrency,
        middleware=middleware,
        wall_s=wall,
    )
    label = f"{path} L={latency} M={run.rules} C={concurrency}"
    if len(model.received) != MODEL_CALLS:
        run.problems.append(
            f"{label}: {len(model.received)} model calls, expected {MODEL_CALLS}"
        )
    if judge_llm is None:
        return run
    run.judgments = judge_llm.calls
    run.peak_in_flight = judge_llm.peak_in_flight
    if run.judgments != run.rules:
        run.problems.append(f"{label}: {run.judgments} judgments, expected {run.rules}")
    if run.peak_in_flight > concurrency:
        run.problems.append(f"{label}: peak in flight {run.peak_in_flight} > C")
    expected = expected_system_prompt(rulebook)
    wrong = [i for i, seen in enumerate(model.system_prompts) if seen != expected]
    if wrong:
        run.problems.append(f"{label}: model calls {wrong} had another system message")
    matched = [m["rule_id"] for m in state["tag"]["matched"]]
    wanted = [rulebook.rules[i].rule_id for i in APPLICABLE]
    if matched != wanted:
        run.problems.append(f"{label}: matched {matched}, expected {wanted}")
    return run


def time_retriever(
    path: str, latency: float, rulebook: Rulebook, concurrency: int
) -> float:
    """Seconds of one `TAGRetriever` match of QUERY, the middleware's engine alone.

    Args:
        path: "sync" (`retriever.match`) or "async" (`await retriever.amatch`).
        latency: The fake judge's L, in seconds.
        rulebook: The rules to judge.
        concurrency: The retriever's `max_concurrency`.

    Returns:
        The wall time.
    """
    retriever = TAGRetriever(
        rulebook=rulebook,
        judge=ApplicabilityJudge(
            llm=RuleAwareFakeChatModel(latency=latency), cache=None
        ),
        max_concurrency=concurrency,
    )

    async def match_async() -> float:
        started = time.perf_counter()
        await retriever.amatch(QUERY)
        return time.perf_counter() - started

    if path == "async":
        return asyncio.run(match_async())
    started = time.perf_counter()
    retriever.match(QUERY)
    return time.perf_counter() - started


def measure(repeats: int, all_runs: list[Run]) -> list[Row]:
    """Added latency against ceil(M/C)·L for every (M, C) and both paths.

    Args:
        repeats: Runs per (path, M, C) with the middleware; the best is reported.
        all_runs: Every run is appended here, for the correctness checks.

    Returns:
        One row per (M, C, path).
    """
    baseline: dict[str, float] = {}
    for path in PATHS:
        runs = [
            run_agent(path, 0.0, trigger_rulebook(1), 1, middleware=False)
            for _ in range(BASELINE_RUNS)
        ]
        all_runs.extend(runs)
        baseline[path] = min(run.wall_s for run in runs)
    rows = []
    for latency, rules, concurrency in CASES:
        rulebook = trigger_rulebook(rules)
        ideal = math.ceil(rules / concurrency) * latency
        for path in PATHS:
            runs = [
                run_agent(path, latency, rulebook, concurrency, middleware=True)
                for _ in range(repeats)
            ]
            all_runs.extend(runs)
            best = min(runs, key=lambda run: run.wall_s)
            added = best.wall_s - baseline[path]
            retriever = min(
                time_retriever(path, latency, rulebook, concurrency)
                for _ in range(repeats)
            )
            rows.append(
                Row(
                    path=path,
                    latency=latency,
                    rules=rules,
                    concurrency=concurrency,
                    runs=repeats,
                    with_s=best.wall_s,
                    without_s=baseline[path],
                    added_s=added,
                    retriever_s=retriever,
                    ideal_s=ideal,
                    ratio=added / ideal,
                    judgments=best.judgments,
                    max_peak_in_flight=max(run.peak_in_flight for run in runs),
                )
            )
    return rows


def print_report(rows: list[Row], targets: dict[str, dict[str, Any]]) -> None:
    """Print the table and the targets.

    Args:
        rows: One per (M, C, path).
        targets: Target name -> value, unit, goal and pass flag.
    """
    print(
        "TAGMiddleware benchmark: latency added to one create_agent invocation.\n"
        "Judge: RuleAwareFakeChatModel (a fake), a fixed latency L per call, "
        "verdict cache off.\n"
        f"Agent model: ToolLoopFakeChatModel (a fake), no latency, {MODEL_CALLS} "
        f"calls per invocation ({TOOL_ROUNDS} tool rounds).\n"
        f"The input makes {len(APPLICABLE)} rules apply.\n"
    )
    header = (
        f"{'path':<6} {'L (s)':>5} {'M':>3} {'C':>3} {'runs':>4} {'with (s)':>9} "
        f"{'without (s)':>11} {'added (s)':>9} {'retriever (s)':>13} "
        f"{'ideal (s)':>9} {'added/ideal':>11} {'judgments':>9} {'peak':>4}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row.path:<6} {row.latency:>5.1f} {row.rules:>3} "
            f"{row.concurrency:>3} {row.runs:>4} "
            f"{row.with_s:>9.3f} {row.without_s:>11.4f} {row.added_s:>9.3f} "
            f"{row.retriever_s:>13.3f} {row.ideal_s:>9.3f} {row.ratio:>10.3f}x "
            f"{row.judgments:>9} "
            f"{row.max_peak_in_flight:>4}"
        )
    print(
        "(with: best of the runs; without: best of "
        f"{BASELINE_RUNS} runs of the same agent\n without the middleware; "
        "added = with - without; retriever: the same matching by\n "
        "TAGRetriever.match/amatch alone, best of the runs; ideal = ceil(M/C)·L;\n "
        "judgments: the fake judge's calls in the best run; peak: most judge\n "
        "calls in flight, highest over the runs)\n"
    )
    _common.print_targets(targets, digits=4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line: `argv`, or `sys.argv[1:]` when None."""
    parser = _common.make_parser(
        __doc__, data=False, repeats_help="runs per (path, L, M, C) with the middleware"
    )
    return _common.parse_arguments(parser, argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on `argv` (`sys.argv[1:]` when None); print the report.

    Returns:
        The exit status: 1 if an invocation did something wrong (see the module
        docstring), else 0.
    """
    args = parse_args(argv)

    # Warm-up: imports, lazy initialisation in langchain and langgraph.
    for path in PATHS:
        for middleware in (False, True):
            run_agent(path, 0.0, trigger_rulebook(24), 64, middleware=middleware)
        time_retriever(path, 0.0, trigger_rulebook(24), 64)

    all_runs: list[Run] = []
    rows = measure(args.repeats, all_runs)

    targets: dict[str, dict[str, Any]] = {
        f"{row.path} added/ideal, L={row.latency}, M={row.rules}, "
        f"C={row.concurrency}": {
            "value": row.ratio,
            "unit": "x",
            "goal": f"<= {TARGET_RATIO:.2f}",
            "pass": row.ratio <= TARGET_RATIO,
        }
        for row in rows
    }
    print_report(rows, targets)

    problems = [problem for run in all_runs for problem in run.problems]
    for problem in problems:
        print(f"ERROR: {problem}", file=sys.stderr)

    if args.json is not None:
        figures = {
            "model_calls_per_invocation": MODEL_CALLS,
            "applicable": len(APPLICABLE),
            "rows": [asdict(row) for row in rows],
            "targets": targets,
            "problems": problems,
        }
        _common.write_json(args.json, figures)
        print(f"\nFigures written to {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
