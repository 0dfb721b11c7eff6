"""Tests for phase-5 verification: faithfulness, locate_span, coverage, independence.

The fast faithfulness method must make exactly the reference's decisions, so most
faithfulness tests run both on the same case, in both modes.
"""

from __future__ import annotations

import difflib
import random
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from rapidfuzz.distance import Indel

from langchain_tag.extraction.verification import (
    FaithfulnessChecker,
    FaithfulnessMode,
    FaithfulnessResult,
    IndependenceResult,
    check_faithfulness,
    coverage,
    independence,
    locate_span,
)

MODES: tuple[FaithfulnessMode, ...] = ("literal", "corrected")

_CBA_LIKE = (
    "the team may sign a player to a contract whose salary exceeds the cap only if "
    "it uses an exception such as the mid level or the bi annual exception and each "
    "trade must keep incoming salary within one hundred twenty five percent of the "
    "outgoing salary plus one hundred thousand dollars during any season after the "
    "moratorium ends while a rookie scale contract may be extended once"
)
_PEP8_LIKE = (
    "indentation uses four spaces per level continuation lines align wrapped "
    "elements vertically imports go on separate lines wildcard imports are avoided "
    "surround top level function definitions with two blank lines docstrings"
)
WORDS = tuple(_CBA_LIKE.split())
OTHER_WORDS = tuple(_PEP8_LIKE.split())


def _rng(seed: int) -> random.Random:
    return random.Random(seed)  # noqa: S311 - test data, not cryptography


def _prose(rng: random.Random, n_chars: int, words: tuple[str, ...]) -> str:
    """Sentences from `words` with commas, paragraphs and hard line wraps."""
    parts: list[str] = []
    line = 0
    size = 0
    while size < n_chars:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(6, 18)))
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


def _edit(rng: random.Random, text: str, edits: int) -> str:
    """Apply `edits` random one-character edits to `text`.

    Each is a substitution, insertion, deletion, or whitespace change (a space
    becomes a newline or the other way round).
    """
    chars = list(text)
    for _ in range(edits):
        where = rng.randrange(len(chars))
        kind = rng.choice(("substitute", "insert", "delete", "whitespace"))
        if kind == "substitute":
            chars[where] = rng.choice("xqzjkv0#")
        elif kind == "insert":
            chars.insert(where, rng.choice("xqzjkv0#"))
        elif kind == "delete" and len(chars) > 1:
            del chars[where]
        else:
            spaces = [i for i, char in enumerate(chars) if char in " \n"]
            if spaces:
                i = rng.choice(spaces)
                chars[i] = "\n" if chars[i] == " " else " "
            else:
                chars[where] = "x"
    return "".join(chars)


def _slice(rng: random.Random, document: str, length: int) -> str:
    start = rng.randrange(max(1, len(document) - length))
    return document[start : start + length]


class Case(NamedTuple):
    """A source checked against a document."""

    name: str
    source: str
    document: str


def _cases() -> list[Case]:
    rng = _rng(20240517)
    document = _prose(rng, 2500, WORDS)
    cases = [
        Case("exact-start", document[:100], document),
        Case("exact-end", document[-100:], document),
        Case("exact-whole", document, document),
        Case("empty-source", "", document),
        Case("empty-document", "a rule that is not there", ""),
        Case("empty-both", "", ""),
        Case("longer-than-document", _edit(rng, document[:180], 2), document[:120]),
        Case("edited-start", _edit(rng, document[:160], 2), document),
        Case("edited-end", _edit(rng, document[-260:], 3), document),
        Case("edited-short-start", _edit(rng, document[:90], 1), document),
        Case("edited-short-end", _edit(rng, document[-70:], 1), document),
    ]
    cases += [
        Case(f"exact-{length}", _slice(rng, document, length), document)
        for length in (1, 30, 60, 141, 200, 400)
    ]
    cases += [
        Case(
            f"edited-{length}x{edits}",
            _edit(rng, _slice(rng, document, length), edits),
            document,
        )
        for length in (60, 100, 141, 142, 180, 260, 400)
        for edits in (1, 3)
    ]
    # Many edits put the ratio near the threshold, where pruning must be exact.
    cases += [
        Case(
            f"near-threshold-{length}x{edits}",
            _edit(rng, _slice(rng, document, length), edits),
            document,
        )
        for length, edits in (
            (150, 8),
            (200, 10),
            (200, 16),
            (300, 14),
            (300, 22),
            (400, 30),
        )
    ]
    cases += [
        Case(
            f"random-{i}",
            _edit(rng, _slice(rng, document, rng.randint(20, 450)), rng.randint(1, 6)),
            document,
        )
        for i in range(12)
    ]
    cases += [
        Case(
            f"whitespace-normalised-{length}",
            " ".join(_slice(rng, document, length).split()),
            document,
        )
        for length in (80, 200, 350)
    ]
    cases += [
        Case(f"unrelated-{length}", _prose(rng, length, OTHER_WORDS)[:length], document)
        for length in (50, 150, 400)
    ]
    # Near-copies of one passage: several windows tie or nearly tie.
    passage = _slice(rng, document, 220)
    repeated = "\n\n".join(
        [
            document[:700],
            passage,
            document[700:1400],
            _edit(rng, passage, 4),
            document[1400:],
        ]
    )
    cases.append(Case("repeated-passage", _edit(rng, passage, 3), repeated))
    return cases


