"""Phase 5 of extraction, verification: programmatic checks, no LLM.

- Faithfulness: is a rule's `source_text` really a span of its source document?
  `check_faithfulness` and the reusable `FaithfulnessChecker`.
- Coverage: is every phase-1 span covered by the source of a surviving rule?
  `coverage`.
- Independence: how many rule names are distinct? `independence`.
- `locate_span` finds an LLM-quoted span in its text (phase-1 validation).

Faithfulness, as the method states it ("literal" mode): the source is faithful if it
is an exact substring of the document; otherwise `difflib.SequenceMatcher(None, src,
window).ratio()` is computed for every window of the document of length
`len(src) + 50` starting at 0, 50, 100, ... (every start below `len(document)`; the
windows at the tail are just shorter slices), and the source is faithful iff the best
ratio is above the threshold (0.85). difflib's defaults are kept, `autojunk=True`
included, because they decide some lightly edited spans.

That check has a flaw: a window is 50 characters longer than the source, so the ratio
is at most `2L / (2L + 50)` for a source of L characters, which is 0.85 or less for
L <= 141. A short source can then only pass by matching exactly (one changed space
fails it), unless it sits in the document's last characters, where windows are
shorter. "corrected" mode, the default, also tries windows of length `len(src)` at
the same starts, and windows anchored where rapidfuzz finds the best alignment of the
source (see `_aligned_windows`).

Literal mode keeps difflib's `autojunk=True`. On a window of 200 characters or more it
makes frequent characters (spaces, common letters) junk, and a long source with a
couple of edits can then score far below the threshold. Corrected mode turns autojunk
off, so a lightly edited long source is judged by what it shares with the text.

Both modes have two implementations that make the same decisions:

- `method="reference"` runs difflib on every window, literally. It is slow: up to
  seconds per source on a 100 KB document.
- `method="fast"` (the default) uses the fact that difflib's ratio is `2M / T` where M,
  the total size of its matching blocks, is at most the length of the longest common
  subsequence. rapidfuzz's Indel normalised similarity is `2 LCS / T`, so it bounds
  the ratio from above (with autojunk too, which only removes matches). The bound is
  computed for all windows at C speed; difflib runs only on windows whose bound
  reaches the threshold, best bound first, and stops at the first one above it.
  `faithful` and `exact` are therefore identical to the reference; `score` and
  `start` describe the best window difflib actually ran on, so they can differ.
"""

from __future__ import annotations

import difflib
import math
import re
import string
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate
from typing import Literal, NamedTuple

from rapidfuzz import fuzz, process
from rapidfuzz.distance import Indel

FaithfulnessMode = Literal["corrected", "literal"]
FaithfulnessMethod = Literal["fast", "reference"]

DEFAULT_THRESHOLD = 0.85
"""Fuzzy matches need a difflib ratio above this (the method's value)."""

WINDOW_SLACK = 50
"""Literal windows are this many characters longer than the source."""

STRIDE = 50
"""Distance between consecutive window starts."""

_BOUND_TOLERANCE = 1e-5
"""Slack when pruning by the upper bound: rapidfuzz applies `score_cutoff` with less
than double precision (a window whose bound equals the threshold to 1e-9 was cut
with a 1e-9 slack), so the slack is far above any rounding."""

_MODES = ("corrected", "literal")
_METHODS = ("fast", "reference")

Window = tuple[int, int]
"""A window of the document as (start, end) offsets, end exclusive."""


class FaithfulnessResult(NamedTuple):
    """The outcome of one faithfulness check."""

    faithful: bool
    """Exact substring, or a window's difflib ratio is above the threshold."""
    score: float
    """1.0 for an exact substring, else the best difflib ratio computed (0.0 if
    none was). The fast method computes fewer ratios than the reference."""
    exact: bool
    """The source is an exact substring of the document."""
    start: int | None
    """Where the exact match, or the best window computed, starts; None if none."""


class IndependenceResult(NamedTuple):
    """Distinctness of rule names: a diagnostic, nothing is removed."""

    ratio: float
    """Unique names / rules; 1.0 when there are no rules."""
    shared_names: dict[str, int]
    """Each name used by several rules (case- and whitespace-normalised): count."""


# --- faithfulness -----------------------------------------------------------------


