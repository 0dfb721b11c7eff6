"""Fake-driven extraction of PEP 8 and of the NBA CBA end to end.

Wall time, LLM calls per phase, and the peak memory. Each document (`pep8/pep-0008.rst`,
`rulearena_nba/reference_rules.txt`) goes through `extract_rules` with
`ExtractionFakeChatModel`, which answers every phase from the prompt at once (or after
`--latency` seconds a call, to simulate a model). So the figures are the pipeline's own
cost: sectioning, the LangGraph fan-out, validation of every output, phase 4's tag
groups, phase-5 faithfulness and coverage, and, with a checkpoint, SQLite persistence
of the checkpoints and of every model answer.

Per document it runs:

- without a checkpoint (`checkpoint=None`), and with a SQLite checkpoint in a temp
  directory, to show the checkpoint's overhead; the wall time is the best of
  `--repeats` runs (a fresh SQLite file for each), and one more run of each under
  `tracemalloc` gives the peak of Python allocations;
- again on the same checkpoint file, unchanged: the finished run is returned;
- again on the same checkpoint file after a one-word edit inside one rule's source
  text: only the prompts that involve the changed section reach the model;
- killed and resumed: the extraction runs in a child process on a fresh SQLite
  checkpoint, is SIGKILLed once `--kill-at` of the calls of the run without a
  checkpoint have finished, and a second process resumes it. (Not on Windows.)

For each it prints the wall time, the rules, the LLM calls and tokens per phase (from
the extraction report, and the calls the model actually received), and the process's
maximum resident set size (ru_maxrss) so far. For the killed run: the seconds from
the start of the first process to its first model call and to the kill, the calls
before the kill, the resuming process's wall time and calls, and the calls made twice.

Run from the repository root:

    python benchmarks/bench_extraction.py [--data-dir DIR] [--latency L] [--kill-at F]
        [--json PATH]

The data directory is `--data-dir`, else `$TAG_DATA_DIR`, else `../shared/data`
beside the repository. The exit status is 2 if a document is missing, 1 if a run's
rules are not all faithful or differ between configurations, else 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common
from langchain_core.documents import Document

from langchain_tag.extraction import ExtractionReport, extract_rules, prompts
from langchain_tag.extraction.run import Checkpoint
from langchain_tag.rules import Rulebook
from langchain_tag.testing import ExtractionFakeChatModel

DOCUMENTS = (
    ("pep8", Path("pep8") / "pep-0008.rst", "Python code style"),
    ("nba", Path("rulearena_nba") / "reference_rules.txt", "NBA salary cap"),
)
PHASES = ("spans", "atomics", "rules", "relations", "recovery")
PHASE_MARKERS = {
    "spans": prompts.SPAN_DETECTION_SYSTEM.split("{domain}")[0],
    "atomics": prompts.DECOMPOSITION_SYSTEM.split("{domain}")[0],
    "rules": prompts.OPERATIONALISATION_SYSTEM.split("{domain}")[0],
    "relations": prompts.RELATIONS_SYSTEM.split("{domain}")[0],
}
"""Opening words of each phase's system prompt; recovery sends phase-3 prompts."""
MIB = 1024 * 1024

CHILD_SCRIPT = """
import sys
from pathlib import Path

from langchain_core.documents import Document

from langchain_tag.extraction import extract_rules
from langchain_tag.testing import ExtractionFakeChatModel

path, source, domain, log, db, out, latency, concurrency = sys.argv[1:9]
rulebook = extract_rules(
    [Document(page_content=Path(path).read_text(encoding="utf-8"),
              metadata={"source": source})],
    llm=ExtractionFakeChatModel(latency=float(latency), call_log=Path(log)),
    domain=domain,
    checkpoint=db,
    max_concurrency=int(concurrency),
)
rulebook.save(out)
"""
"""One extraction on a SQLite checkpoint, logging each finished call (a digest of
its prompt and the time) to a file another process can read."""


