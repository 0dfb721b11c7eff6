"""Learned prefilter: skip the rules the judge's own past verdicts say will be NO.

Every judgment TAG makes is a labelled example: (input, rule, applies). Where a
similarity prefilter cannot tell applicable rules from the rest (RuleArena-NBA, where
it is at chance), a model trained on past verdicts can: `LearnedPrefilter` learns,
for each rule, which inputs the judge answered YES for, and skips the rules its
models predict NO for.

```python
lp = LearnedPrefilter(rulebook, target_recall=0.95)
lp.fit(examples)            # iterable of (input_text, rule_id, applies)
ids = lp.select(text)       # rule ids to judge, rulebook order
retriever = TAGRetriever.from_rulebook(rulebook, llm=llm, prefilter=lp)
```

How it learns (the `learned` extra: scikit-learn, for the feature hashing):

- **Features**: word 1-2-grams hashed into 2**20 buckets (`FeatureHashing`, the
  scheme of scikit-learn's `HashingVectorizer`), sublinear TF-IDF weighted with the
  training inputs' document frequencies, L2-normalised (scikit-learn's
  `TfidfTransformer`). Buckets seen in fewer than `min_df` training inputs are
  dropped.
- **Per-rule classifier**: ridge regression on +-1 labels, solved in its dual form,
  whose leave-one-out (LOO) predictions are exact and nearly free; each rule's
  regularisation is picked from `alphas` by the LOO ranking quality (weighted
  ROC-AUC, as scikit-learn's `roc_auc_score` computes it).
- **Per-rule thresholds, one recall target**: a rule is skipped for an input when
  its score is below the rule's threshold, placed at one of the rule's LOO YES
  scores. A threshold above `k` of the rule's `p` YES examples misses a future YES
  verdict with probability `(k + 1) / (p + 1)` (the conformal rank argument);
  times the rule's YES rate, that is its expected misses per input. The misses
  `target_recall` allows over all the rules' YES verdicts are spent where each
  buys the most skipped judgments (greedy along each rule's concave hull of
  (misses, skips)), so a rule that seldom applies may be skipped outright, and the
  expected recall of the YES verdicts stays at the target.
- **Cold start**: a rule with fewer than `min_examples` verdicts, or one always
  answered YES, is always judged. Untrained, the prefilter passes every rule:
  exactly plain TAG.
- **Unknown rules**: the prefilter knows the rules it was built or trained over by
  id and content hash (`known_rules`, saved with the model). A candidate it does
  not know (a new rule, or an edited one: same id, another content hash) is always
  judged, with one warning naming them (`partition(text, candidates)`).
- **Re-thresholding**: the saved model keeps every rule's skipping options, so
  `load(path, rulebook, target_recall=x)` spends the misses again for `x` without
  training (the same thresholds `fit` at `x` would choose).

Live, the labels are selected: once the prefilter runs, the judge labels what it
lets through plus the few skipped pairs shadow judging explores
(`langchain_tag.learning.shadow`, weighted `1 / explore`). Thresholds chosen on
those labels alone lose recall at every retraining (the YES verdicts the last
model skipped are missing from the next training set), so `fit` also takes the
pairs that were skipped and never judged (`SkippedPair`, what the verdict log
remembers of each skip): each enters the threshold step, not the ridge, as a
fractional YES of mass `(S + 10 q0) / (N + 10)`, where `q0` is the P(YES |
skipped) the model in force predicted for it and `S` / `N` are the rule's explored
YES / explored skipped pairs. A `Retrainer` then chooses `internal_target`, the
recall the thresholds aim at, with a miss-budget controller
(`langchain_tag.learning.promise`) so that the stream's recall keeps
`target_recall` (`benchmarks/bench_recall_promise.py` measures it).

The model is saved as an `.npz` file read with `allow_pickle=False` (arrays and one
JSON header, nothing executable), written atomically.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import io
import json
import logging
import math
import os
import threading
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from langchain_tag.rules import Rule, Rulebook, _atomic_write_bytes

__all__ = [
    "FORMAT_VERSION",
    "FeatureHashing",
    "FitReport",
    "HashedFeatures",
    "LabelledExample",
    "LearnedPrefilter",
    "RuleFit",
    "Screening",
    "Selection",
    "SkippedPair",
]

FORMAT_VERSION = 2
"""Version of the saved-model file format this release writes (it reads 1 and 2;
version 2 keeps every rule's skipping options, to re-threshold on load)."""

Floats = npt.NDArray[np.float64]

_EXTRA_HINT = (
    "The learned prefilter hashes its features with scikit-learn: install the "
    "`learned` extra (`pip install 'langchain-tag[learned]'`)."
)


# --- features ------------------------------------------------------------------------


class HashedFeatures(BaseModel):
    """An input as hashed word n-gram counts: what the learner needs of it, no text.

    The sparse row `HashingVectorizer(**FeatureHashing(...).vectorizer_options())`
    gives for the text: bucket indices (ascending) and term counts.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheme: str = Field(description="`FeatureHashing.scheme` of the hashing used.")
    indices: tuple[int, ...]
    counts: tuple[int, ...]

    @model_validator(mode="after")
    def _consistent(self) -> HashedFeatures:
        if len(self.indices) != len(self.counts):
            msg = (
                f"{len(self.indices)} indices but {len(self.counts)} counts: "
                "each bucket needs its count"
            )
            raise ValueError(msg)
        if any(b <= a for a, b in zip(self.indices, self.indices[1:], strict=False)):
            msg = "indices must be strictly ascending"
            raise ValueError(msg)
        if any(c < 1 for c in self.counts):
            msg = "counts must be at least 1"
            raise ValueError(msg)
        return self


class FeatureHashing(BaseModel):
    """How inputs become hashed features: word n-grams counted into buckets.

    The scheme is scikit-learn's `HashingVectorizer` (signed 32-bit MurmurHash3,
    no alternate sign, no normalisation), so a row is the same wherever it is
    computed: by the verdict log that keeps no text, or by the learner at training
    and selection time. Changing any field changes `scheme`, and features hashed
    under another scheme are refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_features: int = Field(default=2**20, ge=2**10, le=2**26)
    """Buckets; at 2**20 two n-grams of one rulebook's inputs rarely collide."""
    ngram_max: int = Field(default=2, ge=1, le=3)
    """Longest word n-gram counted (1: words only)."""
    token_pattern: str = r"(?u)\b\w+\b"  # noqa: S105 - a regex, not a secret
    """What a word is; single characters count, so "3-year" keeps its "3"."""
    lowercase: bool = True

    @property
    def scheme(self) -> str:
        """A short fingerprint of these settings, stored with hashed features."""
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return "hv1-" + hashlib.sha256(payload.encode()).hexdigest()[:16]

    def vectorizer_options(self) -> dict[str, Any]:
        """The `HashingVectorizer` arguments that reproduce this hashing."""
        return {
            "n_features": self.n_features,
            "ngram_range": (1, self.ngram_max),
            "token_pattern": self.token_pattern,
            "lowercase": self.lowercase,
            "alternate_sign": False,
            "norm": None,
        }

    def hash_matrix(self, texts: Sequence[str]) -> Any:
        """The hashed counts of `texts`, one CSR row each (a SciPy sparse matrix).

        Raises:
            ImportError: scikit-learn (the `learned` extra) is not installed.
        """
        return _vectorizer(self).transform(texts)

    def hash(self, text: str) -> HashedFeatures:
        """The hashed counts of one text."""
        row = self.hash_matrix([text])
        row.sort_indices()
        return HashedFeatures(
            scheme=self.scheme,
            indices=tuple(int(i) for i in row.indices),
            counts=tuple(round(float(c)) for c in row.data),
        )