def check_faithfulness(
    source_text: str,
    document: str,
    *,
    mode: FaithfulnessMode = "corrected",
    threshold: float = DEFAULT_THRESHOLD,
    method: FaithfulnessMethod = "fast",
) -> FaithfulnessResult:
    """Check that `source_text` is a verbatim (or nearly verbatim) span of `document`.

    Args:
        source_text: The rule's quoted source. An empty source is trivially an exact
            substring, as in the method's check; callers decide what blank sources
            mean.
        document: The document the rule was extracted from.
        mode: "corrected" (default) or "literal" (the method's check as stated, for
            reproduction; a source of 141 characters or fewer must match exactly,
            unless it ends the document). See the module docstring.
        threshold: A fuzzy match needs a difflib ratio strictly above this.
        method: "fast" (default) or "reference" (plain difflib on every window).
            Both give the same `faithful` and `exact`.

    Returns:
        The decision, the best ratio computed, and where the match starts.

    Raises:
        ValueError: Unknown mode or method, or a threshold outside [0, 1].

    To check many sources against one document, build a `FaithfulnessChecker` once.
    """
    if method not in _METHODS:
        msg = f"method must be one of {_METHODS}, not {method!r}"
        raise ValueError(msg)
    if method == "reference":
        _validate(mode, threshold)
        return _reference_check(source_text, document, mode, threshold)
    return FaithfulnessChecker(document, mode=mode, threshold=threshold).check(
        source_text
    )


class FaithfulnessChecker:
    """The fast faithfulness check, reusable for many sources against one document.

    Construction validates the settings once and fixes the window starts; every
    window depends on the source's length, so each check slices its own.
    """

    def __init__(
        self,
        document: str,
        *,
        mode: FaithfulnessMode = "corrected",
        threshold: float = DEFAULT_THRESHOLD,
    ) -> None:
        """Prepare checks against `document`.

        Args:
            document: The source document.
            mode: "corrected" (default) or "literal"; see `check_faithfulness`.
            threshold: A fuzzy match needs a difflib ratio strictly above this.

        Raises:
            ValueError: Unknown mode, or a threshold outside [0, 1].
        """
        _validate(mode, threshold)
        self.document = document
        self.mode: FaithfulnessMode = mode
        self.threshold = threshold
        self._starts = range(0, len(document), STRIDE)

    def check(self, source_text: str) -> FaithfulnessResult:
        """Check one source; same `faithful` and `exact` as the reference method.

        Args:
            source_text: The rule's quoted source.

        Returns:
            The decision; `score` and `start` come from the best window difflib
            ran on (the reference runs it on all of them).
        """
        position = self.document.find(source_text)
        if position != -1:
            return FaithfulnessResult(
                faithful=True, score=1.0, exact=True, start=position
            )
        result = self._best_of(source_text, self._stride_windows(len(source_text)))
        if result.faithful or self.mode == "literal":
            return result
        # Only needed when the stride windows failed: the alignment costs a search.
        aligned = _aligned_windows(source_text, self.document, self.threshold)
        second = self._best_of(source_text, aligned)
        if second.faithful or result.start is None:
            return second
        # Neither passed: report the better ratio, the stride window on a tie.
        return second if second.score > result.score else result

    def _stride_windows(self, size: int) -> list[Window]:
        """The mode's windows at every stride start, clipped to the document."""
        n_chars = len(self.document)
        if self.mode == "literal":
            return [(start, start + size + WINDOW_SLACK) for start in self._starts]
        # The two sizes clip to the same window at the document's end.
        return list(
            dict.fromkeys(
                (start, min(n_chars, start + length))
                for start in self._starts
                for length in (size + WINDOW_SLACK, size)
            )
        )

    def _best_of(
        self, source_text: str, windows: Sequence[Window]
    ) -> FaithfulnessResult:
        """Prune windows by the Indel bound, confirm the rest with difflib."""
        texts = [self.document[start:end] for start, end in windows]
        survivors = process.extract(
            source_text,
            texts,
            scorer=Indel.normalized_similarity,
            processor=None,
            score_cutoff=max(0.0, self.threshold - _BOUND_TOLERANCE),
            limit=None,
        )
        # Best bound first; the position breaks ties so the order is reproducible.
        survivors.sort(key=lambda found: (-found[1], found[2]))
        best, best_start = 0.0, None
        for text, _bound, index in survivors:
            ratio = _ratio(source_text, text, self.mode)
            if best_start is None or ratio > best:
                best, best_start = ratio, windows[index][0]
            if ratio > self.threshold:
                break
        return FaithfulnessResult(
            faithful=best > self.threshold, score=best, exact=False, start=best_start
        )


