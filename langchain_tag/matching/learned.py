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
  training inputs' document frequencies, L2-normalised. Buckets seen in fewer than
  `min_df` training inputs are dropped.
- **Per-rule classifier**: ridge regression on +-1 labels, solved in its dual form,
  whose leave-one-out (LOO) predictions are exact and nearly free; each rule's
  regularisation is picked from `alphas` by the LOO ranking quality (AUC).
- **Per-rule thresholds, one recall target**: a rule is skipped for an input when
  its score is below the rule's threshold, placed at one of the rule's LOO YES
  scores. A threshold above `k` of the rule's `p` YES examples misses a future YES
  verdict with probability `(k + 1) / (p + 1)` (the conformal rank argument);
  times the rule's YES rate, that is its expected misses per input. The misses
  `target_recall` allows over all the rules' YES verdicts are spent where each
  buys the most skipped judgments (greedy along each rule's concave hull of
  (misses, skips)), so a rule that seldom applies may be skipped outright, and the
  expected recall of the YES verdicts stays at the target.
- **Cold start**: a rule with fewer than `min_examples` verdicts, one always
  answered YES, one added to the rulebook or whose content hash changed since
  training, is always judged. Untrained, the prefilter passes every rule: exactly
  plain TAG.

Shadow judging keeps the labels flowing for skipped rules and measures recall live:
The shadow-judging pieces (`explore_pairs`, `estimate_recall`, `RetrainPolicy`) are
in `langchain_tag.matching.shadow`.
Once the prefilter runs, a skipped pair's verdict is known only if it was
explored: train on shadow judgments weighted `1 / explore` (as
`VerdictLog.examples` gives them), and watch the live estimate, since thresholds
learned from such sampled labels keep somewhat less recall than the target
(`benchmarks/bench_learned_prefilter.py` measures how much).

The model is saved as an `.npz` file read with `allow_pickle=False` (arrays and one
JSON header, nothing executable), written atomically.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import io
import json
import math
import os
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
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
    "Selection",
]

FORMAT_VERSION = 1
"""Version of the saved-model file format this release writes and reads."""

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


class FitReport(BaseModel):
    """What `LearnedPrefilter.fit` learned from, and what it expects of itself."""

    model_config = ConfigDict(frozen=True)

    inputs: int
    examples: int
    ignored: int = Field(description="Examples of rules not in the rulebook.")
    target_recall: float
    expected_recall: float = Field(
        description="Expected share of YES verdicts kept (LOO, conformal), over the "
        "rules with enough history."
    )
    expected_judged: float = Field(
        description="Expected rules judged per input, of the rulebook's."
    )
    rules: dict[str, RuleFit]
    seconds: float

    def count(self, status: RuleStatus) -> int:
        """How many rules training gave `status`."""
        return sum(fit.status == status for fit in self.rules.values())


class Selection(NamedTuple):
    """Which rules to judge for one input, and which the prefilter skips."""

    judged: list[str]
    skipped: list[str]


@dataclass(frozen=True)
class _Model:
    """The trained state: features, per-rule weights and thresholds."""

    hashing: FeatureHashing
    columns: npt.NDArray[np.int64]
    idf: Floats
    rule_ids: tuple[str, ...]
    rule_hashes: tuple[str, ...]
    weights: npt.NDArray[np.float32]
    bias: Floats
    thresholds: Floats
    report: FitReport