@functools.lru_cache(maxsize=8)
def _vectorizer(hashing: FeatureHashing) -> Any:
    try:
        from sklearn.feature_extraction.text import (  # type: ignore[import-untyped]  # noqa: PLC0415 - optional extra
            HashingVectorizer,
        )
    except ImportError as error:
        raise ImportError(_EXTRA_HINT) from error
    return HashingVectorizer(**hashing.vectorizer_options())


def _rows(hashing: FeatureHashing, inputs: Sequence[str | HashedFeatures]) -> Any:
    """One CSR matrix of hashed counts for texts and pre-hashed rows, in order."""
    from scipy import sparse  # type: ignore[import-untyped]  # noqa: PLC0415 - with sklearn

    texts = [x for x in inputs if isinstance(x, str)]
    hashed = hashing.hash_matrix(texts) if texts else sparse.csr_matrix((0, 0))
    hashed.sort_indices()
    indices: list[npt.NDArray[Any]] = []
    counts: list[npt.NDArray[Any]] = []
    next_text = 0
    for item in inputs:
        if isinstance(item, str):
            start, end = hashed.indptr[next_text], hashed.indptr[next_text + 1]
            indices.append(hashed.indices[start:end])
            counts.append(hashed.data[start:end])
            next_text += 1
            continue
        if item.scheme != hashing.scheme:
            msg = (
                f"An example's features were hashed under scheme {item.scheme!r}, "
                f"this prefilter uses {hashing.scheme!r}: give the prefilter the "
                "verdict log's FeatureHashing, or train from texts."
            )
            raise ValueError(msg)
        indices.append(np.asarray(item.indices))
        counts.append(np.asarray(item.counts))
    indptr = np.cumsum([0, *(len(row) for row in indices)])
    return sparse.csr_matrix(
        (
            np.concatenate([np.zeros(0), *counts]).astype(np.float64),
            np.concatenate([np.zeros(0), *indices]).astype(np.int64),
            indptr,
        ),
        shape=(len(inputs), hashing.n_features),
    )


# --- examples, fit report, selection -------------------------------------------------


class LabelledExample(NamedTuple):
    """One judged pair: the input (text or hashed features), the rule, the verdict.

    `weight` counts the example that many times: a shadow judgment of a pair the
    prefilter skipped, explored at rate `e`, stands for `1 / e` such pairs.
    """

    input: str | HashedFeatures
    rule_id: str
    applies: bool
    weight: float = 1.0


class SkippedPair(NamedTuple):
    """A pair the prefilter skipped: the input, the rule, and what the model expected.

    Not a verdict. `skipped_yes` is the P(YES | skipped) the model in force predicted
    for the rule when it skipped it (`Screening.skipped_yes`). Given to `fit` with
    the verdicts, a skipped pair that no verdict labels enters the threshold step
    as a fractional YES; one that has a verdict (it was explored) marks that verdict
    as a skipped pair's, counted once rather than `weight` times (the skipped
    pairs it stood for are there themselves).
    """

    input: str | HashedFeatures
    rule_id: str
    skipped_yes: float


RuleStatus = Literal[
    "learned",
    "skipped",
    "little_history",
    "always_applies",
    "no_gain",
]


class RuleFit(BaseModel):
    """What training decided for one rule."""

    model_config = ConfigDict(frozen=True)

    status: RuleStatus = Field(
        description="`learned`: skipped when scored below `threshold`; "
        "`skipped`: skipped for every input, having applied too rarely to pay for "
        "its judgments (never, or far less than the target allows); `little_history`: "
        "fewer than `min_examples` verdicts, always judged; `always_applies`: "
        "always answered YES, always judged; `no_gain`: its model saves too little "
        "for the recall it would cost, always judged."
    )
    examples: int
    positives: int
    alpha: float | None = None
    loo_auc: float | None = Field(
        default=None, description="Leave-one-out ROC-AUC of the rule's classifier."
    )
    threshold: float | None = Field(
        default=None, description="Skip when the score is below this (learned only)."
    )
    expected_skip: float = Field(
        default=0.0, description="Expected share of inputs for which it is skipped."
    )
    expected_miss: float = Field(
        default=0.0,
        description="Expected YES verdicts per input lost by skipping it.",
    )

    @property
    def skipped_yes(self) -> float:
        """P(YES | skipped): the expected misses over the expected skips (0: never).

        What a skip record of this rule remembers (`SkippedPair.skipped_yes`).
        """
        skipped = self.expected_miss + self.expected_skip
        return self.expected_miss / skipped if skipped > 0 else 0.0


class FitReport(BaseModel):
    """What `LearnedPrefilter.fit` learned from, and what it expects of itself."""

    model_config = ConfigDict(frozen=True)

    inputs: int
    examples: int
    ignored: int = Field(description="Examples of rules not in the rulebook.")
    skipped: int = Field(
        default=0,
        description="Skipped pairs without a verdict, entered in the threshold step "
        "as fractional YES (`SkippedPair`).",
    )
    target_recall: float = Field(
        description="The recall promised: the share of the judge's YES verdicts to "
        "keep (the prefilter's `target_recall`)."
    )
    internal_target: float = Field(
        description="The recall the thresholds were chosen for: `target_recall`, "
        "or what the miss-budget controller set to keep it over the stream "
        "(`Retrainer`, `MissBudget`)."
    )
    expected_recall: float = Field(
        description="Expected share of YES verdicts kept at `internal_target` (LOO, "
        "conformal), over the rules with enough history."
    )
    expected_judged: float = Field(
        description="Expected rules judged per input, of the rulebook's."
    )
    rules: dict[str, RuleFit]
    seconds: float

    @model_validator(mode="before")
    @classmethod
    def _internal_target_of_older_files(cls, data: Any) -> Any:
        # Saved before the controller existed: the thresholds aimed at the target.
        if isinstance(data, dict) and "internal_target" not in data:
            return {**data, "internal_target": data.get("target_recall")}
        return data

    def count(self, status: RuleStatus) -> int:
        """How many rules training gave `status`."""
        return sum(fit.status == status for fit in self.rules.values())


