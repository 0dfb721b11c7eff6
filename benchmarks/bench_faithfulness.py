"""Benchmark of phase-5 faithfulness: the literal difflib check against ours.

The document is the NBA CBA text (`rulearena_nba/reference_rules.txt`, ~98 KB). 200
rule sources are built from it with a seeded random generator:

- exact: 67 verbatim spans of 60-600 characters;
- edited: 67 spans with 1-5 one-character edits (substitution, insertion, deletion,
  space <-> newline); every third is short (60-141 characters), the length at which
  the literal check cannot accept anything but an exact match;
- unrelated: 66 passages of 60-600 characters from PEP 8 (`pep8/pep-0008.rst`), or
  generated text when that file is absent.

Each source is checked four ways: `method="reference"` (difflib on every window, as
the method states it) and `method="fast"` (our rapidfuzz-bounded check, through one
`FaithfulnessChecker`), in "literal" and in "corrected" mode. The reference runs once
per mode (minutes: the method's authors measured 53 s for the literal one); the fast
runs take the best of `--repeats`. For each mode, the two methods must make the same
decision on all 200 sources. The report then says where the two modes disagree.

Target (from the issue): the same decisions on all 200, and the fast literal check at
least 20x faster than the reference literal check.

Run from the repository root:

    python benchmarks/bench_faithfulness.py [--data-dir DIR] [--json results.json]

The data directory is `--data-dir`, else `$TAG_DATA_DIR`, else `../shared/data`
beside the repository. The exit status is 1 if the fast and reference decisions
differ anywhere, 2 if the data is missing; a missed speed-up target is reported as
FAIL but does not change it.
"""

from __future__ import annotations

import argparse
import difflib
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common
import rapidfuzz
from rapidfuzz import fuzz

from langchain_tag.extraction.verification import (
    DEFAULT_THRESHOLD,
    FaithfulnessChecker,
    FaithfulnessMode,
    FaithfulnessResult,
    check_faithfulness,
)

CBA_PATH = Path("rulearena_nba") / "reference_rules.txt"
PEP8_PATH = Path("pep8") / "pep-0008.rst"

N_SOURCES = 200
KINDS = ("exact", "edited", "unrelated")
MODES: tuple[FaithfulnessMode, ...] = ("literal", "corrected")
MIN_LENGTH, MAX_LENGTH = 60, 600
SHORT = 141
"""Sources this long or shorter cannot pass the literal check's fuzzy step."""
TARGET_SPEEDUP = 20.0
DEFAULT_SEED = 20250101

_FILLER_TEXT = (
    "the module should define a function that returns a value after it checks each "
    "argument and raises an error when the input is empty or the list contains "
    "duplicate keys so that callers can rely on the result"
)
FILLER = tuple(_FILLER_TEXT.split())


@dataclass
class Source:
    """One rule source to check."""

    kind: str
    text: str
    origin: int | None
    """Where the span was taken from in the CBA text (None for unrelated)."""
    edits: int


@dataclass
class Run:
    """One method in one mode over all sources."""

    method: str
    mode: str
    seconds: float
    repeats: int
    decisions: list[bool]
    exact: list[bool]
    scores: list[float]


def generated_text(rng: random.Random, n_chars: int) -> str:
    """Plain sentences from a small vocabulary, for when PEP 8 is absent.

    Args:
        rng: The random generator.
        n_chars: Characters wanted, at least.

    Returns:
        The text.
    """
    sentences: list[str] = []
    size = 0
    while size < n_chars:
        words = " ".join(rng.choice(FILLER) for _ in range(rng.randint(8, 20)))
        sentence = words.capitalize() + "."
        sentences.append(sentence)
        size += len(sentence) + 1
    return " ".join(sentences)