CASES = _cases()


def _decision(result: FaithfulnessResult) -> tuple[bool, bool]:
    return result.faithful, result.exact


# --- faithfulness: fast vs reference --------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
@pytest.mark.parametrize("mode", MODES)
def test_fast_and_reference_make_the_same_decision(
    case: Case, mode: FaithfulnessMode
) -> None:
    reference = check_faithfulness(
        case.source, case.document, mode=mode, method="reference"
    )
    fast = check_faithfulness(case.source, case.document, mode=mode, method="fast")
    assert _decision(fast) == _decision(reference)
    if fast.faithful:
        assert fast.score > 0.85 or fast.exact
    # The fast method computes a subset of the reference's ratios.
    assert fast.score <= reference.score


def test_generated_cases_cover_every_outcome() -> None:
    outcomes = {
        (mode, check_faithfulness(case.source, case.document, mode=mode).faithful)
        for case in CASES
        for mode in MODES
    }
    assert outcomes == {
        (mode, faithful) for mode in MODES for faithful in (True, False)
    }


def test_exact_match_reports_its_position() -> None:
    document = "Alpha beta. Gamma delta. Gamma delta."
    for method in ("fast", "reference"):
        result = check_faithfulness("Gamma delta.", document, method=method)
        assert result == FaithfulnessResult(
            faithful=True, score=1.0, exact=True, start=12
        )


def test_empty_document_has_no_windows() -> None:
    for mode in MODES:
        for method in ("fast", "reference"):
            result = check_faithfulness("some rule", "", mode=mode, method=method)
            assert result == FaithfulnessResult(
                faithful=False, score=0.0, exact=False, start=None
            )


def test_reference_literal_is_the_specified_window_rule() -> None:
    rng = _rng(7)
    document = _prose(rng, 1300, WORDS)[:1234]
    source = _edit(rng, document[300:520], 3)
    # Windows of len(src) + 50 starting at 0, 50, ..., the last start below len(doc).
    ratios = [
        (
            difflib.SequenceMatcher(
                None, source, document[start : start + len(source) + 50]
            ).ratio(),
            start,
        )
        for start in range(0, len(document), 50)
    ]
    assert ratios[-1][1] == 1200
    best, start = max(ratios, key=lambda item: (item[0], -item[1]))
    result = check_faithfulness(source, document, mode="literal", method="reference")
    assert result == FaithfulnessResult(
        faithful=best > 0.85, score=best, exact=False, start=start
    )


@pytest.mark.parametrize("length", [60, 100, 141])
def test_literal_mode_cannot_accept_a_short_edited_source(length: int) -> None:
    # With windows of L + 50 the best ratio is 2L / (2L + 50) <= 0.85 for L <= 141.
    rng = _rng(length)
    document = _prose(rng, 1500, WORDS)
    original = document[400 : 400 + length]
    position = length // 2
    replacement = "#" if original[position] != "#" else "x"
    source = original[:position] + replacement + original[position + 1 :]
    for method in ("fast", "reference"):
        literal = check_faithfulness(source, document, mode="literal", method=method)
        assert not literal.faithful
        assert literal.score <= 2 * length / (2 * length + 50) <= 0.85
        corrected = check_faithfulness(
            source, document, mode="corrected", method=method
        )
        assert corrected.faithful
        assert corrected.score >= 1 - 1 / length - 1e-12
    # 142 is the first length whose ceiling passes (0.8503); 141 gives 0.8494.
    assert 2 * 142 / (2 * 142 + 50) > 0.85 > 2 * 141 / (2 * 141 + 50)