class Selection(NamedTuple):
    """Which rules to judge for one input, and which the prefilter skips."""

    judged: list[str]
    skipped: list[str]


class Screening(NamedTuple):
    """A `Selection` with what the model that made it expects of the skipped rules."""

    judged: list[str]
    skipped: list[str]
    skipped_yes: dict[str, float]
    """Skipped rule id -> the model's P(YES | skipped) (`RuleFit.skipped_yes`)."""


@dataclass(frozen=True)
class _Model:
    """The trained state: features, and each skippable rule's weights and options.

    The rules with skipping options are the model's `rule_ids`; rule `j`'s options
    (threshold, expected miss, expected skip) are the rows
    `options[offsets[j]:offsets[j + 1]]`, row 0 keeping the rule, and `chosen[j]`
    is the one in use (0: always judged). Keeping every option lets another recall
    target be met without training (`_rethresholded`).
    """

    hashing: FeatureHashing
    columns: npt.NDArray[np.int64]
    idf: Floats
    rule_ids: tuple[str, ...]
    rule_hashes: tuple[str, ...]
    weights: npt.NDArray[np.float32]
    bias: Floats
    options: Floats
    offsets: npt.NDArray[np.int64]
    chosen: npt.NDArray[np.int64]
    yes_rate_total: float | None
    """The YES verdicts per input the recall target is a share of; None: unknown
    (a version-1 file), the model cannot be re-thresholded."""
    trained_rules: Mapping[str, str]
    """Every rule trained over: id -> content hash."""
    report: FitReport

    @property
    def thresholds(self) -> Floats:
        """Each rule's threshold in use (-inf: never skipped)."""
        return np.asarray(self.options[self.offsets[:-1] + self.chosen, 0])


class _Installed(NamedTuple):
    """A model, which of its rules skip and are still the rulebook's, and how."""

    model: _Model
    active: npt.NDArray[np.int64]
    rule_ids: tuple[str, ...]
    thresholds: Floats
    skipped_yes: Mapping[str, float]
    """Each active rule's P(YES | skipped)."""


_UNKNOWN_SHOWN = 5
"""Unknown rule ids a warning names at most."""

_HASH_CACHE_SIZE = 100_000
"""Rule objects whose content hash a prefilter remembers (then it starts over)."""

logger = logging.getLogger(__name__)


# --- the prefilter -------------------------------------------------------------------


