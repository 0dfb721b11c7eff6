"""Phase 4's comparisons (`extraction/pairs.py`): the cap, the choice, the calls.

Brute force is the reference: every candidate pair is enumerated and scored with
`similarity`, and the planner must agree with it, in memory that never holds them.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from pydantic import Field
from rapidfuzz import process

from langchain_tag.extraction import (
    ExtractionReport,
    ExtractionSettings,
    aextract_rules,
    extract_rules,
    pairs,
)
from langchain_tag.extraction.pairs import (
    DEFAULT_MAX_PAIRS,
    comparison_calls_bound,
    most_similar_pairs,
    pack_pairs,
    packed_groups_bound,
    plan_comparisons,
    shared_tag_pairs,
    similarity,
    tag_groups,
)
from langchain_tag.extraction.phases import DraftRule
from langchain_tag.extraction.run import run_id_for
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.testing import (
    ExtractionFakeChatModel,
    JudgeAndExtractorFakeChatModel,
)

TAGS = ("salary", "trades", "contracts", "draft", "naming")
WORDS = [
    *("team", "player", "club", "contract", "league", "trade", "roster", "payroll"),
    *("salary", "exception", "cap", "must", "should", "never", "report", "exceed"),
    *("include", "count", "record", "reduce", "extend", "approve", "renew", "file"),
    *("split", "season", "deadline", "waived", "bonus", "percent"),
]


def draft(n: int, *tags: str, text: str | None = None) -> DraftRule:
    words = text or f"rule {n}"
    return DraftRule(
        draft_id=f"d#0000/A-{n:03d}/R-1",
        document_id="d",
        section_id="d#0000",
        name=words[:40],
        condition=f"The input concerns {words}",
        action=f"Apply {words}",
        source_text=words,
        tags=tags,
        span_ids=(f"d#0000/S-{n:03d}",),
        atomic_ids=(f"d#0000/A-{n:03d}",),
    )


def random_drafts(count: int, seed: int = 0) -> list[DraftRule]:
    """Rules of 1-3 tags (some repeated in one rule) and random words."""
    rng = random.Random(seed)  # noqa: S311 - test data
    drafts = []
    for n in range(count):
        tags = rng.sample(TAGS, rng.randint(1, 3))
        if rng.random() < 0.1:
            tags.append(tags[0])  # a repeated tag counts once
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        drafts.append(draft(n, *tags, text=text))
    return drafts


def candidates(drafts: Sequence[DraftRule]) -> list[tuple[int, int]]:
    return [
        (a, b)
        for a, b in combinations(range(len(drafts)), 2)
        if set(drafts[a].tags) & set(drafts[b].tags)
    ]


def ranked(drafts: Sequence[DraftRule]) -> list[tuple[float, int, int]]:
    """Every candidate pair, best first: similarity, then document order."""
    return sorted(
        (-similarity(drafts[a], drafts[b]), a, b) for a, b in candidates(drafts)
    )


def met(groups: Sequence[tuple[str, Sequence[str]]]) -> set[frozenset[str]]:
    return {frozenset(p) for _, ids in groups for p in combinations(ids, 2)}


# --- counting ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_shared_tag_pairs_counts_distinct_pairs(seed: int) -> None:
    drafts = random_drafts(60, seed)
    assert shared_tag_pairs(drafts) == len(candidates(drafts))
    assert shared_tag_pairs([]) == shared_tag_pairs(drafts[:1]) == 0


def test_counting_holds_no_pair() -> None:
    # Before: a set of every pair's ids, 1.1 M tuples (~150 MB) for these rules.
    drafts = [draft(n, "salary", "trades") for n in range(1500)]
    tracemalloc.start()
    try:
        assert shared_tag_pairs(drafts) == 1500 * 1499 // 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


# --- at or under the cap: the groups of today -------------------------------------


@pytest.mark.parametrize("limit", [2, 3, 16])
def test_at_or_under_the_cap_the_groups_are_tag_groups(limit: int) -> None:
    drafts = random_drafts(40, seed=limit)
    total = shared_tag_pairs(drafts)
    expected = [
        (key, [d.draft_id for d in group]) for key, group in tag_groups(drafts, limit)
    ]
    for cap in (None, total, total + 1):
        plan = plan_comparisons(drafts, limit, cap)
        assert plan.groups == expected
        assert plan.candidate_pairs == plan.pairs_compared == total
        assert plan.pairs_skipped == 0
        assert plan.max_pairs == cap
    assert met(expected) == {
        frozenset((drafts[a].draft_id, drafts[b].draft_id))
        for a, b in candidates(drafts)
    }


# --- over the cap: the most similar pairs ----------------------------------------


@pytest.mark.parametrize(("seed", "k"), [(0, 1), (1, 25), (2, 300), (3, 10_000)])
def test_the_most_similar_pairs_are_chosen_within_tags(seed: int, k: int) -> None:
    drafts = random_drafts(80, seed)
    expected = ranked(drafts)[:k]
    found = most_similar_pairs(drafts, k)
    assert [(p.first, p.second) for p in found] == [(a, b) for _, a, b in expected]
    assert [p.score for p in found] == pytest.approx([-s for s, _, _ in expected])
    for pair in found:
        shared = set(drafts[pair.first].tags) & set(drafts[pair.second].tags)
        assert pair.tag == min(shared)  # scored once, under its first shared tag


def test_the_choice_does_not_depend_on_the_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drafts = random_drafts(120, seed=7)
    whole = most_similar_pairs(drafts, 200)
    cells: list[int] = []
    cdist = process.cdist

    def recorded(*args: Any, **kwargs: Any) -> np.ndarray[Any, Any]:
        scores: np.ndarray[Any, Any] = cdist(*args, **kwargs)
        cells.append(scores.size)
        return scores

    monkeypatch.setattr(process, "cdist", recorded)
    monkeypatch.setattr(pairs, "_BLOCK_CELLS", 37)
    assert most_similar_pairs(drafts, 200) == whole
    assert len(cells) > 20
    assert max(cells) <= 120  # one row at a time: a row of the largest tag


def test_similarity_is_over_words() -> None:
    a = draft(1, "x", text="Use four spaces per indentation level")
    assert similarity(a, a) == 1.0
    louder = draft(2, "x", text="USE four spaces, per indentation level!")
    assert similarity(a, louder) == 1.0  # case and punctuation are not words
    other = draft(3, "x", text="Never compare booleans to True with equals")
    assert similarity(a, other) == similarity(other, a) < 0.5


def plan_over_cap(
    drafts: Sequence[DraftRule], limit: int, k: int
) -> tuple[pairs.ComparisonPlan, list[tuple[float, int, int]]]:
    plan = plan_comparisons(drafts, limit, k)
    return plan, ranked(drafts)[:k]


@pytest.mark.parametrize(("limit", "k"), [(2, 40), (3, 100), (16, 150), (16, 700)])
def test_over_the_cap_the_chosen_pairs_meet_in_small_calls(limit: int, k: int) -> None:
    drafts = random_drafts(70, seed=k)
    total = shared_tag_pairs(drafts)
    assert total > k
    plan, chosen = plan_over_cap(drafts, limit, k)
    ids = [d.draft_id for d in drafts]
    by_id = {d.draft_id: d for d in drafts}
    compared = met(plan.groups)
    assert {frozenset((ids[a], ids[b])) for _, a, b in chosen} <= compared
    assert plan.pairs_compared == len(compared) >= k
    assert plan.pairs_skipped == total - len(compared) > 0
    assert plan.candidate_pairs == total
    keys = [key for key, _ in plan.groups]
    assert len(set(keys)) == len(keys)
    per_tag: Counter[str] = Counter()
    for key, members in plan.groups:
        tag, number = key.rsplit(":", 1)
        assert number == str(per_tag[tag])  # `<tag>:<n>`, as tag_groups'
        per_tag[tag] += 1
        assert 2 <= len(members) <= max(limit, 2)
        assert all(tag in by_id[i].tags for i in members)  # within the tag only
        assert members == sorted(members, key=ids.index)  # in document order
    chosen_per_tag = Counter(
        min(set(drafts[a].tags) & set(drafts[b].tags)) for _, a, b in chosen
    )
    for tag, count in per_tag.items():
        assert count <= packed_groups_bound(chosen_per_tag[tag], limit)
    assert plan_comparisons(drafts, limit, k) == plan  # deterministic


def test_calls_stay_few_for_clusters_of_similar_rules() -> None:
    # 20 topics of 8 near-duplicates under one tag: the 560 most similar pairs
    # are the clusters' own, and calls of 16 rules hold two clusters each.
    drafts = [
        draft(
            8 * topic + n,
            "salary",
            text=f"{WORDS[topic]} {WORDS[topic + 1]} r{8 * topic + n}",
        )
        for topic in range(20)
        for n in range(8)
    ]
    plan = plan_comparisons(drafts, 16, 20 * 28)
    assert len(plan.groups) == 10
    assert plan.pairs_compared == 10 * 120


@pytest.mark.parametrize("seed", range(6))
def test_pack_pairs_meets_its_bound(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test data
    rules, limit = rng.randint(5, 60), rng.randint(1, 17)
    everything = list(combinations(range(rules), 2))
    given = rng.sample(everything, rng.randint(1, len(everything)))
    groups = pack_pairs(given, limit)
    meets = {p for group in groups for p in combinations(group, 2)}
    assert set(given) <= meets
    assert all(len(group) <= max(limit, 2) for group in groups)
    assert len(groups) <= packed_groups_bound(len(given), limit)


def test_small_tags_make_more_calls_than_one_tag_but_never_more_than_the_bound() -> (
    None
):
    # 3,000 rules in twos, each two sharing three tags of their own: 1,500 pairs,
    # under the cap, one call a pair a tag. All sharing one tag: 625 calls.
    drafts = [
        draft(n, *(f"t{n // 2}-{k}" for k in range(3)), text=f"rule {n}")
        for n in range(3000)
    ]
    plan = plan_comparisons(drafts, 16, DEFAULT_MAX_PAIRS)
    assert plan.candidate_pairs == plan.pairs_compared == 1500
    assert len(plan.groups) == 3 * 1500 == comparison_calls_bound(1500, 5000)
    one_tag = [d.model_copy(update={"tags": ("general",)}) for d in drafts]
    assert len(plan.groups) > len(
        plan_comparisons(one_tag, 16, DEFAULT_MAX_PAIRS).groups
    )
    assert len(plan.groups) <= comparison_calls_bound(3000 * 2999 // 2, 5000)
    # Over the cap, at most a call a chosen pair.
    assert len(plan_comparisons(drafts, 16, 100).groups) <= 100


@pytest.mark.parametrize("seed", range(4))
def test_comparison_calls_bound_holds_whatever_the_tags(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test data
    drafts = random_drafts(rng.randint(2, 90), seed)
    # Small tags: each rule keeps 3 of many tags.
    small = [
        d.model_copy(update={"tags": tuple(f"s{t}" for t in rng.sample(range(60), 3))})
        for d in drafts
    ]
    for found in (drafts, small):
        total = shared_tag_pairs(found)
        possible = len(found) * (len(found) - 1) // 2
        for limit in (2, 5, 16):
            for cap in (None, 1, max(1, total // 3), total, total + 1):
                calls = len(plan_comparisons(found, limit, cap).groups)
                assert calls <= comparison_calls_bound(total, cap)
                assert calls <= comparison_calls_bound(possible, cap)
    assert comparison_calls_bound(0, None) == 0
    assert comparison_calls_bound(10, 4) == 12  # 4 pairs under the cap, 3 tags each


def test_choosing_holds_no_more_than_a_block_on_an_adversarial_tag() -> None:
    # 3,000 rules under one tag: 4.5 M pairs, 72 MB as two int64 arrays, far
    # more as Python tuples; the planner holds 1,000 pairs and one block.
    rng = random.Random(3)  # noqa: S311 - test data
    drafts = [
        draft(n, "salary", text=" ".join(rng.choice(WORDS) for _ in range(10)))
        for n in range(3000)
    ]
    tracemalloc.start()
    try:
        plan = plan_comparisons(drafts, 16, 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.candidate_pairs == 3000 * 2999 // 2
    assert plan.pairs_compared >= 1000
    assert peak < 8 * 1024 * 1024


# --- settings, the run and its report --------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "100"])
def test_max_pairs_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match=r"max_pairs must be an integer >= 1"):
        ExtractionSettings(max_pairs=bad)  # type: ignore[arg-type]
    assert ExtractionSettings().max_pairs == DEFAULT_MAX_PAIRS
    assert ExtractionSettings(max_pairs=None).max_pairs is None


TOPICS = (
    "the salary of {n} players when the team is over the cap",
    "the salary cap hold for pick {n} before the draft",
    "a trade bonus of {n} percent before the trade deadline",
    "the salary of agent {n} during the season",
)
DENSE = "\n\n".join(
    f"## Part {part}\n\n"
    + " ".join(
        f"A team must report {TOPICS[(part + n) % 4].format(n=part * 10 + n)}."
        for n in range(6)
    )
    for part in range(8)
)
"""48 rules, most of them tagged `salary` by the fake."""


class RecordingFake(ExtractionFakeChatModel):
    """The extraction fake, keeping the messages of every call."""

    received: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def relation_groups(model: RecordingFake) -> list[list[str]]:
    return [
        [line.split(" | ", 1)[0] for line in str(messages[1].content).splitlines()[2:]]
        for messages in model.received
        if "You compare operational rules" in str(messages[0].content)
    ]


def run(**settings: Any) -> tuple[ExtractionReport, RecordingFake]:
    model = RecordingFake(received=[])
    rulebook = extract_rules(
        [Document(page_content=DENSE, metadata={"source": "dense.md"})],
        llm=model,
        domain="NBA",
        checkpoint=None,
        max_section_tokens=60,
        **settings,
    )
    return ExtractionReport.model_validate(rulebook.diagnostics), model


def test_a_capped_run_compares_the_most_similar_and_reports_the_rest() -> None:
    full, uncapped = run(max_pairs=None)
    assert full.pairs_skipped == 0
    assert full.pairs_compared == full.candidate_pairs > 300
    assert "possible pairs compared (shared tags)" in full.format()

    report, model = run(max_pairs=30, rules_per_comparison=6)
    groups = relation_groups(model)
    assert (
        report.phases["relations"].calls == len(groups) < len(relation_groups(uncapped))
    )
    assert all(2 <= len(group) <= 6 for group in groups)
    compared = {frozenset(p) for group in groups for p in combinations(group, 2)}
    assert report.candidate_pairs == full.candidate_pairs
    assert report.pairs_compared == len(compared) >= 30
    assert report.pairs_skipped == report.candidate_pairs - report.pairs_compared
    assert report.max_pairs == 30
    line = next(x for x in report.format().splitlines() if x.startswith("phase 4:"))
    assert line.startswith(
        f"phase 4: compared {report.pairs_compared:,} of "
        f"{report.candidate_pairs:,} rule pairs sharing a tag "
        f"({report.pairs_skipped:,} skipped by max_pairs=30 (--max-pairs); the most "
        "similar kept"
    )


def test_a_finished_run_with_another_cap_is_not_reused(tmp_path: Path) -> None:
    doc = Document(page_content=DENSE, metadata={"source": "dense.md"})
    llm = ExtractionFakeChatModel()
    ids = {
        run_id_for([doc], "NBA", ExtractionSettings(llm=llm, max_pairs=cap))
        for cap in (None, 30, 31)
    }
    assert len(ids) == 3
    stored: list[int] = []
    for cap in (30, 30, 10):

        def on_stored(cap: int = cap) -> None:
            stored.append(cap)

        rulebook = extract_rules(
            [doc],
            llm=llm,
            domain="NBA",
            checkpoint=tmp_path / "ck.sqlite",
            max_section_tokens=60,
            max_pairs=cap,
            on_stored=on_stored,
        )
        report = ExtractionReport.model_validate(rulebook.diagnostics)
        assert report.max_pairs == cap
    assert stored == [30]


async def test_aextract_rules_takes_the_cap() -> None:
    rulebook = await aextract_rules(
        [DENSE],
        llm=ExtractionFakeChatModel(),
        checkpoint=None,
        max_section_tokens=60,
        max_pairs=12,
    )
    report = ExtractionReport.model_validate(rulebook.diagnostics)
    assert (report.max_pairs, report.pairs_skipped > 0) == (12, True)


def test_the_retriever_passes_the_cap_to_extraction() -> None:
    retriever = TAGRetriever.from_documents(
        [DENSE],
        JudgeAndExtractorFakeChatModel(),
        extraction={"checkpoint": None, "max_pairs": 12, "max_section_tokens": 60},
    )
    report = ExtractionReport.model_validate(retriever.rulebook.diagnostics)
    assert (report.max_pairs, report.pairs_skipped > 0) == (12, True)


def test_reports_written_before_the_cap_still_load() -> None:
    report, _ = run()
    old = report.model_dump(mode="json")
    for name in ("candidate_pairs", "pairs_skipped", "max_pairs"):
        del old[name]
    loaded = ExtractionReport.model_validate(json.loads(json.dumps(old)))
    assert loaded.candidate_pairs == loaded.pairs_compared == report.pairs_compared
    assert (loaded.pairs_skipped, loaded.max_pairs) == (0, None)
    assert "possible pairs compared (shared tags)" in loaded.format()
