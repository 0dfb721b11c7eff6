"""Timing of extraction's text helpers: sectioning, `locate_span`, `coverage`.

The unit tests check what these return; this script times them on the same inputs:

1. `split_sections` on PEP 8 (`pep8/pep-0008.rst`) and on the NBA CBA text
   (`rulearena_nba/reference_rules.txt`), each in its detected format with the
   default budget of 1,500 tokens, as in `tests/unit_tests/test_sectioning.py`.
   Skipped, with a note, when the shared data directory is not found.
2. `locate_span` on 100 KB of generated prose: a 300-character span near the end
   with its whitespace collapsed and curly apostrophes (found by normalisation), and
   the same span with a word added (not found), as in
   `tests/unit_tests/test_verification.py`.
3. `coverage` of `--spans` random spans against as many random rule sources over a
   million characters (seeded as in `test_verification.py`).

Each figure is the best of `--repeats` runs. Nothing is asserted about speed; the
exit status is 1 only if a result is wrong (a span not found, or found where none
is), 2 if `--data-dir` is given and it or a document is missing.

Run from the repository root:

    python benchmarks/bench_text.py [--data-dir DIR] [--repeats N] [--spans N]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import _common
from langchain_tag_experiments.data import shared_data_dir

from langchain_tag.extraction.sectioning import detect_format, split_sections
from langchain_tag.extraction.verification import coverage, locate_span

T = TypeVar("T")

PEP8 = Path("pep8") / "pep-0008.rst"
NBA = Path("rulearena_nba") / "reference_rules.txt"
PROSE_CHARS, PROSE_SEED, COVERAGE_SEED = 100_000, 17, 29
_CBA_LIKE = (
    "the team may sign a player to a contract whose salary exceeds the cap only if "
    "it uses an exception such as the mid level or the bi annual exception and each "
    "trade must keep incoming salary within one hundred twenty five percent of the "
    "outgoing salary plus one hundred thousand dollars during any season after the "
    "moratorium ends while a rookie scale contract may be extended once"
)
WORDS = tuple(_CBA_LIKE.split())
"""The vocabulary of `test_verification.py`'s CBA-like prose."""


def best_of(repeats: int, call: Callable[[], T]) -> tuple[float, list[float], T]:
    """The best time of `repeats` calls, all the times, and the last result."""
    started = time.perf_counter()
    result = call()
    times = [time.perf_counter() - started]
    for _ in range(repeats - 1):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return min(times), times, result


def prose(rng: random.Random, n_chars: int) -> str:
    """Sentences from WORDS with commas, paragraphs and hard line wraps.

    The same generator as `_prose` in `test_verification.py`, so the same seed gives
    the same text.
    """
    parts: list[str] = []
    line = 0
    size = 0
    while size < n_chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18)))
        sentence = sentence[0].upper() + sentence[1:] + rng.choice(".;.:.")
        if rng.random() < 0.3:
            sentence = sentence.replace(" ", ", ", 1)
        for word in sentence.split(" "):
            separator = " "
            if line > 70:
                separator, line = "\n", 0
            piece = word if not parts else separator + word
            parts.append(piece)
            line += len(piece)
            size += len(piece)
        if rng.random() < 0.15:
            parts.append("\n\n")
            line = 0
    return "".join(parts)


def ms(seconds: float) -> str:
    """Seconds as milliseconds, for printing."""
    return f"{seconds * 1000:.2f} ms"