class LearnedPrefilter(BaseRetriever):
    """Judge only the rules past verdicts do not rule out; for `TAGRetriever`.

    `select(text)` gives the rule ids to judge, in rulebook order; as a retriever it
    returns one document per such rule, with the id as `id` and as
    `metadata["rule_id"]` (what `TAGRetriever(prefilter=...)` reads) and, for a rule
    it has a model of, `metadata["margin"]`: score minus threshold (>= 0 here).

    Args:
        rulebook: The rules to select from (positional).
        **data: The other fields.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rulebook: Rulebook
    """The rules; rules added or edited since training are always judged."""
    target_recall: float = Field(default=0.95, gt=0.0, le=1.0)
    """The share of the judge's YES verdicts to keep (over rules with history). A
    single training aims its thresholds at it; a `Retrainer` keeps it over a live
    stream, aiming each training at the `FitReport.internal_target` its miss-budget
    controller sets."""
    min_examples: int = Field(default=10, ge=2)
    """Verdicts a rule needs before it may ever be skipped."""
    min_df: int = Field(default=2, ge=1)
    """A hashed n-gram must occur in this many training inputs to be a feature."""
    max_inputs: int = Field(default=2000, ge=10)
    """Train on at most this many distinct inputs, the most recent (the dual
    solution costs the cube of it)."""
    alphas: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
    """Ridge regularisation strengths tried per rule."""
    hashing: FeatureHashing = Field(default_factory=FeatureHashing)
    """The feature hashing; must match a hashed-features verdict log's."""

    _state: _Installed | None = PrivateAttr(default=None)
    _hashes: dict[int, tuple[Rule, str]] = PrivateAttr(default_factory=dict)
    _warned: set[tuple[str, str]] = PrivateAttr(default_factory=set)
    _warn_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    # Where a retraining from each verdict log (by location) last started: kept
    # with the prefilter, so an engine built anew (a query graph given a new
    # context each run) does not train again at once (`learning.retraining`).
    _retrained_at: dict[str, int] = PrivateAttr(default_factory=dict)

    def __init__(self, rulebook: Rulebook, /, **data: Any) -> None:
        """Make an untrained prefilter (it passes every rule) over `rulebook`."""
        super().__init__(rulebook=rulebook, **data)

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        if not self.alphas or any(a <= 0 for a in self.alphas):
            msg = f"alphas must be positive numbers, got {self.alphas!r}"
            raise ValueError(msg)

    # -- state ------------------------------------------------------------------------

    @property
    def fitted(self) -> bool:
        """Whether the prefilter has a model (else it passes every rule)."""
        return self._state is not None

    @property
    def report(self) -> FitReport | None:
        """What the last training (or the loaded file) decided."""
        return None if self._state is None else self._state.model.report

    @property
    def known_rules(self) -> Mapping[str, str]:
        """The rules it can decide for, id -> content hash.

        Trained: the rules it was trained over; untrained: its rulebook's. Any other
        rule (new, or edited: another content hash) is always judged.
        """
        return self._known(self._state)

    def _known(self, state: _Installed | None) -> Mapping[str, str]:
        if state is not None:
            return state.model.trained_rules
        return {rule.rule_id: self._hash_of(rule) for rule in self.rulebook.rules}

    def _hash_of(self, rule: Rule) -> str:
        """`rule.content_hash()`, remembered per rule object (rules are frozen)."""
        cached = self._hashes.get(id(rule))
        if cached is not None and cached[0] is rule:
            return cached[1]
        if len(self._hashes) >= _HASH_CACHE_SIZE:
            self._hashes.clear()
        value = rule.content_hash()
        self._hashes[id(rule)] = (rule, value)  # the rule kept: its id stays unique
        return value

    def _activate(self, model: _Model) -> None:
        """Install `model`, keeping only its rules unchanged in the rulebook."""
        current = {rule.rule_id: self._hash_of(rule) for rule in self.rulebook.rules}
        active = np.asarray(
            [
                i
                for i, (rule_id, rule_hash) in enumerate(
                    zip(model.rule_ids, model.rule_hashes, strict=True)
                )
                if model.chosen[i] > 0 and current.get(rule_id) == rule_hash
            ],
            dtype=np.int64,
        )
        rule_ids = tuple(model.rule_ids[i] for i in active)
        # One assignment: a concurrent select() sees the old model or the new one.
        self._state = _Installed(
            model,
            active,
            rule_ids,
            model.thresholds[active],
            MappingProxyType({r: model.report.rules[r].skipped_yes for r in rule_ids}),
        )

    # -- training ---------------------------------------------------------------------

    def fit(
        self,
        examples: Iterable[
            LabelledExample
            | SkippedPair
            | tuple[str | HashedFeatures, str, bool]
            | tuple[str | HashedFeatures, str, bool, float]
        ],
        *,
        rulebook: Rulebook | None = None,
        internal_target: float | None = None,
    ) -> FitReport:
        """Train on judged pairs (and skipped ones); replaces any previous model.

        The prefilter keeps serving its previous model until the new one is
        installed, in one assignment: `fit` may run in another thread.

        Args:
            examples: `(input, rule_id, applies)` or with a fourth item, the weight
                (see `LabelledExample`); the input is a text or `HashedFeatures`.
                A pair given twice counts once, the last one. Examples of rules
                not in the rulebook are ignored. They must be verdicts on the
                rulebook's current rules (`VerdictLog.examples` drops stale ones).
                `SkippedPair`s among them (`VerdictLog.examples(skipped=True)`)
                enter the threshold step (see the module docs); the order of all
                of them is the order of use (`max_inputs` keeps the latest).
            rulebook: Train over this rulebook, and make it the prefilter's; None
                trains over `self.rulebook`.
            internal_target: Choose the thresholds for this recall instead of
                `target_recall` (what a `Retrainer`'s miss-budget controller
                sets); `target_recall`, the promise, is unchanged.

        Returns:
            What was learned (also `self.report`).

        Raises:
            ValueError: A weight is not positive, a `skipped_yes` is not in [0, 1],
                `internal_target` is not in [0, 1], or hashed features use another
                scheme than `hashing`.
            ImportError: scikit-learn (the `learned` extra) is not installed.
        """
        started = time.perf_counter()
        if internal_target is not None and not 0.0 <= internal_target <= 1.0:
            msg = f"internal_target must be in [0, 1], got {internal_target!r}"
            raise ValueError(msg)
        rules = self.rulebook if rulebook is None else rulebook
        data = _collect(examples, {rule.rule_id for rule in rules.rules})
        inputs = data.inputs[-self.max_inputs :]
        first = len(data.inputs) - len(inputs)
        labels = {
            rule_id: [(i - first, y, w) for i, y, w in pairs if i >= first]
            for rule_id, pairs in data.labels.items()
        }
        skipped = {
            rule_id: [(i - first, q) for i, q in pairs if i >= first]
            for rule_id, pairs in data.skipped.items()
        }
        model = _train(
            self,
            rules,
            _Collected(inputs, labels, skipped, data.ignored),
            started,
            self.target_recall if internal_target is None else internal_target,
        )
        if rulebook is not None:
            self.rulebook = rulebook
        self._activate(model)
        return model.report

    # -- selection --------------------------------------------------------------------

    def margins(self, text: str) -> dict[str, float]:
        """Score minus threshold of each rule the model may skip (< 0: skipped)."""
        return _margins(self._state, text)

    def partition(
        self, text: str, candidates: Sequence[Rule] | None = None
    ) -> Selection:
        """The rule ids to judge and those skipped, each in candidate order.

        Args:
            text: The input.
            candidates: The rules to choose among; None: the prefilter's rulebook.
                A candidate the prefilter does not know (`known_rules`: a new id, or
                a known id with another content hash) is always judged, with one
                warning naming the unknown rules (once per prefilter and rule).
        """
        judged, skipped, _ = self.screen(text, candidates)
        return Selection(judged, skipped)

    def screen(self, text: str, candidates: Sequence[Rule] | None = None) -> Screening:
        """`partition`, with each skipped rule's P(YES | skipped), from one model.

        What shadow judging records of a skip (`SkippedPair`); the arguments are
        `partition`'s.
        """
        state = self._state
        rules = self.rulebook.rules if candidates is None else candidates
        known = self._known(state)
        unknown = {
            rule.rule_id
            for rule in rules
            if known.get(rule.rule_id) != self._hash_of(rule)
        }
        if unknown:
            self._warn_unknown(rules, unknown)
        margins = _margins(state, text)
        judged: list[str] = []
        skipped: list[str] = []
        for rule in rules:
            margin = margins.get(rule.rule_id)
            skip = margin is not None and margin < 0 and rule.rule_id not in unknown
            (skipped if skip else judged).append(rule.rule_id)
        rates = {} if state is None else state.skipped_yes
        return Screening(judged, skipped, {r: rates[r] for r in skipped})

    def _warn_unknown(self, rules: Sequence[Rule], unknown: set[str]) -> None:
        keys = {(r.rule_id, self._hash_of(r)) for r in rules if r.rule_id in unknown}
        with self._warn_lock:
            if keys <= self._warned:
                return
            self._warned |= keys
        shown = sorted(unknown)[:_UNKNOWN_SHOWN]
        more = ", ..." if len(unknown) > len(shown) else ""
        logger.warning(
            "%d candidate rule(s) unknown to the learned prefilter (new, or edited "
            "since it was built or trained: another content hash), always judged: "
            "%s%s. Train it again over the current rulebook to skip them.",
            len(unknown),
            ", ".join(shown),
            more,
        )

    def select(self, text: str) -> list[str]:
        """The rule ids to judge for `text`, in rulebook order."""
        return self.partition(text).judged

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        margins = self.margins(query)
        documents = []
        for rule in self.rulebook.rules:
            margin = margins.get(rule.rule_id)
            if margin is not None and margin < 0:
                continue
            metadata: dict[str, Any] = {"rule_id": rule.rule_id}
            if margin is not None:
                metadata["margin"] = margin
            documents.append(
                Document(id=rule.rule_id, page_content=rule.name, metadata=metadata)
            )
        return documents

    # -- persistence ------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the trained model atomically (`.npz`, no pickled objects).

        The file keeps every rule's skipping options, so `load` can meet another
        `target_recall` without training, and the report with its
        `internal_target`. Nothing else needs saving for the promise kept live:
        the miss-budget controller keeps no state of its own, a `Retrainer` reads
        it from the verdict log at each training (so it survives a restart).

        Returns:
            The path written.

        Raises:
            ValueError: The prefilter is not trained.
        """
        if self._state is None:
            msg = "Nothing to save: the prefilter is not trained (call fit first)."
            raise ValueError(msg)
        model = self._state.model
        header = {
            "format": _FORMAT_NAME,
            "version": FORMAT_VERSION,
            "hashing": model.hashing.model_dump(mode="json"),
            "rule_ids": list(model.rule_ids),
            "rule_hashes": list(model.rule_hashes),
            "trained_rules": dict(model.trained_rules),
            "yes_rate_total": model.yes_rate_total,
            "report": model.report.model_dump(mode="json"),
        }
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
            columns=model.columns,
            idf=model.idf,
            weights=model.weights,
            bias=model.bias,
            options=model.options,
            offsets=model.offsets,
            chosen=model.chosen,
        )
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write_bytes(target, buffer.getvalue())
        return target

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], rulebook: Rulebook, **data: Any
    ) -> LearnedPrefilter:
        """A prefilter over `rulebook` with the model saved at `path`.

        Rules whose content changed since training, and new rules, are judged
        always. The file holds arrays and a JSON header only: it is read without
        unpickling anything.

        Args:
            path: The saved model.
            rulebook: The rules to select from.
            **data: The other fields. A `target_recall` other than the one the model
                was trained for re-thresholds it: the thresholds `fit` would have
                chosen for that target, from the same verdicts (and skipped
                pairs), with `internal_target` that target until a `Retrainer`
                sets its own. The same target keeps the saved thresholds.

        Raises:
            ValueError: The file is not a saved learned prefilter, or is corrupt,
                or `target_recall` differs from the saved one and the file (an
                older format) keeps no skipping options to re-threshold with.
        """
        arrays = _read_arrays(path)
        header = arrays.pop("header")
        try:
            hashing = FeatureHashing.model_validate(header["hashing"])
            report = FitReport.model_validate(header["report"])
            options = (
                _options_v1(header, arrays, report, rulebook)
                if header["version"] == 1
                else {
                    "options": arrays["options"].astype(np.float64),
                    "offsets": arrays["offsets"].astype(np.int64),
                    "chosen": arrays["chosen"].astype(np.int64),
                    "yes_rate_total": float(header["yes_rate_total"]),
                    "trained_rules": MappingProxyType(dict(header["trained_rules"])),
                }
            )
            model = _Model(
                hashing=hashing,
                columns=arrays["columns"].astype(np.int64),
                idf=arrays["idf"].astype(np.float64),
                rule_ids=tuple(header["rule_ids"]),
                rule_hashes=tuple(header["rule_hashes"]),
                weights=arrays["weights"].astype(np.float32),
                bias=arrays["bias"].astype(np.float64),
                report=report,
                **options,
            )
        except (KeyError, TypeError, ValueError, ValidationError) as error:
            msg = f"{path}: a malformed learned-prefilter header ({error})."
            raise ValueError(msg) from error
        _check_shapes(model, path)
        target = data.get("target_recall", report.target_recall)
        if target != report.target_recall:
            if model.yes_rate_total is None:
                msg = (
                    f"{path}: this saved model (format version 1) was trained for "
                    f"target_recall={report.target_recall} and keeps no skipping "
                    f"options to re-threshold it to {target}. Train it again at "
                    "that target (`tag prefilter train --target-recall ...` or "
                    "`fit`), or load it without target_recall."
                )
                raise ValueError(msg)
            model = _rethresholded(model, float(target), float(target))
        prefilter = cls(
            rulebook, **{**data, "target_recall": target, "hashing": hashing}
        )
        prefilter._activate(model)
        return prefilter


_FORMAT_NAME = "langchain-tag-learned-prefilter"
_ARRAYS = {
    1: ("columns", "idf", "weights", "bias", "thresholds"),
    2: ("columns", "idf", "weights", "bias", "options", "offsets", "chosen"),
}


def _read_arrays(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header (as a dict) and the arrays of a saved model, checked for format."""
    try:
        with np.load(Path(path), allow_pickle=False) as arrays:
            header = json.loads(bytes(arrays["header"]).decode())
            version = header.get("version")
            names = (
                _ARRAYS.get(version, ()) if header.get("format") == _FORMAT_NAME else ()
            )
            loaded: dict[str, Any] = {name: np.asarray(arrays[name]) for name in names}
    except (OSError, KeyError, ValueError, AttributeError, zipfile.BadZipFile) as error:
        msg = f"{path}: not a saved learned prefilter ({error})."
        raise ValueError(msg) from error
    if not loaded:
        msg = (
            f"{path}: format {header.get('format')!r} version {version!r}; "
            f"this release reads versions 1 to {FORMAT_VERSION}. Train again."
        )
        raise ValueError(msg)
    loaded["header"] = header
    return loaded


