"""The thresholds: fractional YES mass, conformal options, the miss budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from langchain_tag.learning._fit_records import RuleFit
from langchain_tag.learning._thresholds import (
    Candidate,
    Masses,
    Option,
    allocate,
    threshold_options,
)


def test_skipped_pairs_weigh_as_fractional_yes_by_hand() -> None:
    # Labelled: input 0 judged YES, 3 judged NO (weight 1); 1 and 2 explored
    # (weight 1 / 0.05), NO and YES, with skip records: they count once.
    pairs = [(0, True, 1.0), (1, False, 20.0), (2, True, 20.0), (3, False, 1.0)]
    # Skipped: 1 and 2 (explored), 4 and 5 without a verdict.
    skipped = [(1, 0.1), (2, 0.1), (4, 0.2), (5, 0.05)]
    masses = Masses.of(pairs, skipped)
    # S = 1 explored YES of N = 2: q = (1 + 10 q0) / (2 + 10).
    assert masses.imputed_rows.tolist() == [4, 5]
    assert masses.yes.tolist() == pytest.approx([1, 0, 1, 0, 3 / 12, 1.5 / 12])
    assert masses.no.tolist() == pytest.approx([0, 1, 0, 1, 9 / 12, 10.5 / 12])
    assert masses.rate == pytest.approx((2 + 4.5 / 12 + 0.5) / (6 + 1))
    # Without skip records the weights stand: the explored pairs count 20 times.
    plain = Masses.of(pairs, [])
    assert plain.yes.tolist() == [1, 0, 20, 0]
    assert plain.rate == pytest.approx((21 + 0.5) / (42 + 1))


def test_threshold_options_spend_yes_mass_by_hand() -> None:
    scores = np.asarray([0.9, 0.1, 0.5])
    yes = np.asarray([1.0, 0.25, 0.0])
    no = np.asarray([0.0, 0.75, 1.0])
    options = threshold_options(scores, yes, no, rate=0.4)
    # A threshold at each score carrying YES mass, then always: conformal +1 on
    # the YES mass below (of 1.25), the NO mass below (of 1.75) skipped.
    assert [o.threshold for o in options] == [0.1, 0.9, float("inf")]
    assert [o.miss for o in options] == pytest.approx(
        [0.4 * 1 / 2.25, 0.4 * 1.25 / 2.25, 0.4]
    )
    assert [o.skip for o in options] == pytest.approx([0.0, 0.6, 0.6])


def test_the_miss_budget_goes_where_it_skips_the_most() -> None:
    fit = RuleFit(status="learned", examples=10, positives=2)
    keep = Option(-math.inf, 0.0, 0.0)
    # A: 0.5 skips for 0.01 misses (slope 50); B: 0.2 for 0.01 (20), then all of
    # its skips for 0.1 more; A's second step skips less for its cost (a hull).
    a = Candidate("A", fit, [keep, Option(0.1, 0.01, 0.5), Option(0.2, 0.1, 0.6)])
    b = Candidate("B", fit, [keep, Option(0.3, 0.01, 0.2), Option(math.inf, 0.11, 0.9)])
    spent = allocate([a, b], budget=0.025)
    assert (a.chosen, b.chosen) == (1, 1)
    assert spent == pytest.approx(0.02)
    # More budget: B's long step (7 skips per miss) before A's (1.1).
    a.chosen = b.chosen = 0
    assert allocate([a, b], budget=0.12) == pytest.approx(0.12)
    assert (a.chosen, b.chosen) == (1, 2)