def word_slice(rng: random.Random, text: str, length: int) -> tuple[int, str]:
    """A span of about `length` characters starting at a word, stripped.

    Args:
        rng: The random generator.
        text: Where to take it from.
        length: The wanted length.

    Returns:
        The span's offset in `text` and the span.
    """
    while True:
        start = rng.randrange(len(text) - length)
        while start > 0 and not text[start - 1].isspace():
            start -= 1
        span = text[start : start + length]
        stripped = span.strip()
        if len(stripped) >= MIN_LENGTH:
            return start + span.index(stripped[0]), stripped


def edit(rng: random.Random, text: str, edits: int) -> str:
    """Apply `edits` one-character edits.

    Args:
        rng: The random generator.
        text: The span to edit.
        edits: How many edits.

    Returns:
        The edited span.
    """
    chars = list(text)
    for _ in range(edits):
        where = rng.randrange(1, len(chars) - 1)
        kind = rng.choice(("substitute", "insert", "delete", "whitespace"))
        if kind == "substitute":
            chars[where] = rng.choice("aeiostnrx0,")
        elif kind == "insert":
            chars.insert(where, rng.choice("aeiostnrx0,"))
        elif kind == "delete":
            del chars[where]
        else:
            spaces = [i for i, char in enumerate(chars) if char in " \n"]
            i = rng.choice(spaces) if spaces else where
            chars[i] = "\n" if chars[i] == " " else " "
    return "".join(chars)