def test_corrected_mode_accepts_a_100_char_source_with_one_change() -> None:
    document = (
        "Section 7. A Team may exceed the Salary Cap to re-sign its own Veteran Free "
        "Agent, provided the Player finished the prior season on the Team's roster and "
        "the new Contract meets the raise limits of this Article."
    )
    source = document[11:111]
    source = source[:40] + ("X" if source[40] != "X" else "Y") + source[41:]
    assert len(source) == 100
    assert not check_faithfulness(source, document, mode="literal").faithful
    assert check_faithfulness(source, document).faithful
    reference = check_faithfulness(source, document, method="reference")
    # The aligned window: a 100-character window from a stride start scores less.
    assert (reference.faithful, reference.exact, reference.start) == (True, False, 11)
    assert reference.score == pytest.approx(0.99)


def test_indel_similarity_bounds_difflib_ratio() -> None:
    rng = _rng(3)
    document = _prose(rng, 4000, WORDS)
    for _ in range(300):
        source = _edit(
            rng, _slice(rng, document, rng.randint(1, 400)), rng.randint(0, 40)
        )
        window = _slice(rng, document, rng.randint(1, 450))
        for pair in (
            (source, window),
            (source, source[::-1]),
            (source, document[:500]),
        ):
            ratio = difflib.SequenceMatcher(None, *pair).ratio()
            assert Indel.normalized_similarity(*pair) >= ratio - 1e-12


def test_threshold_is_strict_in_both_methods() -> None:
    rng = _rng(11)
    document = _prose(rng, 2000, WORDS)
    source = _edit(rng, document[500:800], 8)
    for mode in MODES:
        score = check_faithfulness(
            source, document, mode=mode, method="reference"
        ).score
        for threshold, expected in ((score, False), (score - 1e-12, True)):
            for method in ("fast", "reference"):
                result = check_faithfulness(
                    source, document, mode=mode, threshold=threshold, method=method
                )
                assert result.faithful is expected


def test_fast_method_skips_difflib_when_the_bound_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = difflib.SequenceMatcher

    def counting(*args: Any, **kwargs: Any) -> difflib.SequenceMatcher[str]:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(difflib, "SequenceMatcher", counting)
    rng = _rng(5)
    document = _prose(rng, 5000, WORDS)
    checker = FaithfulnessChecker(document)
    assert checker.check(document[1000:1300]).exact
    assert not checker.check(_prose(rng, 300, OTHER_WORDS)).faithful
    assert calls == []
    assert checker.check(_edit(rng, document[2000:2300], 2)).faithful
    assert 1 <= len(calls) <= 3


def test_checker_is_reusable_and_matches_the_function() -> None:
    rng = _rng(13)
    document = _prose(rng, 3000, WORDS)
    sources = [
        _edit(rng, _slice(rng, document, n), rng.randint(0, 4))
        for n in (80, 80, 200, 200, 300)
    ]
    for mode in MODES:
        checker = FaithfulnessChecker(document, mode=mode)
        for source in sources:
            assert checker.check(source) == check_faithfulness(
                source, document, mode=mode
            )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "loose"},
        {"threshold": 1.5},
        {"threshold": -0.1},
        {"threshold": float("nan")},
        {"method": "quick"},
    ],
)
def test_invalid_arguments_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        check_faithfulness("a", "abc", **kwargs)


@pytest.mark.requires_data
def test_nba_text_fast_and_reference_agree(data_dir: Path) -> None:
    text = (data_dir / "rulearena_nba" / "reference_rules.txt").read_text(
        encoding="utf-8"
    )
    # An excerpt keeps the reference (difflib on every window) to a few seconds.
    document = text[30_000:36_000]
    pep8 = data_dir / "pep8" / "pep-0008.rst"
    rng = _rng(42)
    unrelated = (
        pep8.read_text(encoding="utf-8")
        if pep8.is_file()
        else _prose(rng, 20_000, OTHER_WORDS)
    )
    sources = [_slice(rng, document, rng.randint(60, 400)) for _ in range(10)]
    sources += [
        _edit(rng, _slice(rng, document, rng.randint(60, 300)), rng.randint(1, 4))
        for _ in range(10)
    ]
    sources += [_slice(rng, unrelated, rng.randint(60, 200)) for _ in range(10)]
    for mode in MODES:
        checker = FaithfulnessChecker(document, mode=mode)
        fast = [_decision(checker.check(source)) for source in sources]
        reference = [
            _decision(
                check_faithfulness(source, document, mode=mode, method="reference")
            )
            for source in sources
        ]
        assert fast == reference
        assert all(faithful for faithful, _ in fast[:10])
        assert not any(faithful for faithful, _ in fast[20:])