class _Installed(NamedTuple):
    """A model and which of its rules are still the rulebook's."""

    model: _Model
    active: npt.NDArray[np.int64]
    rule_ids: tuple[str, ...]


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
    """Expected share of the judge's YES verdicts kept (over rules with history)."""
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

    def _activate(self, model: _Model) -> None:
        """Install `model`, keeping only its rules unchanged in the rulebook."""
        current = {rule.rule_id: rule.content_hash() for rule in self.rulebook.rules}
        active = [
            i
            for i, (rule_id, rule_hash) in enumerate(
                zip(model.rule_ids, model.rule_hashes, strict=True)
            )
            if current.get(rule_id) == rule_hash
        ]
        # One assignment: a concurrent select() sees the old model or the new one.
        self._state = _Installed(
            model,
            np.asarray(active, dtype=np.int64),
            tuple(model.rule_ids[i] for i in active),
        )

    # -- training ---------------------------------------------------------------------

    def fit(
        self,
        examples: Iterable[
            LabelledExample
            | tuple[str | HashedFeatures, str, bool]
            | tuple[str | HashedFeatures, str, bool, float]
        ],
    ) -> FitReport:
        """Train on judged pairs; replaces any previous model.

        Args:
            examples: `(input, rule_id, applies)` or with a fourth item, the weight
                (see `LabelledExample`); the input is a text or `HashedFeatures`.
                A pair given twice counts once, the last one. Examples of rules
                not in the rulebook are ignored. They must be verdicts on the
                rulebook's current rules (`VerdictLog.examples` drops stale ones).

        Returns:
            What was learned (also `self.report`).

        Raises:
            ValueError: A weight is not positive, or hashed features use another
                scheme than `hashing`.
            ImportError: scikit-learn (the `learned` extra) is not installed.
        """
        started = time.perf_counter()
        data = _collect(examples, {rule.rule_id for rule in self.rulebook.rules})
        inputs = data.inputs[-self.max_inputs :]
        first = len(data.inputs) - len(inputs)
        labels = {
            rule_id: [(i - first, y, w) for i, y, w in pairs if i >= first]
            for rule_id, pairs in data.labels.items()
        }
        model = _train(self, inputs, labels, data.ignored, started)
        self._activate(model)
        return model.report

    # -- selection --------------------------------------------------------------------

    def margins(self, text: str) -> dict[str, float]:
        """Score minus threshold of each rule the model may skip (< 0: skipped)."""
        state = self._state
        if state is None or not state.rule_ids:
            return {}
        model, active, ids = state
        features = model.hashing.hash_matrix([text])
        features.sort_indices()
        values = _tf_idf_row(
            model, np.asarray(features.indices), np.asarray(features.data)
        )
        if values is None:
            scores = model.bias[active]
        else:
            positions, weights = values
            scores = weights @ model.weights[positions][:, active] + model.bias[active]
        margins = scores - model.thresholds[active]
        return dict(zip(ids, margins.tolist(), strict=True))

    def partition(self, text: str) -> Selection:
        """The rule ids to judge and those skipped, each in rulebook order."""
        margins = self.margins(text)
        judged: list[str] = []
        skipped: list[str] = []
        for rule in self.rulebook.rules:
            margin = margins.get(rule.rule_id)
            (skipped if margin is not None and margin < 0 else judged).append(
                rule.rule_id
            )
        return Selection(judged, skipped)

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
            "format": "langchain-tag-learned-prefilter",
            "version": FORMAT_VERSION,
            "hashing": model.hashing.model_dump(mode="json"),
            "rule_ids": list(model.rule_ids),
            "rule_hashes": list(model.rule_hashes),
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
            thresholds=model.thresholds,
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

        Raises:
            ValueError: The file is not a saved learned prefilter, or is corrupt.
        """
        try:
            with np.load(Path(path), allow_pickle=False) as arrays:
                header = json.loads(bytes(arrays["header"]).decode())
                loaded = {
                    name: np.asarray(arrays[name])
                    for name in ("columns", "idf", "weights", "bias", "thresholds")
                }
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
            msg = f"{path}: not a saved learned prefilter ({error})."
            raise ValueError(msg) from error
        if (
            header.get("format") != "langchain-tag-learned-prefilter"
            or header.get("version") != FORMAT_VERSION
        ):
            msg = (
                f"{path}: format {header.get('format')!r} version "
                f"{header.get('version')!r}; this release reads version "
                f"{FORMAT_VERSION}. Train again."
            )
            raise ValueError(msg)
        try:
            hashing = FeatureHashing.model_validate(header["hashing"])
            report = FitReport.model_validate(header["report"])
            model = _Model(
                hashing=hashing,
                columns=loaded["columns"].astype(np.int64),
                idf=loaded["idf"].astype(np.float64),
                rule_ids=tuple(header["rule_ids"]),
                rule_hashes=tuple(header["rule_hashes"]),
                weights=loaded["weights"].astype(np.float32),
                bias=loaded["bias"].astype(np.float64),
                thresholds=loaded["thresholds"].astype(np.float64),
                report=report,
            )
        except (KeyError, TypeError, ValidationError) as error:
            msg = f"{path}: a malformed learned-prefilter header ({error})."
            raise ValueError(msg) from error
        _check_shapes(model, path)
        prefilter = cls(
            rulebook,
            **{"target_recall": report.target_recall, **data, "hashing": hashing},
        )
        prefilter._activate(model)
        return prefilter


def _check_shapes(model: _Model, path: str | os.PathLike[str]) -> None:
    d, r = len(model.columns), len(model.rule_ids)
    expected = {
        "idf": (model.idf.shape, (d,)),
        "weights": (model.weights.shape, (d, r)),
        "bias": (model.bias.shape, (r,)),
        "thresholds": (model.thresholds.shape, (r,)),
        "rule_hashes": ((len(model.rule_hashes),), (r,)),
    }
    for name, (shape, wanted) in expected.items():
        if shape != wanted:
            msg = f"{path}: {name} has shape {shape}, expected {wanted}."
            raise ValueError(msg)


def _tf_idf_row(
    model: _Model, indices: npt.NDArray[Any], counts: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.int64], Floats] | None:
    """Positions among the model's columns and unit TF-IDF weights, or None."""
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
    ignored: int