def sectioning(data_dir: Path | None, repeats: int) -> list[dict[str, Any]]:
    """Figures of 1; empty when the data is missing."""
    if data_dir is None:
        print("1. Sectioning: skipped (no shared data directory)")
        return []
    print("1. Sectioning (split_sections):")
    results = []
    for document_id, rel in (("pep8", PEP8), ("nba", NBA)):
        path = data_dir / rel
        if not path.is_file():
            print(f"   {rel}: skipped ({path} not found)")
            continue
        text = path.read_text(encoding="utf-8")
        fmt = detect_format(text, str(path))
        best, times, sections = best_of(
            repeats, functools.partial(split_sections, text, document_id, fmt=fmt)
        )
        print(
            f"   {rel} ({len(text):,} characters, {fmt}): {ms(best)}, "
            f"{len(sections)} sections"
        )
        results.append(
            {
                "document": str(rel),
                "characters": len(text),
                "format": fmt,
                "sections": len(sections),
                "seconds": best,
                "all_seconds": times,
            }
        )
    return results


def locating(repeats: int) -> tuple[dict[str, Any], bool]:
    """Figures of 2, and whether the results are right."""
    text = prose(random.Random(PROSE_SEED), PROSE_CHARS)
    span = " ".join(text[90_000:90_300].split()).replace("'", "\u2019")
    found_best, found_times, found = best_of(repeats, lambda: locate_span(span, text))
    missing_best, missing_times, missing = best_of(
        repeats, lambda: locate_span(span + " zebra", text)
    )
    ok = found is not None and found[0] <= 90_000 and missing is None
    print(
        f"2. locate_span in {len(text):,} characters of prose, a {len(span)}-character "
        f"span: found at {found} in {ms(found_best)}; with a word added: "
        f"{'not found' if missing is None else f'found at {missing}'} in "
        f"{ms(missing_best)}{'' if ok else '  WRONG RESULT'}"
    )
    return {
        "characters": len(text),
        "span_characters": len(span),
        "found_at": found,
        "found_seconds": found_best,
        "found_all_seconds": found_times,
        "missing_seconds": missing_best,
        "missing_all_seconds": missing_times,
    }, ok


def covering(n_spans: int, repeats: int) -> dict[str, Any]:
    """Figures of 3."""
    rng = random.Random(COVERAGE_SEED)
    spans = [
        (s, s + rng.randint(1, 400))
        for s in (rng.randint(0, 1_000_000) for _ in range(n_spans))
    ]
    sources = [
        (s, s + rng.randint(1, 400))
        for s in (rng.randint(0, 1_000_000) for _ in range(n_spans))
    ]
    best, times, uncovered = best_of(repeats, lambda: coverage(spans, sources))
    print(
        f"3. coverage of {n_spans:,} spans by {n_spans:,} rule sources: {ms(best)}, "
        f"{len(uncovered):,} uncovered"
    )
    return {
        "spans": n_spans,
        "sources": n_spans,
        "uncovered": len(uncovered),
        "seconds": best,
        "all_seconds": times,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line: `argv`, or `sys.argv[1:]` when None."""
    parser = _common.make_parser(__doc__, data=True, repeats_default=5)
    parser.add_argument(
        "--spans",
        type=int,
        default=5000,
        metavar="N",
        help="spans, and rule sources, for the coverage run (default 5000)",
    )
    args = _common.parse_arguments(parser, argv)
    if args.spans < 1:
        parser.error("--spans must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the three timings (`sys.argv[1:]` when `argv` is None); print them.

    Returns:
        The exit status: 1 if a result was wrong, else 0.

    Raises:
        SystemExit: With status 2 if `--data-dir` is given and missing.
    """
    args = parse_args(argv)
    if args.data_dir is not None:
        data_dir: Path | None = _common.require_data_dir(args.data_dir, [PEP8, NBA])
    else:
        data_dir = shared_data_dir(None)
    print(
        f"Text helpers, best of {args.repeats}; Python {platform.python_version()} on "
        f"{platform.machine()}"
    )
    sections = sectioning(data_dir, args.repeats)
    located, ok = locating(args.repeats)
    covered = covering(args.spans, args.repeats)
    if args.json is not None:
        _common.write_json(
            args.json,
            {
                "repeats": args.repeats,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "sectioning": sections,
                "locate_span": located,
                "coverage": covered,
            },
        )
        print(f"\nwrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