def _options_v1(
    header: dict[str, Any],
    arrays: dict[str, Any],
    report: FitReport,
    rulebook: Rulebook,
) -> dict[str, Any]:
    """A version-1 file's skipping options: one threshold per rule, no YES rate."""
    rule_ids = header["rule_ids"]
    thresholds = arrays["thresholds"].astype(np.float64)
    options = []
    for rule_id, threshold in zip(rule_ids, thresholds.tolist(), strict=True):
        fit = report.rules[rule_id]
        options += [
            (-math.inf, 0.0, 0.0),
            (threshold, fit.expected_miss, fit.expected_skip),
        ]
    trained = {rule.rule_id: rule.content_hash() for rule in rulebook.rules}
    trained.update(zip(rule_ids, header["rule_hashes"], strict=True))
    return {
        "options": np.asarray(options, dtype=np.float64).reshape(-1, 3),
        "offsets": np.arange(0, 2 * len(rule_ids) + 1, 2, dtype=np.int64),
        "chosen": np.ones(len(rule_ids), dtype=np.int64),
        "yes_rate_total": None,
        "trained_rules": MappingProxyType(trained),
    }


def _check_shapes(model: _Model, path: str | os.PathLike[str]) -> None:
    d, r = len(model.columns), len(model.rule_ids)
    expected = {
        "idf": (model.idf.shape, (d,)),
        "weights": (model.weights.shape, (d, r)),
        "bias": (model.bias.shape, (r,)),
        "offsets": (model.offsets.shape, (r + 1,)),
        "chosen": (model.chosen.shape, (r,)),
        "options": (model.options.shape, (len(model.options), 3)),
        "rule_hashes": ((len(model.rule_hashes),), (r,)),
    }
    for name, (shape, wanted) in expected.items():
        if shape != wanted:
            msg = f"{path}: {name} has shape {shape}, expected {wanted}."
            raise ValueError(msg)
    sizes = np.diff(model.offsets)
    if (
        r
        and (
            model.offsets[0] != 0
            or model.offsets[-1] != len(model.options)
            or (sizes < 1).any()
            or (model.chosen < 0).any()
            or (model.chosen >= sizes).any()
        )
    ) or any(rule_id not in model.report.rules for rule_id in model.rule_ids):
        msg = f"{path}: inconsistent skipping options."
        raise ValueError(msg)


def _margins(state: _Installed | None, text: str) -> dict[str, float]:
    """Score minus threshold of each rule `state` may skip (< 0: skipped)."""
    if state is None or not state.rule_ids:
        return {}
    model, active, ids, thresholds, _ = state
    features = model.hashing.hash_matrix([text])
    features.sort_indices()
    values = _tf_idf_row(model, np.asarray(features.indices), np.asarray(features.data))
    if values is None:
        scores = model.bias[active]
    else:
        positions, weights = values
        scores = weights @ model.weights[positions][:, active] + model.bias[active]
    margins = scores - thresholds
    return dict(zip(ids, margins.tolist(), strict=True))