def _collect(examples: Iterable[Any], rule_ids: set[str]) -> _Collected:
    """Distinct inputs (in order of last use) and each rule's labelled inputs."""
    position: dict[str | HashedFeatures, int] = {}
    pairs: dict[tuple[int, str], tuple[bool, float]] = {}
    ignored = 0
    for example in examples:
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
        pairs.pop((index, rule_id), None)  # the last verdict on a pair wins
        pairs[index, rule_id] = (bool(applies), weight)
    # Inputs ordered by their last example, so `max_inputs` keeps the most recent.
    last_use: dict[int, int] = {}
    for order, (index, _) in enumerate(pairs):
        last_use[index] = order
    ranked = sorted(last_use, key=last_use.__getitem__)
    renumber = {old: new for new, old in enumerate(ranked)}
    inputs = list(position)
    labels: dict[str, list[tuple[int, bool, float]]] = {}
    for (index, rule_id), (applies, weight) in pairs.items():
        labels.setdefault(rule_id, []).append((renumber[index], applies, weight))
    return _Collected([inputs[old] for old in ranked], labels, ignored)


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
    """

    rule_id: str
    fit: RuleFit
    options: list[_Option]
    weights: Floats | None = None
    bias: float = 0.0
    chosen: int = 0


def _train(
    prefilter: LearnedPrefilter,
    inputs: Sequence[str | HashedFeatures],
    labels: dict[str, list[tuple[int, bool, float]]],
    ignored: int,
    started: float,
) -> _Model:
    hashing = prefilter.hashing
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
    for rule in prefilter.rulebook.rules:
        pairs = labels.get(rule.rule_id, [])
        candidate = _rule_candidate(
            prefilter, rule, pairs, augmented, gram, decompositions
        )
        fits[rule.rule_id] = candidate.fit
        if candidate.fit.status != "little_history":
            yes_rate_total += _yes_rate(pairs)
        if candidate.options:
            candidates.append(candidate)
    budget = (1.0 - prefilter.target_recall) * yes_rate_total
    spent = _allocate(candidates, budget)
    kept = []
    for candidate in candidates:
        option = candidate.options[candidate.chosen]
        fit = candidate.fit
        if candidate.chosen == 0:
            fits[candidate.rule_id] = fit.model_copy(update={"status": "no_gain"})
            continue
        always = math.isinf(option.threshold)
        fits[candidate.rule_id] = fit.model_copy(
            update={
                "status": "skipped" if always else "learned",
                "threshold": None if always else option.threshold,
                "expected_skip": option.skip,
                "expected_miss": option.miss,
            }
        )
        kept.append(candidate)
    n_rules = len(prefilter.rulebook.rules)
    hashes = {rule.rule_id: rule.content_hash() for rule in prefilter.rulebook.rules}
    weights = np.zeros((len(columns), len(kept)), dtype=np.float32)
    for j, candidate in enumerate(kept):
        if candidate.weights is not None:
            weights[:, j] = candidate.weights
    report = FitReport(
        inputs=len(inputs),
        examples=sum(len(pairs) for pairs in labels.values()),
        ignored=ignored,
        target_recall=prefilter.target_recall,
        expected_recall=1.0 - spent / yes_rate_total if yes_rate_total else 1.0,
        expected_judged=n_rules - sum(fit.expected_skip for fit in fits.values()),
        rules=fits,
        seconds=time.perf_counter() - started,
    )
    return _Model(
        hashing=hashing,
        columns=columns,
        idf=idf,
        rule_ids=tuple(c.rule_id for c in kept),
        rule_hashes=tuple(hashes[c.rule_id] for c in kept),
        weights=weights,
        bias=np.asarray([c.bias for c in kept], dtype=np.float64),
        thresholds=np.asarray(
            [c.options[c.chosen].threshold for c in kept], dtype=np.float64
        ),
        report=report,
    )


def _tf_idf_matrix(
    counts: Any, min_df: int
) -> tuple[npt.NDArray[np.int64], Floats, Any]:
    """Columns kept (>= `min_df` inputs), their IDF, and the unit TF-IDF rows."""
    from scipy import sparse  # noqa: PLC0415 - with sklearn

    counts.sum_duplicates()
    buckets, df = np.unique(counts.indices, return_counts=True)
    frequent = df >= min_df
    columns = buckets[frequent].astype(np.int64)
    idf = np.log((1.0 + counts.shape[0]) / (1.0 + df[frequent])) + 1.0
    matrix = counts[:, columns].astype(np.float64)
    matrix.data = 1.0 + np.log(matrix.data)
    matrix = matrix @ sparse.diags(idf)
    norms = np.sqrt(np.asarray(matrix.multiply(matrix).sum(axis=1)).ravel())
    # An input with no kept feature stays a zero row (only the bias scores it).
    return columns, idf, sparse.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ matrix


def _yes_rate(pairs: Sequence[tuple[int, bool, float]]) -> float:
    """The rule's YES share per input, pulled towards 1/2 by half an example."""
    total = sum(w for _, _, w in pairs)
    yes = sum(w for _, y, w in pairs if y)
    return (yes + 0.5) / (total + 1.0)