def _ratio(source_text: str, window: str, mode: FaithfulnessMode) -> float:
    # The Indel bound holds either way: autojunk only ever removes matches.
    matcher = difflib.SequenceMatcher(
        None, source_text, window, autojunk=mode == "literal"
    )
    return matcher.ratio()


def _reference_check(
    source_text: str, document: str, mode: FaithfulnessMode, threshold: float
) -> FaithfulnessResult:
    """The check as specified: difflib on every candidate window, no shortcuts."""
    if source_text in document:
        return FaithfulnessResult(
            faithful=True, score=1.0, exact=True, start=document.find(source_text)
        )
    size = len(source_text)
    # Starts 0, 50, 100, ... while below len(document); tail windows are shorter.
    starts = range(0, len(document), STRIDE)
    windows = [(start, start + size + WINDOW_SLACK) for start in starts]
    if mode == "corrected":
        windows += [(start, start + size) for start in starts]
        windows += _aligned_windows(source_text, document, threshold)
    best, best_start = 0.0, None
    for start, end in windows:
        ratio = _ratio(source_text, document[start:end], mode)
        if best_start is None or ratio > best:
            best, best_start = ratio, start
    return FaithfulnessResult(
        faithful=best > threshold, score=best, exact=False, start=best_start
    )


def _aligned_windows(source_text: str, document: str, threshold: float) -> list[Window]:
    """Corrected mode's windows anchored at the source's best alignment.

    rapidfuzz's `partial_ratio_alignment` finds the region of the document most
    similar to the source (the best window of the source's length). The windows are
    `len(src)` and `len(src) + WINDOW_SLACK` characters from the region's start, and
    `len(src)` characters up to its end.

    The search is given a score cutoff c, so it can stop early and returns nothing
    when no region reaches c. That never drops a window that could pass: if every
    window of length L = len(src) has LCS < cL, then a window of length w <= L has
    Indel bound 2 LCS / (L + w) < 2cL / (L + cL) = 2c / (1 + c), and a window of
    length L + S (S = WINDOW_SLACK) has LCS < cL + S, so a bound below
    2(cL + S) / (2L + S). c is the largest value keeping both <= threshold.
    Both methods call this function, so they evaluate the same windows.
    """
    n_chars, size = len(document), len(source_text)
    if not document or not source_text:
        return []
    cutoff = 0.0
    if n_chars >= size:  # else rapidfuzz aligns the document inside the source
        c = min(
            threshold / (2.0 - threshold),
            threshold - WINDOW_SLACK * (2.0 - threshold) / (2.0 * size),
        )
        cutoff = max(0.0, 100.0 * (c - _BOUND_TOLERANCE))  # rapidfuzz uses percentages
    alignment = fuzz.partial_ratio_alignment(
        source_text, document, processor=None, score_cutoff=cutoff
    )
    if alignment is None:
        return []
    start, end = alignment.dest_start, alignment.dest_end
    return [
        (start, min(n_chars, start + size)),
        (start, min(n_chars, start + size + WINDOW_SLACK)),
        (max(0, end - size), end),
    ]


def _validate(mode: str, threshold: float) -> None:
    if mode not in _MODES:
        msg = f"mode must be one of {_MODES}, not {mode!r}"
        raise ValueError(msg)
    if not (math.isfinite(threshold) and 0.0 <= threshold <= 1.0):
        msg = f"threshold must be between 0 and 1, not {threshold!r}"
        raise ValueError(msg)


# --- locating a quoted span --------------------------------------------------------

_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b\u2032"  # curly, low-9, reversed, prime
_DOUBLE_QUOTES = '"\u201c\u201d\u201e\u201f\u00ab\u00bb\u2033'  # ... and guillemets
_DASHES = "-\u2010\u2011\u2012\u2013\u2014\u2212"  # hyphens, en/em dash, minus
_PUNCTUATION = (
    string.punctuation
    + "\u2026"  # ellipsis
    + _SINGLE_QUOTES
    + _DOUBLE_QUOTES
    + _DASHES
)
_TRAILING = re.compile(r"[\s" + re.escape(_PUNCTUATION) + r"]+\Z")
_CHAR_CLASSES = {
    char: "[" + re.escape(group) + "]"
    for group in (_SINGLE_QUOTES, _DOUBLE_QUOTES, _DASHES)
    for char in group
}


