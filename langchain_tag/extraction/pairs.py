"""Phase 4's comparisons: which rules meet in one call, and how many pairs at most.

Phase 4 asks the model about rules that share a tag, a group of rules a call. The
pairs sharing a tag grow with the square of the rules under it: 200 KB of
normative-dense text took 24,151 calls. `plan_comparisons` bounds them:

- At or under `max_pairs` candidate pairs, the groups are `tag_groups`' (every
  pair sharing a tag meets in some call), so stored answers stay valid.
- Over it, the `max_pairs` most similar candidate pairs are chosen
  (`most_similar_pairs`) and packed into calls of at most `rules_per_comparison`
  rules of one tag (`pack_pairs`). Pairs that happen to share one of those calls
  are compared too; the plan counts them.

Similarity is lexical: the Indel similarity (rapidfuzz) of the rules' words (name,
condition and action), i.e. twice their longest common word subsequence over their
total length. Duplicates score 1; a rule and its negation, or a narrower case of
it, score high; unrelated rules of the same tag score low. Words, not characters:
each word is coded as one character, so a rule fits rapidfuzz's 64-bit fast path,
about 0.1 µs a pair instead of 0.7 µs for 200 characters. No embedding model: the
plan needs no network and is the same on every machine.

Nothing here holds all candidate pairs: counting them is per rule
(`shared_tag_pairs`), and choosing them scores one block of a tag's pairs at a time
and keeps only the best `max_pairs` (`most_similar_pairs`).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from itertools import combinations
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field
from rapidfuzz import process
from rapidfuzz.distance import Indel

from langchain_tag._text import batches
from langchain_tag.extraction.phases import MAX_TAGS, DraftRule

__all__ = [
    "DEFAULT_MAX_PAIRS",
    "ComparisonPlan",
    "packed_groups_bound",
    "plan_comparisons",
    "shared_tag_pairs",
]

DEFAULT_MAX_PAIRS = 5_000
"""The default cap on phase 4's pairs (`ExtractionSettings.max_pairs`).

