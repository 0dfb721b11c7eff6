"""Phase 4's cost on normative-dense text, before and after the `max_pairs` cap.

Synthetic text where every sentence is a rule (a subject, a normative verb, an
object, a condition; `normative_text`) goes through `extract_rules` with
`ExtractionFakeChatModel` and `checkpoint=None`, at 50 KB, 200 KB and 1 MB. The
fake tags rules by their words (salary, trade, contract, ...), so thousands of rules
share a tag at 1 MB: the adversarial case for phase 4, whose candidate pairs grow
with the square of the rules under a tag.

Each size runs twice, each run in a fresh process so that its maximum resident set
size (ru_maxrss) is its own: "before" with `max_pairs=None` (every pair sharing a
tag, today's `tag_groups`) and "after" with the default cap. A run is stopped when
it reaches `--call-limit` phase-4 calls, `--time-limit` seconds or `--rss-limit`
MiB (a watchdog thread samples the process's RSS), and is then reported as
"stopped at N calls, X MiB". The fake's record of the prompts it received is
cleared as the run goes, so memory is the pipeline's.

A second process per configuration runs the same extraction under `tracemalloc`
for the peak of Python allocations (numpy's included); tracemalloc slows Python
code, so wall times come from the untraced run.

Then the pairing step alone on the 1 MB text's rules (phases 1-3 run first, phase
4 skipped): counting the candidate pairs (`shared_tag_pairs`) and choosing the
`max_pairs` most similar and their calls (`plan_comparisons`), its time, and its
tracemalloc peak in a second pass.

Run from the repository root:

    python benchmarks/bench_extraction_cost.py [--sizes 50000 200000 1000000]
        [--call-limit N] [--time-limit S] [--rss-limit MIB] [--json PATH]

Exit status 1 if a capped run did not finish or compared more than its cap
allows, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import _common
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage

from langchain_tag.extraction import ExtractionReport, extract_rules, prompts
from langchain_tag.extraction.pairs import (
    DEFAULT_MAX_PAIRS,
    packed_groups_bound,
    plan_comparisons,
    shared_tag_pairs,
)
from langchain_tag.extraction.phases import DraftRule
from langchain_tag.testing import ExtractionFakeChatModel

MIB = 1024 * 1024
SIZES = (50_000, 200_000, 1_000_000)
_RELATIONS_MARKER = prompts.RELATIONS_SYSTEM.split("{domain}")[0]
"""The opening words of phase 4's system prompt."""
DOMAIN = "NBA salary cap"

_SUBJECTS = (
    "A team",
    "Each player",
    "The club",
    "A contract",
    "The league office",
    "Every trade",
    "A rookie deal",
    "The payroll",
    "An exception",
    "The roster",
)
_CUES = (
    "must",
    "should",
    "must never",
    "shall",
    "should avoid",
    "is required to",
    "may not",
    "should always",
)
_VERBS = (
    "report",
    "exceed",
    "include",
    "count",
    "record",
    "disclose",
    "reduce",
    "extend",
    "approve",
    "renew",
    "file",
    "split",
    "cap",
    "match",
)
_OBJECTS = (
    "the salary of {n} players",
    "a trade bonus of {n} percent",
    "the contract of the season {n}",
    "the cap hold for draft pick {n}",
    "a line item {n} in the ledger",
    "the comparison of offer {n}",
    "the import of clause {n}",
    "a comment on exhibit {n}",
    "the name of agent {n}",
    "an exception for year {n}",
)
_CONDITIONS = (
    "when the team is over the cap",
    "before the trade deadline",
    "if the contract exceeds {n} seasons",
    "unless the league approves it",
    "after the draft",
    "during the season",
    "whenever a player is waived",
    "if the salary rises by {n} percent",
)


