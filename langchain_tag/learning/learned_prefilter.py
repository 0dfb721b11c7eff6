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

It needs the `learned` extra (scikit-learn, SciPy) to train and to select. How it
learns is in the modules it is made of:

- `_features`: hashed word n-grams (`FeatureHashing`, `HashedFeatures`), TF-IDF.
- `_records`: what training takes and gives (`LabelledExample`, `SkippedPair`,
  `FitReport`, `RuleFit`).
- `_training`: per-rule ridge classifiers with exact leave-one-out scores.
- `_thresholds`: per-rule thresholds keeping one recall target over all the rules
  (the conformal rank argument, a miss budget spent where it skips the most).
- `_prefilter_file`: the `.npz` file (`save`, `load`).

Untrained, the prefilter passes every rule: exactly plain TAG. It knows the rules
it was built or trained over by id and content hash (`known_rules`, saved with the
model); a candidate it does not know (a new rule, or an edited one: same id,
another content hash) is always judged, with one warning naming them
(`partition(text, candidates)`). `load(path, rulebook, target_recall=x)` spends the
misses again for `x` without training (the same thresholds `fit` at `x` would
choose).

Live, the labels are selected: once the prefilter runs, the judge labels what it
lets through plus the few skipped pairs shadow judging explores
(`langchain_tag.learning.shadow`, weighted `1 / explore`). Thresholds chosen on
those labels alone lose recall at every retraining (the YES verdicts the last
model skipped are missing from the next training set), so `fit` also takes the
pairs that were skipped and never judged (`SkippedPair`, what the verdict log
remembers of each skip): each enters the threshold step, not the ridge, as a
fractional YES. A `Retrainer` then chooses `internal_target`, the recall the
thresholds aim at, with a miss-budget controller (`langchain_tag.learning.promise`)
so that the stream's recall keeps `target_recall`
(`benchmarks/bench_recall_promise.py` measures it).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr

from langchain_tag.learning._features import (
    FeatureHashing,
    HashedFeatures,
    tf_idf_row,
)
from langchain_tag.learning._fit_records import (
    FitReport,
    LabelledExample,
    RuleFit,
    SkippedPair,
)
from langchain_tag.learning._prefilter_file import (
    FORMAT_VERSION,
    read_model,
    write_model,
)
from langchain_tag.learning._training import (
    FitSettings,
    TrainedModel,
    rethresholded,
    train,
)
from langchain_tag.rules import Rule, Rulebook

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

Floats = npt.NDArray[np.float64]


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


class _Installed(NamedTuple):
    """A model, which of its rules skip and are still the rulebook's, and how."""

    model: TrainedModel
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

    def _activate(self, model: TrainedModel) -> None:
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
        if internal_target is not None and not 0.0 <= internal_target <= 1.0:
            msg = f"internal_target must be in [0, 1], got {internal_target!r}"
            raise ValueError(msg)
        settings = FitSettings(
            self.hashing, self.min_examples, self.min_df, self.max_inputs, self.alphas
        )
        model = train(
            settings,
            examples,
            self.rulebook if rulebook is None else rulebook,
            self.target_recall,
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
        return write_model(self._state.model, path)

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
        model = read_model(path, rulebook)
        report = model.report
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
            model = rethresholded(model, float(target), float(target))
        prefilter = cls(
            rulebook, **{**data, "target_recall": target, "hashing": model.hashing}
        )
        prefilter._activate(model)
        return prefilter


def _margins(state: _Installed | None, text: str) -> dict[str, float]:
    """Score minus threshold of each rule `state` may skip (< 0: skipped)."""
    if state is None or not state.rule_ids:
        return {}
    model, active, ids, thresholds, _ = state
    features = model.hashing.hash_matrix([text])
    features.sort_indices()
    values = tf_idf_row(
        model.columns,
        model.idf,
        np.asarray(features.indices),
        np.asarray(features.data),
    )
    if values is None:
        scores = model.bias[active]
    else:
        positions, weights = values
        scores = weights @ model.weights[positions][:, active] + model.bias[active]
    margins = scores - thresholds
    return dict(zip(ids, margins.tolist(), strict=True))