@dataclass
class Run:
    """One extraction run and what it cost."""

    label: str
    seconds: float
    rules: int
    model_calls: int
    """Calls the model received in this run."""
    model_calls_by_prompt: dict[str, int]
    """The same, by the phase of the prompt (phase-3 prompts include recovery)."""
    report_calls: dict[str, int]
    input_tokens: dict[str, int]
    output_tokens: dict[str, int]
    items_out: dict[str, int]
    problems: dict[str, dict[str, int]]
    faithfulness: float
    coverage: float
    traced_peak_mib: float | None = None
    maxrss_mib: float | None = None
    all_times: list[float] = field(default_factory=list)


def maxrss_mib() -> float | None:
    """The process's maximum resident set size so far, in MiB (None on Windows)."""
    try:
        import resource  # noqa: PLC0415 - not on Windows
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Kilobytes on Linux, bytes on macOS.
    return peak / MIB if sys.platform == "darwin" else peak / 1024


def prompt_phase(prompt: str) -> str:
    """The phase a prompt belongs to, by its system prompt."""
    return next((n for n, m in PHASE_MARKERS.items() if m in prompt), "other")


def extract(
    doc: Document,
    domain: str,
    args: argparse.Namespace,
    checkpoint: Checkpoint,
    *,
    trace: bool = False,
) -> tuple[Rulebook, ExtractionFakeChatModel, float, float | None]:
    """One run with `--latency` and `--max-concurrency` from `args`.

    Returns:
        The rulebook, the fake, the seconds and the traced peak.
    """
    fake = ExtractionFakeChatModel(latency=args.latency)
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
    started = time.perf_counter()
    try:
        rulebook = extract_rules(
            [doc],
            llm=fake,
            domain=domain,
            checkpoint=checkpoint,
            max_concurrency=args.max_concurrency,
        )
    finally:
        seconds = time.perf_counter() - started
        peak = None
        if trace:
            peak = tracemalloc.get_traced_memory()[1] / MIB
            tracemalloc.stop()
    return rulebook, fake, seconds, peak


def figures(
    label: str, rulebook: Rulebook, fake: ExtractionFakeChatModel, seconds: float
) -> Run:
    """What one run did, from its report and from the calls the fake received."""
    report = ExtractionReport.model_validate(rulebook.diagnostics)
    by_prompt = Counter(prompt_phase(p) for p in fake.prompts)
    return Run(
        label=label,
        seconds=seconds,
        rules=len(rulebook),
        model_calls=fake.calls,
        model_calls_by_prompt={n: by_prompt.get(n, 0) for n in PHASE_MARKERS},
        report_calls={n: report.phases[n].calls for n in PHASES},
        input_tokens={n: report.phases[n].input_tokens for n in PHASES},
        output_tokens={n: report.phases[n].output_tokens for n in PHASES},
        items_out={n: p.items_out for n, p in report.phases.items()},
        problems={n: dict(p.problems) for n, p in report.phases.items() if p.problems},
        faithfulness=report.faithfulness,
        coverage=report.coverage,
        maxrss_mib=maxrss_mib(),
    )


def unfaithful(rulebook: Rulebook, text: str) -> int:
    """Rules whose source text is not at their source offsets, verbatim."""
    return sum(
        rule.source is None
        or text[rule.source.start : rule.source.end] != rule.source_text
        for rule in rulebook.rules
    )