def normative_text(size: int, seed: int = 0) -> str:
    """`size` characters of Markdown sections whose every sentence is a rule."""
    rng = random.Random(seed)
    parts, length, section = [], 0, 0
    while length < size:
        section += 1
        sentences = " ".join(
            f"{rng.choice(_SUBJECTS)} {rng.choice(_CUES)} {rng.choice(_VERBS)} "
            f"{rng.choice(_OBJECTS).format(n=rng.randint(1, 99))} "
            f"{rng.choice(_CONDITIONS).format(n=rng.randint(2, 9))}."
            for _ in range(rng.randint(3, 6))
        )
        block = f"## Section {section}\n\n{sentences}\n\n"
        parts.append(block)
        length += len(block)
    return "".join(parts)[:size]


def rss_mib() -> float:
    """The process's resident set size now, in MiB (Linux), else its maximum."""
    try:
        pages = int(Path("/proc/self/statm").read_text(encoding="ascii").split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / MIB
    except OSError:
        return maxrss_mib()


def maxrss_mib() -> float:
    """The process's maximum resident set size so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MIB if sys.platform == "darwin" else peak / 1024  # bytes on macOS


# --- one run, in a child process ------------------------------------------------------


def _emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


class CallCounter(BaseCallbackHandler):
    """Counts the model's calls as they start, and those of phase 4 by their prompt.

    LangGraph reports a node's tasks only when all of its step's tasks are done,
    too late for a run stopped in the middle of phase 4.
    """

    run_inline = True

    def __init__(self) -> None:
        """Start from zero."""
        self.calls = self.relation_calls = 0
        self._lock = threading.Lock()

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        **kwargs: Any,
    ) -> None:
        """Count one call; a phase-4 call if its system prompt is phase 4's."""
        relations = int(_RELATIONS_MARKER in messages[0][0].text)
        with self._lock:  # calls start in the fan-out's threads
            self.calls += 1
            self.relation_calls += relations


def child_run(
    size: int, cap: int | None, limits: dict[str, float], *, trace: bool
) -> None:
    """Extract `size` characters; print the figures as one JSON line."""
    doc = Document(page_content=normative_text(size), metadata={"source": "dense.md"})
    fake = ExtractionFakeChatModel()
    counter = CallCounter()
    started = time.perf_counter()
    figures: dict[str, Any] = {"size": size, "max_pairs": cap, "traced": trace}

    def snapshot(status: str) -> dict[str, Any]:
        return {
            **figures,
            "status": status,
            "relation_calls": counter.relation_calls,
            "calls": counter.calls,
            "seconds": time.perf_counter() - started,
            "maxrss_mib": maxrss_mib(),
            "traced_peak_mib": tracemalloc.get_traced_memory()[1] / MIB
            if trace
            else None,
        }

    def watchdog() -> None:
        while True:
            time.sleep(0.1)
            if fake.calls > 1000:
                fake.reset()  # the fake keeps every prompt: not the pipeline's memory
            found = snapshot("")
            reason = (
                "time"
                if found["seconds"] > limits["seconds"]
                else "memory"
                if rss_mib() > limits["rss_mib"]
                else "call"
                if found["relation_calls"] >= limits["calls"]
                else None
            )
            if reason is not None:
                _emit({**snapshot(f"stopped ({reason} limit)"), "rss_mib": rss_mib()})
                os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    if trace:
        tracemalloc.start()
    rulebook = extract_rules(
        [doc],
        llm=fake,
        domain=DOMAIN,
        checkpoint=None,
        callbacks=[counter],
        max_pairs=cap,
    )
    report = ExtractionReport.model_validate(rulebook.diagnostics)
    figures |= {
        "rules": report.rules,
        "candidate_pairs": report.candidate_pairs,
        "pairs_compared": report.pairs_compared,
        "pairs_skipped": report.pairs_skipped,
        "tags": len({tag for rule in rulebook.rules for tag in rule.tags}),
        "calls_by_phase": {n: p.calls for n, p in report.phases.items()},
    }
    _emit(snapshot("finished"))


def _drafts(size: int) -> list[DraftRule]:
    """The rules of `size` characters entering phase 4 (phases 1-3 by the fake)."""
    doc = Document(page_content=normative_text(size), metadata={"source": "dense.md"})
    rulebook = extract_rules(
        [doc],
        llm=ExtractionFakeChatModel(),
        domain=DOMAIN,
        checkpoint=None,
        skip_phases=[4, 5],
    )
    return [
        DraftRule(
            draft_id=rule.rule_id,
            document_id="dense",
            section_id="dense#0000",
            name=rule.name,
            condition=rule.condition,
            action=rule.action,
            source_text=rule.source_text,
            tags=rule.tags,
            span_ids=(),
            atomic_ids=(),
        )
        for rule in rulebook.rules
    ]


def child_pairing(size: int) -> None:
    """Time the pairing step alone, then trace its peak; print one JSON line."""
    drafts = _drafts(size)
    before = maxrss_mib()
    started = time.perf_counter()
    candidates = shared_tag_pairs(drafts)
    counted = time.perf_counter()
    plan = plan_comparisons(drafts, 16, DEFAULT_MAX_PAIRS)
    chosen = time.perf_counter()
    after = maxrss_mib()
    tracemalloc.start()
    shared_tag_pairs(drafts)
    count_peak = tracemalloc.get_traced_memory()[1] / MIB
    tracemalloc.reset_peak()
    plan_comparisons(drafts, 16, DEFAULT_MAX_PAIRS)
    plan_peak = tracemalloc.get_traced_memory()[1] / MIB
    tracemalloc.stop()
    tags = Counter(tag for d in drafts for tag in d.tags)
    _emit(
        {
            "size": size,
            "rules": len(drafts),
            "largest_tag": tags.most_common(1)[0],
            "candidate_pairs": candidates,
            "count_seconds": counted - started,
            "choose_seconds": chosen - counted,
            "calls": len(plan.groups),
            "pairs_compared": plan.pairs_compared,
            "count_traced_peak_mib": count_peak,
            "choose_traced_peak_mib": plan_peak,
            "maxrss_before_mib": before,
            "maxrss_after_mib": after,
        }
    )


# --- the parent: one child per configuration ------------------------------------------


def run_child(arguments: list[str], timeout: float) -> dict[str, Any]:
    """Run this script as a child with `arguments`; its last JSON line."""
    command = [sys.executable, __file__, "--child", *arguments]
    try:
        done = subprocess.run(  # noqa: S603 - our own interpreter and script
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"status": f"killed after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"status": f"failed: {tail[0]}"}
    return dict(json.loads(lines[-1]))


def _outcome(run: dict[str, Any]) -> str:
    """Finished with N phase-4 calls, or "stopped (time limit) at N ..."."""
    done = "finished with" if run["status"] == "finished" else f"{run['status']} at"
    return f"{done} {run['relation_calls']:,} phase-4 calls"


def print_run(label: str, plain: dict[str, Any], traced: dict[str, Any]) -> None:
    """One configuration's figures: the untraced run's, then the traced run's peak."""
    if "seconds" not in plain:
        print(f"  {label}: {plain['status']}")
        return
    print(
        f"  {label}: {_outcome(plain)} ({plain['calls']:,} in all), "
        f"{plain['seconds']:.1f} s, max RSS {plain['maxrss_mib']:,.0f} MiB"
    )
    if "seconds" in traced:
        print(
            f"    under tracemalloc: {_outcome(traced)}; peak "
            f"{traced['traced_peak_mib']:,.0f} MiB ({traced['seconds']:.1f} s)"
        )
    else:
        print(f"    under tracemalloc: {traced['status']}")
    if plain["status"] == "finished":
        print(
            f"    {plain['rules']:,} rules, {plain['candidate_pairs']:,} pairs sharing "
            f"a tag, {plain['pairs_compared']:,} compared, {plain['pairs_skipped']:,} "
            "skipped"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line: `argv`, or `sys.argv[1:]` when None."""
    parser = _common.make_parser(__doc__, data=False, repeats_default=None)
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(SIZES), help="text sizes (chars)"
    )
    parser.add_argument(
        "--call-limit",
        type=int,
        default=20_000,
        help="stop a run at this many phase-4 calls (default 20000)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=50.0,
        help="stop an uncapped run after this many seconds (default 50); capped "
        "runs get 10 times as long",
    )
    parser.add_argument(
        "--rss-limit",
        type=float,
        default=1500.0,
        metavar="MIB",
        help="stop a run whose resident set passes this many MiB (default 1500)",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    return _common.parse_arguments(parser, argv)


def _child(arguments: list[str]) -> int:
    kind, size = arguments[0], int(arguments[1])
    if kind == "pairing":
        child_pairing(size)
        return 0
    cap = None if arguments[2] == "none" else int(arguments[2])
    limits = {
        "calls": float(arguments[3]),
        "seconds": float(arguments[4]),
        "rss_mib": float(arguments[5]),
    }
    child_run(size, cap, limits, trace=kind == "traced")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the figures. Returns the exit status."""
    args = parse_args(argv)
    if args.child:
        return _child(args.child)
    print(
        f"Phase-4 cost benchmark: fake extractor, checkpoint=None; default cap "
        f"max_pairs={DEFAULT_MAX_PAIRS}; limits {args.call_limit:,} phase-4 calls, "
        f"{args.time_limit:.0f} s (capped: {10 * args.time_limit:.0f} s), "
        f"{args.rss_limit:,.0f} MiB RSS; Python {platform.python_version()} on "
        f"{platform.machine()} ({os.cpu_count()} CPUs)"
    )
    results: list[dict[str, Any]] = []
    ok = True
    for size in args.sizes:
        print(f"\n{size:,} characters of normative-dense text")
        for label, cap in (("before (max_pairs=None)", None), ("after", "default")):
            value = str(DEFAULT_MAX_PAIRS) if cap == "default" else "none"
            seconds = args.time_limit * (1 if cap is None else 10)
            limits = [str(args.call_limit), str(seconds), str(args.rss_limit)]
            runs = {
                kind: run_child([kind, str(size), value, *limits], seconds + 60)
                for kind in ("plain", "traced")
            }
            print_run(
                f"{label} max_pairs={value}" if cap else label,
                runs["plain"],
                runs["traced"],
            )
            results.append({"size": size, "max_pairs": value, **runs})
            if cap is not None:
                plain = runs["plain"]
                held = plain["status"] == "finished" and (
                    plain["pairs_skipped"] == 0
                    or plain["relation_calls"]
                    <= packed_groups_bound(DEFAULT_MAX_PAIRS, 16) + plain["tags"]
                )
                ok = ok and held
                print(f"    check: finished within the cap's calls: {held}")
    print(f"\npairing step alone on {args.sizes[-1]:,} characters (phases 1-3 first)")
    pairing = run_child(["pairing", str(args.sizes[-1])], 600)
    if "rules" in pairing:
        print(
            f"  {pairing['rules']:,} rules (largest tag {pairing['largest_tag'][0]!r}: "
            f"{pairing['largest_tag'][1]:,} rules), {pairing['candidate_pairs']:,} "
            f"pairs sharing a tag"
        )
        print(
            f"  count: {pairing['count_seconds']:.2f} s, tracemalloc peak "
            f"{pairing['count_traced_peak_mib']:.1f} MiB; choose {DEFAULT_MAX_PAIRS} "
            f"and plan: {pairing['choose_seconds']:.2f} s, tracemalloc peak "
            f"{pairing['choose_traced_peak_mib']:.1f} MiB; {pairing['calls']:,} calls "
            f"comparing {pairing['pairs_compared']:,} pairs"
        )
        print(
            f"  process max RSS {pairing['maxrss_before_mib']:,.0f} MiB before the "
            f"pairing step, {pairing['maxrss_after_mib']:,.0f} MiB after"
        )
    else:
        print(f"  {pairing['status']}")
    if args.json is not None:
        _common.write_json(args.json, {"runs": results, "pairing": pairing})
        print(f"\nwrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