# --- locate_span ----------------------------------------------------------------------


def _normalised(text: str) -> str:
    table = str.maketrans(
        "\u2018\u2019\u201c\u201d\u00ab\u00bb\u2013\u2014", '\'\'""""--'
    )
    return " ".join(text.translate(table).split()).rstrip(".;:,!?")


@pytest.mark.parametrize(
    ("span", "text", "expected"),
    [
        ("Gamma delta", "Alpha beta. Gamma delta.", "Gamma delta"),
        (
            'Use "double quotes" here.',
            "Please: Use \u201cdouble quotes\u201d here.",
            "Use \u201cdouble quotes\u201d here.",
        ),
        ("it\u2019s fine", "and it's fine to do", "it's fine"),
        (
            '"Bonjour" - said he',
            "He wrote \u00abBonjour\u00bb \u2014 said he.",
            "\u00abBonjour\u00bb \u2014 said he",
        ),
        (
            "Limit all lines to a maximum of 79 characters.",
            "Limit all lines\n   to a maximum of 79\tcharacters.",
            "Limit all lines\n   to a maximum of 79\tcharacters.",
        ),
        (
            "Limit all\n\n lines  to 79",
            "Limit all lines to 79 characters",
            "Limit all lines to 79",
        ),
        (
            "  surrounded by space \n",
            "text surrounded\nby space here",
            "surrounded\nby space",
        ),
        (
            "ends with a period.",
            "it ends with a period; then more",
            "ends with a period;",
        ),
        (
            "ends without punctuation",
            "it ends\nwithout punctuation. Then",
            "ends\nwithout punctuation",
        ),
        ("drops the period", "it drops  the period. Then", "drops  the period"),
        (
            "keeps (regex) chars [a-z]* + $1?",
            "keeps (regex)\nchars [a-z]* + $1? too",
            "keeps (regex)\nchars [a-z]* + $1?",
        ),
        ("the cat.", "the cats sat; then the\ncat.", "the\ncat."),
    ],
)
def test_locate_span_normalises(span: str, text: str, expected: str) -> None:
    found = locate_span(span, text)
    assert found is not None
    start, end = found
    assert text[start:end] == expected
    assert (
        _normalised(text[start:end]) == _normalised(span.strip())
        or text.find(span) == start
    )


def test_locate_span_first_occurrence() -> None:
    text = "one rule here. one\nrule here. one rule here."
    assert locate_span("one rule here.", text) == (0, 14)
    assert locate_span("rule here.", text) == (4, 14)
    assert locate_span("one  rule  here", "x one\nrule here, one rule here") == (2, 15)


@pytest.mark.parametrize(
    ("span", "text"),
    [
        ("not in the text", "some other text entirely"),
        ("one rule", "onerule"),  # whitespace is not invented
        ("", "anything"),
        ("   \n", "anything \n"),
        ("...", "ends here"),
        ("the cat.", "the cats sat"),
    ],
)
def test_locate_span_missing(span: str, text: str) -> None:
    assert locate_span(span, text) is None


def test_locate_span_on_large_texts() -> None:
    """A span near the end of 100 KB, found and missed (timed: bench_text.py)."""
    rng = _rng(17)
    text = _prose(rng, 100_000, WORDS)
    target = text[90_000:90_300]
    span = " ".join(target.split()).replace("'", "\u2019")
    found = locate_span(span, text)
    missing = locate_span(span + " zebra", text)
    assert found is not None
    assert _normalised(text[found[0] : found[1]]) == _normalised(span)
    assert found[0] <= 90_000
    assert missing is None