def one_edit(text: str, rulebook: Rulebook) -> tuple[str, str]:
    """The text with one word of the middle rule's source text upper-cased.

    Returns:
        The edited text, and a description of the edit.
    """
    rules = [r for r in rulebook.rules if r.source is not None]
    for rule in rules[len(rules) // 2 :] + rules[: len(rules) // 2]:
        if rule.source is None:
            continue
        found = re.search(r"\b[a-z]{5,}\b", rule.source_text)
        if found:
            at = rule.source.start + found.start()
            word = found.group(0)
            edited = text[:at] + word.upper() + text[at + len(word) :]
            return (
                edited,
                f"{word!r} -> {word.upper()!r} at offset {at} ({rule.rule_id})",
            )
    msg = "no rule source with a lowercase word to edit"
    raise ValueError(msg)


def timed_best(
    doc: Document,
    domain: str,
    args: argparse.Namespace,
    label: str,
    checkpoints: Sequence[Checkpoint],
) -> tuple[Run, Rulebook]:
    """Best of len(checkpoints) runs (one checkpoint each), plus one traced run."""
    best: tuple[float, Rulebook, ExtractionFakeChatModel] | None = None
    times = []
    for checkpoint in checkpoints[:-1]:
        rulebook, fake, seconds, _ = extract(doc, domain, args, checkpoint)
        times.append(seconds)
        if best is None or seconds < best[0]:
            best = (seconds, rulebook, fake)
    traced, _, _, peak = extract(doc, domain, args, checkpoints[-1], trace=True)
    if best is None:
        msg = "no timed run"
        raise ValueError(msg)
    run = figures(label, best[1], best[2], best[0])
    run.traced_peak_mib = peak
    run.all_times = times
    if traced.rules != best[1].rules:
        run.problems["benchmark"] = {"traced_run_differs": 1}
    return run, best[1]


def print_run(run: Run) -> None:
    """One run's figures."""
    memory = []
    if run.traced_peak_mib is not None:
        memory.append(f"tracemalloc peak {run.traced_peak_mib:.1f} MiB")
    if run.maxrss_mib is not None:
        memory.append(f"process max RSS so far {run.maxrss_mib:.0f} MiB")
    times = (
        f" (best of {len(run.all_times)}: "
        + ", ".join(f"{t:.3f}" for t in run.all_times)
        + ")"
        if len(run.all_times) > 1
        else ""
    )
    print(f"  {run.label}: {run.seconds:.3f} s{times}, {run.rules} rules")
    print(
        f"    model calls received: {run.model_calls} "
        f"({', '.join(f'{n} {c}' for n, c in run.model_calls_by_prompt.items())}; "
        "recovery prompts count as rules)"
    )
    if memory:
        print("    " + "; ".join(memory))
    print(f"    {'phase':<10}{'calls':>7}{'in tok':>10}{'out tok':>10}{'items':>8}")
    for name in PHASES:
        print(
            f"    {name:<10}{run.report_calls[name]:>7}{run.input_tokens[name]:>10}"
            f"{run.output_tokens[name]:>10}{run.items_out[name]:>8}"
        )
    print(
        f"    (report) total calls {sum(run.report_calls.values())}, verified rules "
        f"{run.items_out['verify']}, faithfulness {run.faithfulness:.3f}, "
        f"coverage {run.coverage:.3f}"
    )
    if run.problems:
        listed = "; ".join(
            f"{phase}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            for phase, counts in run.problems.items()
        )
        print(f"    problems: {listed}")


@dataclass
class KilledRun:
    """An extraction killed in a child process and resumed by another."""

    kill_after: int
    """Finished calls the first process was killed after (it may finish a few more
    before the signal lands)."""
    first_call_seconds: float | None
    """From starting the first process to its first finished call: interpreter
    start, imports, sectioning."""
    killed_after_seconds: float
    calls_before_kill: int
    resume_seconds: float
    """The resuming process's wall time, start to exit."""
    resume_calls: int
    repeated_calls: int
    """Calls made by both processes (their answer was not stored before the kill)."""
    total_seconds: float
    """Both processes, start of the first to the exit of the second."""
    same_rules: bool
    resume_error: str = ""


def logged_calls(log: Path) -> list[tuple[str, float]]:
    """(digest, time) of every finished call in a child's call log."""
    if not log.exists():
        return []
    calls = []
    for line in log.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3:  # a line being written when the process died is partial
            calls.append((parts[0], float(parts[1])))
    return calls


def kill_and_resume(
    path: Path,
    domain: str,
    args: argparse.Namespace,
    workdir: Path,
    expected: Rulebook,
    total_calls: int,
) -> KilledRun:
    """Run the extraction in a child, SIGKILL it part-way, resume it in another."""
    workdir.mkdir(parents=True, exist_ok=True)
    log, db, out = workdir / "calls.log", workdir / "run.sqlite", workdir / "out.json"
    command = [
        sys.executable,
        "-c",
        CHILD_SCRIPT,
        str(path),
        path.name,
        domain,
        str(log),
        str(db),
        str(out),
        str(args.latency),
        str(args.max_concurrency),
    ]
    kill_after = max(1, round(total_calls * args.kill_at))
    started_wall, started = time.time(), time.perf_counter()
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and script
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while len(logged_calls(log)) < kill_after and process.poll() is None:
            time.sleep(0.002)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    killed_after = time.perf_counter() - started
    before = logged_calls(log)

    resumed = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        command, capture_output=True, text=True, check=False
    )
    ended = time.perf_counter()
    after = logged_calls(log)[len(before) :]
    same = done.returncode == 0 and Rulebook.load(out).rules == expected.rules
    return KilledRun(
        kill_after=kill_after,
        first_call_seconds=before[0][1] - started_wall if before else None,
        killed_after_seconds=killed_after,
        calls_before_kill=len(before),
        resume_seconds=ended - resumed,
        resume_calls=len(after),
        repeated_calls=len({d for d, _ in before} & {d for d, _ in after}),
        total_seconds=ended - started,
        same_rules=same,
        resume_error=done.stderr.strip().splitlines()[-1] if done.returncode else "",
    )