def build_sources(cba: str, unrelated: str, seed: int) -> list[Source]:
    """The 200 sources: exact, lightly edited and unrelated, a third each.

    Args:
        cba: The document.
        unrelated: Text unrelated to it.
        seed: The random seed.

    Returns:
        The sources, grouped by kind.
    """
    rng = random.Random(seed)
    per_kind = [N_SOURCES // 3 + (1 if i < N_SOURCES % 3 else 0) for i in range(3)]
    sources: list[Source] = []
    for _ in range(per_kind[0]):
        origin, text = word_slice(rng, cba, rng.randint(MIN_LENGTH, MAX_LENGTH))
        sources.append(Source("exact", text, origin, 0))
    for i in range(per_kind[1]):
        short = i % 3 == 0
        length = (
            rng.randint(MIN_LENGTH, SHORT)
            if short
            else rng.randint(SHORT + 1, MAX_LENGTH)
        )
        origin, text = word_slice(rng, cba, length)
        edits = rng.randint(1, 3 if short else 5)
        edited = edit(rng, text, edits)
        while edited in cba:  # an edit may rebuild the original; edit again
            edited = edit(rng, text, edits)
        sources.append(Source("edited", edited, origin, edits))
    for _ in range(per_kind[2]):
        _, text = word_slice(rng, unrelated, rng.randint(MIN_LENGTH, MAX_LENGTH))
        sources.append(Source("unrelated", text, None, 0))
    return sources


def progress(label: str) -> Callable[[int], None]:
    """A progress printer for the long reference runs (to stderr).

    Args:
        label: What is running.

    Returns:
        A function taking the number of sources done.
    """

    def report(done: int) -> None:
        if done % 20 == 0 or done == N_SOURCES:
            end = "\n" if done == N_SOURCES else ""
            print(f"\r  {label}: {done}/{N_SOURCES}", end=end, file=sys.stderr)
            sys.stderr.flush()

    return report


def run_reference(cba: str, sources: Sequence[Source], mode: FaithfulnessMode) -> Run:
    """Time `check_faithfulness(method="reference")` over every source, once.

    Args:
        cba: The document.
        sources: The sources.
        mode: The faithfulness mode.

    Returns:
        The run.
    """
    report = progress(f"reference {mode}")
    results: list[FaithfulnessResult] = []
    started = time.perf_counter()
    for source in sources:
        results.append(
            check_faithfulness(source.text, cba, mode=mode, method="reference")
        )
        report(len(results))
    seconds = time.perf_counter() - started
    return to_run("reference", mode, seconds, 1, results)


def run_fast(
    cba: str, sources: Sequence[Source], mode: FaithfulnessMode, repeats: int
) -> Run:
    """Time a fresh `FaithfulnessChecker` over every source; the best of `repeats`.

    Args:
        cba: The document.
        sources: The sources.
        mode: The faithfulness mode.
        repeats: Timed runs; the fastest is reported.

    Returns:
        The run (its decisions are the last run's; every run makes the same).
    """
    best = float("inf")
    results: list[FaithfulnessResult] = []
    for _ in range(repeats):
        started = time.perf_counter()
        checker = FaithfulnessChecker(cba, mode=mode)  # construction is counted
        results = [checker.check(source.text) for source in sources]
        best = min(best, time.perf_counter() - started)
    return to_run("fast", mode, best, repeats, results)


def to_run(
    method: str,
    mode: str,
    seconds: float,
    repeats: int,
    results: Sequence[FaithfulnessResult],
) -> Run:
    """Collect the results of one run.

    Args:
        method: "reference" or "fast".
        mode: The faithfulness mode.
        seconds: The time taken.
        repeats: Timed runs behind `seconds`.
        results: One result per source.

    Returns:
        The run.
    """
    return Run(
        method=method,
        mode=mode,
        seconds=seconds,
        repeats=repeats,
        decisions=[result.faithful for result in results],
        exact=[result.exact for result in results],
        scores=[result.score for result in results],
    )


def faithful_by_kind(run: Run, sources: Sequence[Source]) -> dict[str, int]:
    """Faithful sources per kind.

    Args:
        run: The run.
        sources: The sources, in the run's order.

    Returns:
        Kind -> faithful count.
    """
    return {
        kind: sum(
            decision
            for decision, source in zip(run.decisions, sources, strict=True)
            if source.kind == kind
        )
        for kind in KINDS
    }


def mismatches(first: Run, second: Run) -> list[int]:
    """Sources on which two runs decide differently (`faithful` or `exact`).

    Args:
        first: One run.
        second: The other, over the same sources.

    Returns:
        The indices of the sources.
    """
    pairs = zip(
        first.decisions, first.exact, second.decisions, second.exact, strict=True
    )
    return [i for i, (a, b, c, d) in enumerate(pairs) if (a, b) != (c, d)]


def passes_without_autojunk(source: str, cba: str) -> bool:
    """Whether the source passes at its best alignment when autojunk is off.

    Diagnostic only: the checks keep difflib's default `autojunk=True`, which treats
    characters frequent in a window of 200+ characters as junk.

    Args:
        source: The rule source.
        cba: The document.

    Returns:
        True if difflib without autojunk scores the aligned window above 0.85.
    """
    alignment = fuzz.partial_ratio_alignment(source, cba)
    if alignment is None:
        return False
    window = cba[alignment.dest_start : alignment.dest_start + len(source)]
    matcher = difflib.SequenceMatcher(None, source, window, autojunk=False)
    return matcher.ratio() > DEFAULT_THRESHOLD


def length_range(indices: Sequence[int], sources: Sequence[Source]) -> str:
    """The span of source lengths among `indices`, e.g. "61-139 chars".

    Args:
        indices: Indices into `sources`.
        sources: The sources.

    Returns:
        The range, or "-" when there are none.
    """
    lengths = [len(sources[i].text) for i in indices]
    return f"{min(lengths)}-{max(lengths)} chars" if lengths else "-"


def yes_no(ok: bool) -> str:  # noqa: FBT001 - a plain predicate
    """Yes or no.

    Args:
        ok: The condition.

    Returns:
        The label.
    """
    return "yes" if ok else "no"


def print_report(
    sources: Sequence[Source],
    runs: dict[tuple[str, str], Run],
    differing: dict[str, list[int]],
    summary: dict[str, Any],
) -> None:
    """Print the tables.

    Args:
        sources: The sources.
        runs: (method, mode) -> run.
        differing: Mode -> sources where fast and reference disagree.
        summary: The literal-vs-corrected comparison and the target.
    """
    counts = {kind: sum(s.kind == kind for s in sources) for kind in KINDS}
    n_short = sum(s.kind == "edited" and len(s.text) <= SHORT for s in sources)
    print(
        f"Phase-5 faithfulness on the NBA CBA text ({summary['document_chars']:,} "
        f"chars), {len(sources)} rule sources:\n"
        f"exact {counts['exact']}, edited {counts['edited']} ({n_short} of "
        f"<= {SHORT} chars), unrelated {counts['unrelated']}; threshold "
        f"{DEFAULT_THRESHOLD}, seed {summary['seed']}.\n"
        f"Python {platform.python_version()}, rapidfuzz {rapidfuzz.__version__}.\n"
    )
    header = (
        f"{'method':<10} {'mode':<10} {'seconds':>9} {'speed-up':>9}   "
        f"{'faithful: exact':>15} {'edited':>7} {'unrelated':>9}"
    )
    print(header)
    print("-" * len(header))
    for mode in MODES:
        reference = runs["reference", mode]
        for method in ("reference", "fast"):
            run = runs[method, mode]
            by_kind = faithful_by_kind(run, sources)
            speedup = reference.seconds / run.seconds
            print(
                f"{method:<10} {mode:<10} {run.seconds:>9.3f} {speedup:>8.1f}x   "
                f"{by_kind['exact']:>9}/{counts['exact']:<5} "
                f"{by_kind['edited']:>3}/{counts['edited']:<3} "
                f"{by_kind['unrelated']:>5}/{counts['unrelated']:<3}"
            )
    print(
        "(reference: difflib on every window, run once; fast: one FaithfulnessChecker,"
        "\n best of the repeats, its construction included. speed-up: against the"
        "\n reference of the same mode)\n"
    )
    for mode in MODES:
        bad = differing[mode]
        print(
            f"decisions identical ({mode}, fast vs reference): "
            f"{yes_no(not bad)} ({len(sources) - len(bad)}/{len(sources)})"
        )
    literal_corrected = summary["literal_vs_corrected"]
    print(
        f"\nliteral vs corrected mode: {literal_corrected['count']} of "
        f"{len(sources)} decisions differ"
    )
    for kind in KINDS:
        entry = literal_corrected["by_kind"][kind]
        if entry["count"]:
            print(
                f"  {kind:<9} {entry['count']:>3} (only corrected accepts "
                f"{entry['only_corrected']}; {entry['short']} of <= {SHORT} chars; "
                f"lengths {entry['lengths']})"
            )
        else:
            print(f"  {kind:<9}   0")
    rejected = summary["edited_rejected_by_corrected"]
    if rejected["count"]:
        print(
            f"edited sources corrected mode still rejects: {rejected['count']} "
            f"(lengths {rejected['lengths']}); {rejected['pass_without_autojunk']} "
            f"of them score above {DEFAULT_THRESHOLD} at the aligned window with "
            "autojunk=False"
        )
    else:
        print("edited sources corrected mode still rejects: none")
    target = summary["target"]
    verdict = "PASS" if target["pass"] else "FAIL"
    print(
        f"\nTarget: fast literal >= {TARGET_SPEEDUP:.0f}x faster than reference literal"
        f": {target['value']:.1f}x {verdict}"
    )


def summarise(
    sources: Sequence[Source], runs: dict[tuple[str, str], Run], cba: str, seed: int
) -> dict[str, Any]:
    """Compare the modes and check the target.

    Args:
        sources: The sources.
        runs: (method, mode) -> run.
        cba: The document.
        seed: The seed the sources were built with.

    Returns:
        The figures the report and the JSON share.
    """
    literal, corrected = runs["reference", "literal"], runs["reference", "corrected"]
    differ = mismatches(literal, corrected)
    by_kind = {}
    for kind in KINDS:
        indices = [i for i in differ if sources[i].kind == kind]
        by_kind[kind] = {
            "count": len(indices),
            "only_corrected": sum(corrected.decisions[i] for i in indices),
            "short": sum(len(sources[i].text) <= SHORT for i in indices),
            "lengths": length_range(indices, sources),
            "indices": indices,
        }
    rejected = [
        i
        for i, source in enumerate(sources)
        if source.kind == "edited" and not corrected.decisions[i]
    ]
    speedup = literal.seconds / runs["fast", "literal"].seconds
    return {
        "document_chars": len(cba),
        "seed": seed,
        "literal_vs_corrected": {"count": len(differ), "by_kind": by_kind},
        "edited_rejected_by_corrected": {
            "count": len(rejected),
            "lengths": length_range(rejected, sources),
            "pass_without_autojunk": sum(
                passes_without_autojunk(sources[i].text, cba) for i in rejected
            ),
            "indices": rejected,
        },
        "target": {
            "value": speedup,
            "goal": f">= {TARGET_SPEEDUP}",
            "pass": speedup >= TARGET_SPEEDUP,
        },
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line: `argv`, or `sys.argv[1:]` when None."""
    parser = _common.make_parser(
        __doc__, data=True, repeats_help="timed runs of each fast check"
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="seed for building the sources"
    )
    return _common.parse_arguments(parser, argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on `argv` (`sys.argv[1:]` when None); print the report.

    Returns:
        The exit status: 1 if fast and reference decisions differ, else 0.

    Raises:
        SystemExit: With status 2 if the data is missing.
    """
    args = parse_args(argv)
    data_dir = _common.require_data_dir(args.data_dir, [CBA_PATH])
    cba_file = data_dir / CBA_PATH
    cba = cba_file.read_text(encoding="utf-8")
    pep8_file = data_dir / PEP8_PATH
    unrelated = (
        pep8_file.read_text(encoding="utf-8")
        if pep8_file.is_file()
        else generated_text(random.Random(args.seed + 1), 60_000)
    )
    sources = build_sources(cba, unrelated, args.seed)

    runs: dict[tuple[str, str], Run] = {}
    for mode in MODES:
        runs["fast", mode] = run_fast(cba, sources, mode, args.repeats)
        runs["reference", mode] = run_reference(cba, sources, mode)
    differing: dict[str, list[int]] = {
        mode: mismatches(runs["fast", mode], runs["reference", mode]) for mode in MODES
    }
    summary = summarise(sources, runs, cba, args.seed)
    print_report(sources, runs, differing, summary)

    for mode_name, indices in differing.items():
        for i in indices:
            print(
                f"ERROR: {mode_name}: source {i} ({sources[i].kind}, "
                f"{len(sources[i].text)} chars): fast "
                f"{runs['fast', mode_name].decisions[i]}, reference "
                f"{runs['reference', mode_name].decisions[i]}",
                file=sys.stderr,
            )

    if args.json is not None:
        figures = {
            "document": str(cba_file),
            "sources": [
                {
                    "kind": source.kind,
                    "length": len(source.text),
                    "origin": source.origin,
                    "edits": source.edits,
                    **{
                        f"{method}_{mode}": {
                            "faithful": run.decisions[i],
                            "exact": run.exact[i],
                            "score": run.scores[i],
                        }
                        for (method, mode), run in runs.items()
                    },
                }
                for i, source in enumerate(sources)
            ],
            "runs": [
                {
                    key: value
                    for key, value in asdict(run).items()
                    if key not in {"decisions", "exact", "scores"}
                }
                for run in runs.values()
            ],
            "identical": {mode: not bad for mode, bad in differing.items()},
            **summary,
        }
        _common.write_json(args.json, figures)
        print(f"\nFigures written to {args.json}")

    return 1 if any(differing.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