def _tf_idf_row(
    model: _Model, indices: npt.NDArray[Any], counts: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.int64], Floats] | None:
    """Positions among the model's columns and unit TF-IDF weights, or None.

    What `TfidfTransformer.transform` gives for one row (sublinear TF, the
    training IDF, L2 norm), hand-written because it runs on every selection and is
    faster for one row: hand-written 18 us vs scikit-learn 502 us (NBA model,
    901 columns), 21 us vs 621 us (ObliQA, 2,225 columns), measured on the
    datasets of `benchmarks/bench_learned_prefilter.py`.
    """
    positions = np.searchsorted(model.columns, indices)
    inside = positions < len(model.columns)
    inside[inside] = model.columns[positions[inside]] == indices[inside]
    if not inside.any():
        return None
    kept = positions[inside]
    values = (1.0 + np.log(counts[inside].astype(np.float64))) * model.idf[kept]
    return kept, values / np.linalg.norm(values)


# --- training ------------------------------------------------------------------------


@dataclass
class _Collected:
    inputs: list[str | HashedFeatures]
    labels: dict[str, list[tuple[int, bool, float]]]
    """Rule id -> (input, applies, weight) of each labelled pair."""
    skipped: dict[str, list[tuple[int, float]]]
    """Rule id -> (input, P(YES | skipped)) of each skipped pair (`SkippedPair`)."""
    ignored: int


def _collect(examples: Iterable[Any], rule_ids: set[str]) -> _Collected:
    """Distinct inputs (in order of last use), each rule's labelled, skipped pairs."""
    position: dict[str | HashedFeatures, int] = {}
    pairs: dict[tuple[int, str], tuple[bool, float]] = {}
    skips: dict[tuple[int, str], float] = {}
    last_use: dict[int, int] = {}
    ignored = 0
    for order, example in enumerate(examples):
        if isinstance(example, SkippedPair):
            features, rule_id, skipped_yes = example
            if not 0.0 <= skipped_yes <= 1.0:
                msg = (
                    "A SkippedPair's skipped_yes is a probability, in [0, 1]; got "
                    f"{example!r:.200}."
                )
                raise ValueError(msg)
        else:
            # Unpacked by hand: a training set can hold millions of pairs.
            features, rule_id, applies, *rest = example
            weight = float(rest[0]) if rest else 1.0
            if not (weight > 0 and math.isfinite(weight)) or len(rest) > 1:
                msg = (
                    "Examples are (input, rule_id, applies) or (..., weight) with a "
                    f"positive weight; got {example!r:.200}."
                )
                raise ValueError(msg)
        if rule_id not in rule_ids:
            ignored += 1
            continue
        index = position.setdefault(features, len(position))
        last_use[index] = order
        if isinstance(example, SkippedPair):
            skips[index, rule_id] = float(skipped_yes)
            continue
        pairs.pop((index, rule_id), None)  # the last verdict on a pair wins
        pairs[index, rule_id] = (bool(applies), weight)
    # Inputs ordered by their last example, so `max_inputs` keeps the most recent.
    ranked = sorted(last_use, key=last_use.__getitem__)
    renumber = {old: new for new, old in enumerate(ranked)}
    inputs = list(position)
    labels: dict[str, list[tuple[int, bool, float]]] = {}
    for (index, rule_id), (applies, weight) in pairs.items():
        labels.setdefault(rule_id, []).append((renumber[index], applies, weight))
    skipped: dict[str, list[tuple[int, float]]] = {}
    for (index, rule_id), skipped_yes in skips.items():
        skipped.setdefault(rule_id, []).append((renumber[index], skipped_yes))
    return _Collected([inputs[old] for old in ranked], labels, skipped, ignored)


@dataclass(frozen=True)
class _Option:
    threshold: float
    miss: float
    skip: float


@dataclass
class _Candidate:
    """A rule that may be skipped: its options, and the one the allocation chose.

    Option 0 keeps the rule (judged always); the others skip it below a threshold,
    in increasing order of threshold, the last one (infinite) for every input.
    `rate` is its YES verdicts per input (None: too little history to count).
    """

    rule_id: str
    fit: RuleFit
    options: list[_Option]
    rate: float | None = None
    imputed: int = 0
    """Skipped pairs without a verdict in its threshold step."""
    weights: Floats | None = None
    bias: float = 0.0
    chosen: int = 0


def _train(
    prefilter: LearnedPrefilter,
    rulebook: Rulebook,
    data: _Collected,
    started: float,
    internal_target: float,
) -> _Model:
    hashing = prefilter.hashing
    inputs = data.inputs
    counts = _rows(hashing, inputs)
    columns, idf, matrix = _tf_idf_matrix(counts, prefilter.min_df)
    # A constant feature carries the bias, regularised with the weights.
    from scipy import sparse  # noqa: PLC0415 - with sklearn

    augmented = sparse.hstack([matrix, np.ones((len(inputs), 1))]).tocsr()
    gram = (augmented @ augmented.T).toarray() if len(inputs) else np.zeros((0, 0))
    decompositions: dict[bytes, tuple[Floats, Floats]] = {}
    candidates: list[_Candidate] = []
    fits: dict[str, RuleFit] = {}
    yes_rate_total = 0.0
    imputed = 0
    for rule in rulebook.rules:
        candidate = _rule_candidate(
            prefilter,
            rule,
            data.labels.get(rule.rule_id, []),
            data.skipped.get(rule.rule_id, []),
            augmented,
            gram,
            decompositions,
        )
        fits[rule.rule_id] = candidate.fit
        if candidate.rate is not None:
            yes_rate_total += candidate.rate
        imputed += candidate.imputed
        if candidate.options:
            candidates.append(candidate)
    hashes = {rule.rule_id: rule.content_hash() for rule in rulebook.rules}
    weights = np.zeros((len(columns), len(candidates)), dtype=np.float32)
    for j, candidate in enumerate(candidates):
        if candidate.weights is not None:
            weights[:, j] = candidate.weights
    report = FitReport(
        inputs=len(inputs),
        examples=sum(len(pairs) for pairs in data.labels.values()),
        ignored=data.ignored,
        skipped=imputed,
        target_recall=prefilter.target_recall,
        internal_target=internal_target,
        expected_recall=1.0,
        expected_judged=float(len(rulebook.rules)),
        rules=fits,
        seconds=0.0,
    )
    offsets = np.cumsum([0, *(len(c.options) for c in candidates)], dtype=np.int64)
    model = _Model(
        hashing=hashing,
        columns=columns,
        idf=idf,
        rule_ids=tuple(c.rule_id for c in candidates),
        rule_hashes=tuple(hashes[c.rule_id] for c in candidates),
        weights=weights,
        bias=np.asarray([c.bias for c in candidates], dtype=np.float64),
        options=np.asarray(
            [(o.threshold, o.miss, o.skip) for c in candidates for o in c.options],
            dtype=np.float64,
        ).reshape(-1, 3),
        offsets=offsets,
        chosen=np.zeros(len(candidates), dtype=np.int64),
        yes_rate_total=yes_rate_total,
        trained_rules=MappingProxyType(hashes),
        report=report,
    )
    model = _rethresholded(model, prefilter.target_recall, internal_target)
    seconds = time.perf_counter() - started
    return replace(model, report=model.report.model_copy(update={"seconds": seconds}))