It keeps phase 4's cost flat as documents grow. Over the cap, the 5,000 pairs
chosen take at most 625 calls of 16 rules (5,000 / 8) plus one a tag holding a
chosen pair (`packed_groups_bound`): ~625 calls, ~0.7 M input tokens, ~$0.10 at
gpt-4o-mini list prices ($0.15 per million input tokens) when the rules share few
tags, where 200 KB of normative-dense text took 24,151 calls and 25 M input tokens
uncapped ($3.81; $64 at gpt-4o's $2.50; `benchmarks/bench_extraction_cost.py`).
Many small tags make more, smaller calls: at or under the cap, one a tag (a chunk
pair of a large tag), up to 15,000 when rules come in twos sharing three tags
(`comparison_calls_bound`). PEP 8, ~1,900 pairs sharing a tag, stays under it."""

_BLOCK_CELLS = 1 << 16
"""Pair scores computed at once: 256 KiB of float32, whatever the tag's size."""
_FIRST_CODE = 0x100
_SURROGATES = range(0xD800, 0xE000)
_WORD = re.compile(r"\w+")


# --- the candidates: pairs of rules sharing a tag -----------------------------------


def _tag_sets(drafts: Sequence[DraftRule]) -> list[tuple[str, ...]]:
    return [tuple(sorted(set(d.tags))) for d in drafts]


def _by_tag(drafts: Sequence[DraftRule]) -> dict[str, list[DraftRule]]:
    by_tag: dict[str, list[DraftRule]] = defaultdict(list)
    for draft in drafts:
        for tag in dict.fromkeys(draft.tags):
            by_tag[tag].append(draft)
    return by_tag


def shared_tag_pairs(drafts: Sequence[DraftRule]) -> int:
    """Number of distinct rule pairs that share at least one tag.

    Counted by inclusion-exclusion over each rule's tag subsets (the pairs of the
    rules having all tags of a subset), so memory is O(rules x 2^tags a rule),
    7 subsets a rule at `phases.MAX_TAGS` = 3, never O(pairs).
    """
    having: Counter[tuple[str, ...]] = Counter()
    for tags in _tag_sets(drafts):
        for size in range(1, len(tags) + 1):
            having.update(combinations(tags, size))
    return sum(
        (1 if len(subset) % 2 else -1) * n * (n - 1) // 2
        for subset, n in having.items()
    )


def tag_groups(
    drafts: Sequence[DraftRule], limit: int
) -> list[tuple[str, list[DraftRule]]]:
    """Groups of rules sharing a tag, each small enough for one call.

    A tag with more than `limit` rules is cut into chunks of `limit // 2`, and every
    pair of chunks is one group, so every pair of rules sharing the tag meets in at
    least one call.
    """
    by_tag = _by_tag(drafts)
    groups = []
    for tag in sorted(by_tag):
        members = by_tag[tag]
        if len(members) < 2:  # noqa: PLR2004 - a pair needs two
            continue
        if len(members) <= limit:
            groups.append((f"{tag}:0", members))
            continue
        chunks = list(batches(members, max(1, limit // 2)))
        for n, (a, b) in enumerate(combinations(range(len(chunks)), 2)):
            groups.append((f"{tag}:{n}", [*chunks[a], *chunks[b]]))
    return groups


# --- similarity ---------------------------------------------------------------------


def _text(draft: DraftRule) -> str:
    return f"{draft.name} {draft.condition} {draft.action}"


class _WordCoder:
    """Each distinct word as one character, so a rule's words are a short string."""

    def __init__(self) -> None:
        self.codes: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        return "".join(self._code(word) for word in _WORD.findall(text.casefold()))

    def _code(self, word: str) -> str:
        code = self.codes.get(word)
        if code is None:
            point = _FIRST_CODE + len(self.codes)
            if point >= _SURROGATES.start:  # not a character on its own
                point += len(_SURROGATES)
            code = self.codes[word] = chr(point)
        return code


def similarity(first: DraftRule, second: DraftRule) -> float:
    """The lexical similarity `most_similar_pairs` ranks pairs by, in [0, 1].

    Indel similarity of the two rules' words (name, condition, action; case
    folded): 2 x longest common word subsequence / total words.
    """
    code = _WordCoder()
    return float(Indel.normalized_similarity(code(_text(first)), code(_text(second))))


class SimilarPair(NamedTuple):
    """A candidate pair: two rules (positions in the drafts, `first < second`)."""

    score: float
    first: int
    second: int
    tag: str
    """The first tag (in sorted order) the two rules share: where they are compared."""


class _Best:
    """The `k` best pairs seen, by score, then document order; O(k + one block)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.scores = np.empty(0, dtype=np.float32)
        self.firsts = np.empty(0, dtype=np.int64)
        self.seconds = np.empty(0, dtype=np.int64)
        self.tags = np.empty(0, dtype=np.int64)

    @property
    def floor(self) -> float:
        """The score a pair needs to be kept: any until `k` are kept."""
        return float(self.scores[-1]) if len(self.scores) == self.k else -1.0

    def add(
        self,
        scores: npt.NDArray[np.float32],
        firsts: npt.NDArray[np.int64],
        seconds: npt.NDArray[np.int64],
        tag: int,
    ) -> None:
        self.scores = np.concatenate([self.scores, scores])
        self.firsts = np.concatenate([self.firsts, firsts])
        self.seconds = np.concatenate([self.seconds, seconds])
        self.tags = np.concatenate([self.tags, np.full(len(scores), tag)])
        # Ties go to the pair earlier in the documents: the choice never depends
        # on the block order.
        order = np.lexsort((self.seconds, self.firsts, -self.scores))[: self.k]
        self.scores = self.scores[order]
        self.firsts = self.firsts[order]
        self.seconds = self.seconds[order]
        self.tags = self.tags[order]


def _tag_table(
    tag_sets: Sequence[tuple[str, ...]], tags: Sequence[str]
) -> npt.NDArray[np.int32]:
    """Each rule's tags as ids into `tags`, one row a rule, padded with -1."""
    ids = {tag: n for n, tag in enumerate(tags)}
    width = max((len(s) for s in tag_sets), default=0)
    table = np.full((len(tag_sets), max(width, 1)), -1, dtype=np.int32)
    for row, found in enumerate(tag_sets):
        table[row, : len(found)] = [ids[tag] for tag in found]
    return table


def _share_an_earlier_tag(
    table: npt.NDArray[np.int32],
    firsts: npt.NDArray[np.int64],
    seconds: npt.NDArray[np.int64],
    tag: int,
) -> npt.NDArray[np.bool_]:
    """Which pairs also share a tag before `tag`: they are scored under that one."""
    a, b = table[firsts], table[seconds]
    earlier = (a >= 0) & (a < tag)
    same = a[:, :, None] == b[:, None, :]
    return (same & earlier[:, :, None]).any(axis=(1, 2))  # type: ignore[no-any-return]


def most_similar_pairs(drafts: Sequence[DraftRule], k: int) -> list[SimilarPair]:
    """The `k` most similar distinct pairs of rules sharing a tag, best first.

    Ties go to the pair that comes first in the documents (by its first rule, then
    its second), so the choice is deterministic. A pair sharing several tags is
    scored once, under the first of them in sorted order.

    Memory is bounded by the rules and `k`, never by the candidate pairs: the rules'
    word codes and tag ids (O(rules)), one block of at most 2^16 scores of one tag
    (256 KiB) with the positions of those kept (~50 bytes each), and the `k` best
    pairs so far (~30 bytes each). Time is one rapidfuzz comparison a candidate
    pair, on every core (`process.cdist`).

    Args:
        drafts: The rules entering phase 4.
        k: How many pairs to keep, at least 1.
    """
    if k < 1:
        msg = f"k must be at least 1, got {k}"
        raise ValueError(msg)
    tag_sets = _tag_sets(drafts)
    tags = sorted({tag for found in tag_sets for tag in found})
    table = _tag_table(tag_sets, tags)
    code = _WordCoder()
    words = [code(_text(d)) for d in drafts]
    best = _Best(k)
    for tag_id in range(len(tags)):
        members = np.flatnonzero((table == tag_id).any(axis=1))
        count = len(members)
        rows = max(1, _BLOCK_CELLS // count)
        tagged_before = bool(((table[members] >= 0) & (table[members] < tag_id)).any())
        # Rows `start:stop` against the members after `start`: cell (r, c) is the
        # pair (start + r, start + 1 + c), a pair when c >= r.
        for start in range(0, count - 1, rows):
            stop = min(count - 1, start + rows)
            floor = best.floor
            scores = process.cdist(
                [words[m] for m in members[start:stop]],
                [words[m] for m in members[start + 1 :]],
                scorer=Indel.normalized_similarity,
                dtype=np.float32,
                workers=-1,
                score_cutoff=max(floor, 0.0),
            )
            r, c = np.nonzero(np.triu(scores >= floor))
            firsts, seconds = members[start + r], members[start + 1 + c]
            if tagged_before:
                kept = ~_share_an_earlier_tag(table, firsts, seconds, tag_id)
                firsts, seconds, r, c = firsts[kept], seconds[kept], r[kept], c[kept]
            values = scores[r, c]
            if len(values) > k:  # below the block's k-th best, no pair can be kept
                kept = values >= np.partition(values, len(values) - k)[len(values) - k]
                values, firsts, seconds = values[kept], firsts[kept], seconds[kept]
            best.add(values, firsts, seconds, tag_id)
    return [
        SimilarPair(float(s), int(a), int(b), tags[t])
        for s, a, b, t in zip(
            best.scores, best.firsts, best.seconds, best.tags, strict=True
        )
    ]


# --- calls --------------------------------------------------------------------------


def pack_pairs(pairs: Iterable[tuple[int, int]], limit: int) -> list[list[int]]:
    """Groups of at most `limit` rules in which every pair given meets, greedily.

    In the order given (best first), a pair that has not met yet joins a group
    holding one of its rules with room for the other, else the latest group with
    room for both, else a new group. A group of s rules thus brings at least
    ceil(s / 2) pairs given to meet, and a new group opens only when the latest
    has fewer than two places left: at most `packed_groups_bound(pairs, limit)`
    groups.

    Args:
        pairs: Pairs of rule positions, all of one tag.
        limit: The most rules a group holds (`rules_per_comparison`); below 2,
            2.

    Returns:
        The groups, each listing rule positions in ascending order.
    """
    limit = max(limit, 2)
    groups: list[list[int]] = []
    member_of: dict[int, list[int]] = defaultdict(list)
    for a, b in pairs:
        if set(member_of[a]).intersection(member_of[b]):
            continue  # already meet
        joined = next(
            (
                (group, other)
                for rule, other in ((a, b), (b, a))
                for group in member_of[rule]
                if len(groups[group]) < limit
            ),
            None,
        )
        if joined is not None:
            group, missing = joined[0], [joined[1]]
        elif groups and len(groups[-1]) <= limit - 2:
            group, missing = len(groups) - 1, [a, b]
        else:
            groups.append([])
            group, missing = len(groups) - 1, [a, b]
        for rule in missing:
            groups[group].append(rule)
            member_of[rule].append(group)
    return [sorted(group) for group in groups]


def packed_groups_bound(pairs: int, limit: int) -> int:
    """The most groups `pack_pairs` makes of `pairs` pairs of one tag.

    Every group but the last has at least `limit - 1` rules, so at least
    ceil((limit - 1) / 2) of the pairs: 1 + (pairs - 1) // that, and never more
    groups than pairs.
    """
    if pairs < 1:
        return 0
    per_group = math.ceil((max(limit, 2) - 1) / 2)
    return min(pairs, 1 + (pairs - 1) // per_group)


def comparison_calls_bound(pairs: int, max_pairs: int | None) -> int:
    """The most calls `plan_comparisons` makes for at most `pairs` candidate pairs.

    Whatever the tags, with at most `phases.MAX_TAGS` (3) a rule, as phase 3 keeps:

    - At or under the cap, `tag_groups` makes at most one call a pair a tag it
      shares: a tag's single call holds at least one of its pairs, and each chunk
      pair of a large tag holds pairs no other call of the tag holds. A pair
      shares at most 3 tags, so at most 3 x min(pairs, max_pairs) calls, reached
      when the rules come in twos sharing all three tags.
    - Over it, each tag's chosen pairs take at most `packed_groups_bound` calls:
      summed, at most max_pairs / ceil((limit - 1) / 2) plus one a tag holding a
      chosen pair, and never more than `max_pairs`.

    All the rules sharing one tag make far fewer (the extraction estimate's case).
    """
    if pairs < 1:
        return 0
    under_cap = pairs if max_pairs is None else min(pairs, max_pairs)
    return MAX_TAGS * under_cap


class ComparisonPlan(BaseModel):
    """Phase 4's calls, and the pairs they compare out of those sharing a tag."""

    model_config = ConfigDict(frozen=True)

    groups: list[tuple[str, list[str]]] = Field(
        default_factory=list,
        description="One call each: its key (`<tag>:<n>`) and its rules' draft ids.",
    )
    candidate_pairs: int = Field(
        default=0, description="Distinct rule pairs sharing a tag."
    )
    pairs_compared: int = Field(
        default=0, description="Distinct rule pairs that meet in some call."
    )
    max_pairs: int | None = Field(default=None, description="The cap; None: none.")

    @property
    def pairs_skipped(self) -> int:
        """Candidate pairs no call compares (0 at or under the cap)."""
        return self.candidate_pairs - self.pairs_compared


def plan_comparisons(
    drafts: Sequence[DraftRule], limit: int, max_pairs: int | None
) -> ComparisonPlan:
    """Phase 4's calls: `tag_groups` at or under `max_pairs`, else the most similar.

    Over the cap, the `max_pairs` most similar candidate pairs
    (`most_similar_pairs`) are packed, tag by tag, into groups of at most `limit`
    rules (`pack_pairs`); group keys are `<tag>:<n>`, as `tag_groups`'. Memory is
    `most_similar_pairs`' plus the groups, O(max_pairs x limit).

    Args:
        drafts: The rules entering phase 4 (unique `draft_id`s).
        limit: `rules_per_comparison`, the most rules a call.
        max_pairs: The cap; None for none.
    """
    candidates = shared_tag_pairs(drafts)
    if max_pairs is None or candidates <= max_pairs:
        return ComparisonPlan(
            groups=[
                (key, [d.draft_id for d in group])
                for key, group in tag_groups(drafts, limit)
            ],
            candidate_pairs=candidates,
            pairs_compared=candidates,
            max_pairs=max_pairs,
        )
    by_tag: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for pair in most_similar_pairs(drafts, max_pairs):
        by_tag[pair.tag].append((pair.first, pair.second))
    groups: list[tuple[str, list[str]]] = []
    met: set[int] = set()
    for tag in sorted(by_tag):
        for n, group in enumerate(pack_pairs(by_tag[tag], limit)):
            groups.append((f"{tag}:{n}", [drafts[i].draft_id for i in group]))
            met.update(a * len(drafts) + b for a, b in combinations(group, 2))
    return ComparisonPlan(
        groups=groups,
        candidate_pairs=candidates,
        pairs_compared=len(met),
        max_pairs=max_pairs,
    )