def locate_span(span: str, text: str) -> tuple[int, int] | None:
    """Find an LLM-quoted span in `text` and return its (start, end) offsets.

    An exact match wins. Otherwise the span matches where it would after
    normalising both sides: whitespace runs equal any whitespace run, curly quotes,
    guillemets and primes equal ASCII quotes, en/em dashes and the like equal `-`;
    the span's leading and trailing whitespace is ignored, and so are differences
    in its trailing punctuation. The offsets are into the original `text`:
    `text[start:end]` is the matched text as the document has it, including as much
    of the document's trailing punctuation as the span had characters of it.

    Args:
        span: The quoted span.
        text: The text it should come from.

    Returns:
        The first occurrence, or None if there is none or the span is blank.
    """
    if not span.strip():
        return None
    position = text.find(span)
    if position != -1:
        return position, position + len(span)
    stripped = span.strip()
    core = _TRAILING.sub("", stripped)
    if not core:
        return None
    trailing = sum(not c.isspace() for c in stripped[len(core) :])
    # A regex over the original text: offsets are exact without an index map.
    pattern = r"\s+".join(
        "".join(_CHAR_CLASSES.get(char) or re.escape(char) for char in token)
        for token in core.split()
    )
    if trailing:
        # The span ended a phrase: the match must not stop inside a word.
        boundary = r"(?!\w)" if re.match(r"\w", core[-1]) else ""
        pattern += (
            boundary + "[" + re.escape(_PUNCTUATION) + "]{0," + str(trailing) + "}"
        )
    found = re.search(pattern, text)
    return None if found is None else (found.start(), found.end())


# --- coverage and independence -----------------------------------------------------


def coverage(
    spans: Sequence[tuple[int, int]],
    rule_sources: Sequence[tuple[int, int]],
    *,
    min_overlap: float = 0.5,
) -> list[int]:
    """Indices of phase-1 spans that no surviving rule's source covers.

    A span of length L is covered when one rule source (not several together)
    shares at least `min_overlap * L` characters with it. A zero-length span is
    covered when its position lies within a rule source (ends included).

    Args:
        spans: Phase-1 spans as (start, end) document offsets, end exclusive.
        rule_sources: The surviving rules' source offsets, same convention.
        min_overlap: The fraction of the span that must be covered, in (0, 1].

    Returns:
        The indices into `spans` of the uncovered spans, ascending.

    Raises:
        ValueError: `min_overlap` outside (0, 1], or an interval ending before it
            starts.
    """
    if not 0.0 < min_overlap <= 1.0:
        msg = f"min_overlap must be in (0, 1], not {min_overlap!r}"
        raise ValueError(msg)
    _check_intervals("spans", spans)
    _check_intervals("rule_sources", rule_sources)
    ordered = sorted(rule_sources)
    starts = [start for start, _ in ordered]
    # furthest_end[k]: the furthest end among the first k + 1 sources by start.
    furthest_end = list(accumulate((end for _, end in ordered), max))
    uncovered = []
    for index, (start, end) in enumerate(spans):
        before = bisect_right(starts, start)  # sources starting at or before `start`
        reach = furthest_end[before - 1] if before else None
        if end == start:
            if reach is None or reach < start:
                uncovered.append(index)
            continue
        need = min_overlap * (end - start)
        # A source starting at or before the span overlaps it by min(end, its end)
        # - start, so the one reaching furthest is the best of them.
        if reach is not None and min(end, reach) - start >= need:
            continue
        # A source starting inside overlaps by at most end - its start: only those
        # starting early enough can reach `need`.
        last = bisect_right(starts, end - need)
        if not any(
            min(end, ordered[k][1]) - ordered[k][0] >= need for k in range(before, last)
        ):
            uncovered.append(index)
    return uncovered


def _check_intervals(name: str, intervals: Sequence[tuple[int, int]]) -> None:
    for index, (start, end) in enumerate(intervals):
        if end < start:
            msg = f"{name}[{index}] ends ({end}) before it starts ({start})"
            raise ValueError(msg)


def independence(names: Sequence[str]) -> IndependenceResult:
    """Unique rule names over rules, and the names several rules share.

    Names are compared after case folding and collapsing whitespace runs, so
    "Use  spaces" and "use spaces" are the same name.

    Args:
        names: One name per rule, after deduplication.

    Returns:
        The ratio (1.0 for no rules) and each shared normalised name with its count,
        in order of first use.
    """
    counts = Counter(" ".join(name.split()).casefold() for name in names)
    ratio = len(counts) / len(names) if names else 1.0
    return IndependenceResult(
        ratio=ratio, shared_names={name: n for name, n in counts.items() if n > 1}
    )