# --- coverage -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spans", "sources", "expected"),
    [
        ([(0, 10)], [(0, 10)], []),
        ([(0, 10)], [(5, 20)], []),  # exactly half
        ([(0, 10)], [(6, 20)], [0]),
        ([(0, 10)], [(-5, 5)], []),
        ([(0, 10)], [(-5, 4)], [0]),
        ([(0, 10)], [(2, 8)], []),  # a source inside the span
        ([(0, 10)], [(2, 6)], [0]),
        ([(0, 10)], [(0, 4), (6, 10)], [0]),  # two sources do not add up
        ([(0, 10), (20, 30)], [], [0, 1]),
        ([(5, 5)], [(0, 10)], []),  # zero-length inside
        ([(5, 5)], [(0, 5)], []),  # ... ends included
        ([(5, 5)], [(6, 9)], [0]),
        ([(5, 5)], [], [0]),
        ([(0, 10), (10, 20), (20, 30)], [(25, 40), (8, 18), (0, 3)], [0]),
    ],
)
def test_coverage_cases(
    spans: list[tuple[int, int]], sources: list[tuple[int, int]], expected: list[int]
) -> None:
    assert coverage(spans, sources) == expected


def test_coverage_min_overlap() -> None:
    assert coverage([(0, 10)], [(1, 10)], min_overlap=1.0) == [0]
    assert coverage([(0, 10)], [(0, 10)], min_overlap=1.0) == []
    assert coverage([(0, 10)], [(8, 12)], min_overlap=0.2) == []


def _covered_brute_force(
    span: tuple[int, int], sources: list[tuple[int, int]], min_overlap: float
) -> bool:
    start, end = span
    if start == end:
        return any(s <= start <= e for s, e in sources)
    return any(
        min(end, e) - max(start, s) >= min_overlap * (end - start) for s, e in sources
    )


def test_coverage_matches_brute_force() -> None:
    rng = _rng(23)

    def interval(max_length: int) -> tuple[int, int]:
        start = rng.randint(0, 100)
        return start, start + rng.randint(0, max_length)

    for _ in range(500):
        spans = [interval(30) for _ in range(rng.randint(0, 12))]
        sources = [interval(40) for _ in range(rng.randint(0, 12))]
        min_overlap = rng.choice((0.1, 0.25, 0.5, 0.75, 1.0))
        expected = [
            i
            for i, span in enumerate(spans)
            if not _covered_brute_force(span, sources, min_overlap)
        ]
        assert coverage(spans, sources, min_overlap=min_overlap) == expected


def test_coverage_on_5000_spans_and_sources() -> None:
    """5,000 spans against 5,000 sources (timed: bench_text.py)."""
    rng = _rng(29)
    spans = [
        (s, s + rng.randint(1, 400))
        for s in (rng.randint(0, 1_000_000) for _ in range(5000))
    ]
    sources = [
        (s, s + rng.randint(1, 400))
        for s in (rng.randint(0, 1_000_000) for _ in range(5000))
    ]
    uncovered = coverage(spans, sources)
    assert 0 < len(uncovered) < len(spans)
    # Every 25th span checked against the brute force, over all 5,000 sources.
    sample, found = range(0, len(spans), 25), set(uncovered)
    assert [i for i in sample if i in found] == [
        i for i in sample if not _covered_brute_force(spans[i], sources, 0.5)
    ]


@pytest.mark.parametrize(
    ("spans", "sources", "min_overlap", "message"),
    [
        ([(0, 1)], [], 0.0, "min_overlap"),
        ([(0, 1)], [], 1.5, "min_overlap"),
        ([(3, 1)], [], 0.5, r"spans\[0\]"),
        ([(0, 1)], [(0, 1), (5, 4)], 0.5, r"rule_sources\[1\]"),
    ],
)
def test_coverage_rejects_bad_input(
    spans: list[tuple[int, int]],
    sources: list[tuple[int, int]],
    min_overlap: float,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        coverage(spans, sources, min_overlap=min_overlap)


# --- independence ---------------------------------------------------------------------


def test_independence_of_no_rules() -> None:
    assert independence([]) == IndependenceResult(ratio=1.0, shared_names={})


def test_independence_all_unique() -> None:
    assert independence(["Use spaces", "Limit line length"]) == IndependenceResult(
        1.0, {}
    )


def test_independence_normalises_case_and_whitespace() -> None:
    result = independence(
        [
            "Use spaces",
            "use  SPACES",
            "Limit lines",
            " Use\nspaces ",
            "limit lines",
            "Wrap",
        ]
    )
    assert result.ratio == pytest.approx(3 / 6)
    assert result.shared_names == {"use spaces": 3, "limit lines": 2}