def _rethresholded(
    model: _Model, target_recall: float, internal_target: float | None = None
) -> _Model:
    """`model` with thresholds spending `1 - internal_target` of its YES verdicts.

    The misses allowed are spent where each buys the most skipped judgments (see
    `_allocate`); the options do not depend on the target, so this chooses what
    training at that target would. `internal_target` None: `target_recall`.
    """
    if model.yes_rate_total is None:
        msg = "this model keeps no YES rate: it cannot be re-thresholded"
        raise ValueError(msg)
    aim = target_recall if internal_target is None else internal_target
    candidates = [
        _Candidate(
            rule_id,
            model.report.rules[rule_id],
            [
                _Option(*row)
                for row in model.options[
                    model.offsets[j] : model.offsets[j + 1]
                ].tolist()
            ],
        )
        for j, rule_id in enumerate(model.rule_ids)
    ]
    spent = _allocate(candidates, (1.0 - aim) * model.yes_rate_total)
    fits = dict(model.report.rules)
    for candidate in candidates:
        # Option 0 keeps the rule (threshold -inf), the last skips it always (+inf).
        option = candidate.options[candidate.chosen]
        finite = math.isfinite(option.threshold)
        status = (
            "no_gain" if not candidate.chosen else "learned" if finite else "skipped"
        )
        fits[candidate.rule_id] = candidate.fit.model_copy(
            update={
                "status": status,
                "threshold": option.threshold if finite else None,
                "expected_skip": option.skip,
                "expected_miss": option.miss,
            }
        )
    total = model.yes_rate_total
    report = model.report.model_copy(
        update={
            "target_recall": target_recall,
            "internal_target": aim,
            "expected_recall": 1.0 - spent / total if total else 1.0,
            "expected_judged": len(model.trained_rules)
            - sum(fit.expected_skip for fit in fits.values()),
            "rules": fits,
        }
    )
    chosen = np.asarray([c.chosen for c in candidates], dtype=np.int64)
    return replace(model, chosen=chosen, report=report)


def _tf_idf_matrix(
    counts: Any, min_df: int
) -> tuple[npt.NDArray[np.int64], Floats, Any]:
    """Columns kept (>= `min_df` inputs), their IDF, and the unit TF-IDF rows.

    scikit-learn's `TfidfTransformer` with sublinear TF and smoothed IDF:
    `(1 + ln tf) * (ln((1 + n) / (1 + df)) + 1)`, rows L2-normalised; an input
    with no kept feature stays a zero row (only the bias scores it). The same
    matrix as the former hand-written code (within 2.3e-16) at about the same
    cost: 3.2 ms vs 2.9 ms hand-written on 104 rows (NBA), 3.5 ms vs 3.2 ms on 392
    (ObliQA), a fraction of a percent of a training.
    """
    from scipy import sparse  # noqa: PLC0415 - with sklearn
    from sklearn.feature_extraction.text import (  # noqa: PLC0415 - optional extra
        TfidfTransformer,
    )

    counts.sum_duplicates()
    buckets, df = np.unique(counts.indices, return_counts=True)
    columns = buckets[df >= min_df].astype(np.int64)
    if not len(columns) or not counts.shape[0]:
        return (
            columns,
            np.zeros(len(columns)),
            sparse.csr_matrix((counts.shape[0], len(columns))),
        )
    transformer = TfidfTransformer(
        norm="l2", use_idf=True, smooth_idf=True, sublinear_tf=True
    )
    matrix = transformer.fit_transform(counts[:, columns].astype(np.float64))
    return columns, np.asarray(transformer.idf_, dtype=np.float64), matrix


_PRIOR_PAIRS = 10.0
"""How many explored pairs the model's own P(YES | skipped) counts for, when a
skipped pair's YES mass is estimated (`_Masses`): about two retrainings' worth of a
rule's explored pairs on NBA."""


@dataclass(frozen=True)
class _Masses:
    """A rule's pairs as the threshold step counts them: YES and NO mass each.

    The labelled pairs first (a verdict on a pair that was skipped, an explored
    one, counts once: its unexplored siblings are among the imputed pairs; other
    verdicts count their weight), then the skipped pairs without a verdict, each a
    fractional YES of mass `q = (S + k q0) / (N + k)`: `q0` the model's P(YES |
    skipped) when it skipped the pair, `S` / `N` the rule's explored YES / explored
    pairs, `k` = `_PRIOR_PAIRS`. Without skipped pairs this is the weights.
    """

    yes: Floats
    no: Floats
    imputed_rows: npt.NDArray[np.int64]

    @classmethod
    def of(
        cls,
        pairs: Sequence[tuple[int, bool, float]],
        skipped: Sequence[tuple[int, float]],
    ) -> _Masses:
        prior = dict(skipped)
        y = np.asarray([a for _, a, _ in pairs], dtype=np.float64)
        mass = np.asarray(
            [1.0 if i in prior else w for i, _, w in pairs], dtype=np.float64
        )
        explored = np.asarray([i in prior for i, _, _ in pairs], dtype=bool)
        labelled = {i for i, _, _ in pairs}
        rows = np.asarray([i for i, _ in skipped if i not in labelled], dtype=np.int64)
        q0 = np.asarray([q for i, q in skipped if i not in labelled], dtype=np.float64)
        q = (y[explored].sum() + _PRIOR_PAIRS * q0) / (explored.sum() + _PRIOR_PAIRS)
        return cls(
            np.concatenate([mass * y, q]), np.concatenate([mass * (1 - y), 1 - q]), rows
        )

    @property
    def rate(self) -> float:
        """The rule's YES share per input, pulled towards 1/2 by half an example."""
        return float((self.yes.sum() + 0.5) / (self.yes.sum() + self.no.sum() + 1.0))