def print_killed(run: KilledRun) -> None:
    """The killed run's figures."""
    first = (
        f"first call after {run.first_call_seconds:.3f} s, "
        if run.first_call_seconds is not None
        else ""
    )
    print(
        f"  killed and resumed (SQLite checkpoint, kill after {run.kill_after} "
        f"calls): {first}killed after {run.killed_after_seconds:.3f} s with "
        f"{run.calls_before_kill} calls done"
    )
    print(
        f"    resume: {run.resume_seconds:.3f} s, {run.resume_calls} calls, "
        f"{run.repeated_calls} made twice; both processes {run.total_seconds:.3f} s"
    )
    if run.resume_error:
        print(f"    resume failed: {run.resume_error}")


def bench_document(
    name: str, path: Path, domain: str, args: argparse.Namespace, workdir: Path
) -> tuple[dict[str, Any], bool]:
    """All runs of one document; returns its figures and whether all checks held."""
    text = path.read_text(encoding="utf-8")
    doc = Document(page_content=text, metadata={"source": str(path.name)})
    print(f"\n{name}: {path} ({len(text):,} characters), domain {domain!r}")
    ok = True

    plain, plain_rules = timed_best(
        doc, domain, args, "no checkpoint", [None] * (args.repeats + 1)
    )
    print_run(plain)
    databases = [workdir / f"{name}-{n}.sqlite" for n in range(args.repeats + 1)]
    sqlite, sqlite_rules = timed_best(doc, domain, args, "SQLite checkpoint", databases)
    print_run(sqlite)
    overhead = sqlite.seconds / plain.seconds if plain.seconds else float("nan")
    print(
        f"  checkpoint overhead: {sqlite.seconds - plain.seconds:+.3f} s "
        f"({overhead:.2f}x the run without); database "
        f"{databases[0].stat().st_size / MIB:.1f} MiB"
    )

    rulebook, fake, seconds, _ = extract(doc, domain, args, databases[0])
    unchanged = figures("re-run, unchanged (finished run)", rulebook, fake, seconds)
    print_run(unchanged)

    edited_text, edit = one_edit(text, plain_rules)
    edited_doc = Document(page_content=edited_text, metadata=doc.metadata)
    print(f"  one edit: {edit}")
    edited_rules, fake, seconds, _ = extract(edited_doc, domain, args, databases[0])
    edited = figures(
        "re-run after one edit (stored answers)", edited_rules, fake, seconds
    )
    print_run(edited)
    print(
        f"    the report counts {sum(edited.report_calls.values())} calls; the model "
        f"received {edited.model_calls}"
    )

    killed = None
    if sys.platform != "win32" and args.kill_at > 0:
        killed = kill_and_resume(
            path,
            domain,
            args,
            workdir / f"{name}-killed",
            plain_rules,
            plain.model_calls,
        )
        print_killed(killed)

    checks = {
        "faithful (no checkpoint)": unfaithful(plain_rules, text) == 0,
        "faithful (after the edit)": unfaithful(edited_rules, edited_text) == 0,
        "same rules with and without a checkpoint": plain_rules.rules
        == sqlite_rules.rules,
        "unchanged re-run returns the same rules": rulebook.rules == plain_rules.rules,
        "unchanged re-run makes no call": unchanged.model_calls == 0,
        "the edit re-sends fewer calls": edited.model_calls < plain.model_calls,
    }
    if killed is not None:
        checks["killed run resumes to the same rules"] = killed.same_rules
    for label, held in checks.items():
        print(f"  check: {label}: {'ok' if held else 'FAILED'}")
        ok = ok and held
    return {
        "document": str(path),
        "characters": len(text),
        "domain": domain,
        "edit": edit,
        "runs": [asdict(r) for r in (plain, sqlite, unchanged, edited)],
        "checkpoint_overhead_seconds": sqlite.seconds - plain.seconds,
        "checkpoint_bytes": databases[0].stat().st_size,
        "killed_and_resumed": asdict(killed) if killed is not None else None,
        "checks": checks,
    }, ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line: `argv`, or `sys.argv[1:]` when None."""
    parser = _common.make_parser(
        __doc__, data=True, repeats_help="timed runs of each configuration"
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=0.0,
        metavar="L",
        help="seconds each fake model call takes, to simulate a model (default 0)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=8,
        help="LLM calls in flight at most (default 8, as extract_rules)",
    )
    parser.add_argument(
        "--kill-at",
        type=float,
        default=0.5,
        metavar="F",
        help="kill the child extraction after this share of the calls, then resume "
        "it; 0 skips that run (default 0.5)",
    )
    args = _common.parse_arguments(parser, argv)
    if not 0 <= args.kill_at < 1:
        parser.error("--kill-at must be in [0, 1)")
    if args.latency < 0:
        parser.error("--latency must not be negative")
    if args.max_concurrency < 1:
        parser.error("--max-concurrency must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on `argv` (`sys.argv[1:]` when None); print the report.

    Returns:
        The exit status: 1 if a check failed, else 0.

    Raises:
        SystemExit: With status 2 if a document is missing.
    """
    args = parse_args(argv)
    data_dir = _common.require_data_dir(args.data_dir, [rel for _, rel, _ in DOCUMENTS])
    print(
        "Fake-driven extraction benchmark: "
        f"latency {args.latency} s a call, max_concurrency {args.max_concurrency}, "
        f"best of {args.repeats}; Python {platform.python_version()} on "
        f"{platform.machine()} ({os.cpu_count()} CPUs)"
    )
    print(f"process max RSS before any run: {maxrss_mib() or float('nan'):.0f} MiB")
    results = []
    all_ok = True
    with tempfile.TemporaryDirectory(prefix="bench-extraction-") as workdir:
        for name, rel, domain in DOCUMENTS:
            result, ok = bench_document(
                name, data_dir / rel, domain, args, Path(workdir)
            )
            results.append(result)
            all_ok = all_ok and ok
    if args.json is not None:
        _common.write_json(
            args.json,
            {
                "latency": args.latency,
                "max_concurrency": args.max_concurrency,
                "kill_at": args.kill_at,
                "repeats": args.repeats,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "documents": results,
            },
        )
        print(f"\nwrote {args.json}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