def _rule_candidate(
    prefilter: LearnedPrefilter,
    rule: Rule,
    pairs: Sequence[tuple[int, bool, float]],
    augmented: Any,
    gram: Floats,
    decompositions: dict[bytes, tuple[Floats, Floats]],
) -> _Candidate:
    """A rule's skipping options: (threshold, expected miss, expected skip) each."""
    rows = np.asarray([i for i, _, _ in pairs], dtype=np.int64)
    y = np.asarray([a for _, a, _ in pairs], dtype=bool)
    w = np.asarray([w for _, _, w in pairs], dtype=np.float64)
    positives = int(y.sum())
    fit = RuleFit(status="learned", examples=len(pairs), positives=positives)
    if len(pairs) < prefilter.min_examples:
        return _Candidate(
            rule.rule_id, fit.model_copy(update={"status": "little_history"}), []
        )
    if positives == len(pairs):
        return _Candidate(
            rule.rule_id, fit.model_copy(update={"status": "always_applies"}), []
        )
    rate = _yes_rate(pairs)
    keep_all = _Option(-math.inf, 0.0, 0.0)
    if positives == 0:
        # Skipping a rule that never applied misses all of its (rare) YES verdicts.
        skip_all = _Option(math.inf, rate, 1.0 - rate)
        return _Candidate(rule.rule_id, fit, [keep_all, skip_all])
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
    options = [keep_all, *_threshold_options(loo, y, w, rate)]
    return _Candidate(
        rule.rule_id,
        fit.model_copy(update={"alpha": alpha, "loo_auc": auc}),
        options,
        weights=primal[:-1],
        bias=float(primal[-1]),
    )


def _threshold_options(
    scores: Floats, y: npt.NDArray[np.bool_], w: Floats, rate: float
) -> list[_Option]:
    """Skipping below each YES example's LOO score, then skipping always.

    A threshold above YES examples of total weight `below` (of `total`) misses a
    new YES verdict with probability `(below + 1) / (total + 1)`: the conformal
    rank argument, the new verdict being exchangeable with the old ones.
    """
    positive = np.sort(np.unique(scores[y]))
    pos_scores, pos_w = scores[y], w[y]
    neg_scores, neg_w = scores[~y], w[~y]
    total_pos, total_neg = float(pos_w.sum()), float(neg_w.sum())
    options = []
    for threshold in [*positive.tolist(), math.inf]:
        below = float(pos_w[pos_scores < threshold].sum())
        skipped = float(neg_w[neg_scores < threshold].sum())
        options.append(
            _Option(
                threshold,
                rate * (below + 1.0) / (total_pos + 1.0),
                (1.0 - rate) * skipped / total_neg,
            )
        )
    return options


def _weighted_auc(scores: Floats, y: npt.NDArray[np.bool_], w: Floats) -> float:
    """ROC-AUC with example weights; ties count one half."""
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