def _rule_candidate(
    prefilter: LearnedPrefilter,
    rule: Rule,
    pairs: Sequence[tuple[int, bool, float]],
    skipped: Sequence[tuple[int, float]],
    augmented: Any,
    gram: Floats,
    decompositions: dict[bytes, tuple[Floats, Floats]],
) -> _Candidate:
    """A rule's skipping options: (threshold, expected miss, expected skip) each.

    The ridge learns from the labelled `pairs` only; the `skipped` pairs without a
    verdict enter the options (`_Masses`), scored by the ridge.

    The ridge is hand-written, not scikit-learn's `RidgeCV` (whose leave-one-out
    is as cheap), because `RidgeCV` computes another thing: it centres the data
    and leaves the intercept unregularised (here the bias is a regularised
    constant feature), picks the strength by LOO squared error, or by a scorer
    fed the sqrt(weight)-scaled LOO predictions and targets (here by the weighted
    AUC of the unscaled ones), and decomposes each rule's Gram matrix again where
    this reuses one decomposition for every rule judged on the same inputs.
    """
    rows = np.asarray([i for i, _, _ in pairs], dtype=np.int64)
    y = np.asarray([a for _, a, _ in pairs], dtype=bool)
    w = np.asarray([w for _, _, w in pairs], dtype=np.float64)
    positives = int(y.sum())
    fit = RuleFit(status="learned", examples=len(pairs), positives=positives)
    if len(pairs) < prefilter.min_examples:
        return _Candidate(
            rule.rule_id, fit.model_copy(update={"status": "little_history"}), []
        )
    masses = _Masses.of(pairs, skipped)
    rate = masses.rate
    imputed = len(masses.imputed_rows)
    if positives == len(pairs):
        return _Candidate(
            rule.rule_id,
            fit.model_copy(update={"status": "always_applies"}),
            [],
            rate,
            imputed,
        )
    keep_all = _Option(-math.inf, 0.0, 0.0)
    if positives == 0:
        # Skipping a rule that never applied misses all of its (rare) YES verdicts.
        skip_all = _Option(math.inf, rate, 1.0 - rate)
        return _Candidate(rule.rule_id, fit, [keep_all, skip_all], rate, imputed)
    # Weighted least squares is plain least squares on rows scaled by sqrt(weight):
    # a shadow judgment then counts as the 1 / explore pairs it stands for, and
    # leaving one out removes all of its weight.
    root = np.sqrt(w)
    key = rows.tobytes() + w.tobytes()
    if key not in decompositions:
        values, vectors = np.linalg.eigh(
            gram[np.ix_(rows, rows)] * np.outer(root, root)
        )
        decompositions[key] = (np.clip(values, 0.0, None), vectors)
    values, vectors = decompositions[key]
    target = root * np.where(y, 1.0, -1.0)
    projected = vectors.T @ target
    best: tuple[float, float, Floats] | None = None
    for alpha in sorted(prefilter.alphas, reverse=True):  # ties: the simpler model
        shrink = values / (values + alpha)
        fitted = vectors @ (shrink * projected)
        leverage = (vectors**2) @ shrink
        # Exact leave-one-out predictions of ridge regression, back on the
        # unscaled rows.
        loo = (fitted - leverage * target) / np.maximum(1.0 - leverage, 1e-12) / root
        auc = _weighted_auc(loo, y, w)
        if best is None or auc > best[0]:
            best = (auc, alpha, loo)
    assert best is not None  # noqa: S101 - alphas is never empty
    auc, alpha, loo = best
    dual = root * (vectors @ (projected / (values + alpha)))
    primal = np.asarray(augmented[rows].T @ dual).ravel()
    # The imputed pairs were not trained on: their plain scores are held out.
    scores = np.concatenate(
        [loo, np.asarray(augmented[masses.imputed_rows] @ primal).ravel()]
    )
    options = [keep_all, *_threshold_options(scores, masses.yes, masses.no, rate)]
    return _Candidate(
        rule.rule_id,
        fit.model_copy(update={"alpha": alpha, "loo_auc": auc}),
        options,
        rate,
        imputed,
        weights=primal[:-1],
        bias=float(primal[-1]),
    )


def _threshold_options(
    scores: Floats, yes: Floats, no: Floats, rate: float
) -> list[_Option]:
    """Skipping below each score that carries YES mass, then skipping always.

    A threshold above YES mass `below` (of `total`) misses a new YES verdict with
    probability `(below + 1) / (total + 1)`: the conformal rank argument, the new
    verdict being exchangeable with the old ones; it skips the share of the NO mass
    below it.
    """
    order = np.argsort(scores, kind="stable")
    ranked = scores[order]
    yes_below = np.concatenate([[0.0], np.cumsum(yes[order])])
    no_below = np.concatenate([[0.0], np.cumsum(no[order])])
    total_yes, total_no = yes_below[-1], no_below[-1]
    thresholds = np.unique(scores[yes > 0])
    at = np.searchsorted(ranked, thresholds, side="left")
    return [
        _Option(
            threshold,
            rate * (below + 1.0) / (total_yes + 1.0),
            (1.0 - rate) * skipped / total_no if total_no else 0.0,
        )
        for threshold, below, skipped in zip(
            [*thresholds.tolist(), math.inf],
            [*yes_below[at].tolist(), float(total_yes)],
            [*no_below[at].tolist(), float(total_no)],
            strict=True,
        )
    ]


def _weighted_auc(scores: Floats, y: npt.NDArray[np.bool_], w: Floats) -> float:
    """ROC-AUC with example weights; ties count one half.

    What `sklearn.metrics.roc_auc_score(y, scores, sample_weight=w)` computes (the
    tests check they agree), hand-written because it runs once per rule and
    regularisation strength (330 calls per NBA training, up to 4,602 for ObliQA)
    and is faster: hand-written 30 us vs scikit-learn 2,895 us per call on 104
    rows (NBA), 34 us vs 3,464 us on 392 rows (ObliQA), measured on the
    datasets of `benchmarks/bench_learned_prefilter.py`.
    """
    pos, neg = scores[y], scores[~y]
    pw, nw = w[y], w[~y]
    order = np.argsort(neg, kind="stable")
    neg, nw = neg[order], nw[order]
    cumulative = np.concatenate([[0.0], np.cumsum(nw)])
    below = cumulative[np.searchsorted(neg, pos, side="left")]
    tied = cumulative[np.searchsorted(neg, pos, side="right")] - below
    return float((pw * (below + 0.5 * tied)).sum() / (pw.sum() * nw.sum()))


def _allocate(candidates: list[_Candidate], budget: float) -> float:
    """Spend the allowed misses where they skip the most; returns what was spent.

    Each rule moves along the upper concave hull of its (miss, skip) options, the
    steepest step of any rule first, while the step fits in what is left.
    """

    def next_step(c: _Candidate) -> tuple[float, int] | None:
        here = c.options[c.chosen]
        best: tuple[float, int] | None = None
        for index in range(c.chosen + 1, len(c.options)):
            there = c.options[index]
            gain, cost = there.skip - here.skip, there.miss - here.miss
            if gain <= 0:
                continue
            slope = gain / cost if cost > 0 else math.inf
            if best is None or slope > best[0]:
                best = (slope, index)
        return best

    heap: list[tuple[float, int, int]] = []
    for position, candidate in enumerate(candidates):
        step = next_step(candidate)
        if step is not None:
            heapq.heappush(heap, (-step[0], position, step[1]))
    spent = 0.0
    while heap:
        _, position, index = heapq.heappop(heap)
        candidate = candidates[position]
        cost = candidate.options[index].miss - candidate.options[candidate.chosen].miss
        if spent + cost > budget + 1e-12:
            continue  # this rule stops here; cheaper steps of others may still fit
        spent += cost
        candidate.chosen = index
        step = next_step(candidate)
        if step is not None:
            heapq.heappush(heap, (-step[0], position, step[1]))
    return spent
