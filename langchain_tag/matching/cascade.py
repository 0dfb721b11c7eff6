"""A judge cascade: a cheap judge for every pair, a strong one where it is unsure.

Most (input, rule) pairs are clear NOs. `CascadeJudge` lets a cheap model judge every
pair and keeps only its confident NOs, those whose logprob score P(YES) is at most
`no_threshold`; YES verdicts, uncertain or unscored NOs and failed judgments go to
the strong judge. A failed cheap judgment is never taken as a NO.

It is a judge like `ApplicabilityJudge` (both are `BaseJudge`s), so it goes wherever
one does:

```python
cheap = ApplicabilityJudge(llm=ChatOpenAI(model="gpt-4o-mini"), logprobs=True)
strong = ApplicabilityJudge(llm=ChatOpenAI(model="gpt-4o"))
judge = CascadeJudge(cheap=cheap, strong=strong, no_threshold=0.1)
retriever = TAGRetriever.from_rulebook("rules.json", judge=judge)
graph.invoke(inputs, context=QueryContext(judge=judge))
```
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal, cast

from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    computed_field,
    model_validator,
)

from langchain_tag.errors import JudgmentError
from langchain_tag.matching.judge import (
    ApplicabilityJudge,
    BaseJudge,
    JudgeInput,
    Verdict,
)
from langchain_tag.models import CallRetry
from langchain_tag.rules import Rule

Escalation = Literal["yes", "uncertain", "unscored", "failed"]
"""Why a pair went to the strong judge: the cheap judge said YES, said NO with a
score above `no_threshold`, said NO without a score, or failed."""


class CascadeStats(BaseModel):
    """How a `CascadeJudge`'s judgments were decided, since it was made or reset."""

    model_config = ConfigDict(frozen=True)

    cheap_calls: int = 0
    """Judgments asked of the cheap judge (every pair; cache hits included)."""
    final_by_cheap: int = 0
    """Pairs decided by the cheap judge's confident NO."""
    escalated_by: dict[Escalation, int] = Field(default_factory=dict)
    """Pairs sent to the strong judge, by reason."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def escalated(self) -> int:
        """Pairs sent to the strong judge."""
        return sum(self.escalated_by.values())

    @computed_field  # type: ignore[prop-decorator]
    @property
    def strong_calls(self) -> int:
        """Judgments asked of the strong judge: one per escalated pair."""
        return self.escalated

    @computed_field  # type: ignore[prop-decorator]
    @property
    def strong_calls_saved(self) -> float:
        """Share of pairs the strong judge did not have to judge (0 when none)."""
        return self.final_by_cheap / self.cheap_calls if self.cheap_calls else 0.0


class CascadeJudge(BaseJudge):
    """Judge with a cheap judge first; escalate all but its confident NOs.

    The cheap judge judges every pair. Its NO is final when its logprob score
    P(YES) is at most `no_threshold` (so the cheap judge needs `logprobs=True`,
    unless `unscored="final"`); every other verdict goes to the strong judge, whose
    verdict is final. A cheap judgment that failed (raised `JudgmentError`, or was
    flagged under `on_error="not_applicable"`) is escalated too; whether a failed
    strong judgment raises or is flagged is the strong judge's `on_error`.

    Each verdict's `decided_by` says which stage decided (`cheap` or `strong`), and
    `stats` counts the calls of both stages. The fan-outs (`judge_rules`,
    `ajudge_rules`) are every judge's: a pair holds its concurrency slot through
    both stages, so the limit bounds the model calls of both together.
    Both stages' model calls run with the caller's callbacks, named
    `<run name>:cheap` and `<run name>:strong`.

    The single-judge options (`llm`, `profile`, `logprobs`, `retry`, `on_error`,
    `cache`, ...) belong to the stages and are not accepted here; each stage caches
    its own verdicts.

    Attributes:
        cheap: The judge of every pair, with `logprobs=True`.
        strong: The judge of the escalated pairs.
        no_threshold: A cheap NO scoring P(YES) at most this is final.
        unscored: What to do with a cheap NO that has no score (the model returned
            no logprobs): escalate it, or take it as final.
    """

    cheap: ApplicabilityJudge
    strong: ApplicabilityJudge
    no_threshold: float = Field(default=0.1, ge=0.0, le=1.0)
    unscored: Literal["escalate", "final"] = "escalate"

    _counts: Counter[str] = PrivateAttr(default_factory=Counter)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @model_validator(mode="before")
    @classmethod
    def _stages_own_the_options(cls, data: Any) -> Any:
        unknown = (
            sorted(data.keys() - cls.model_fields.keys())
            if isinstance(data, dict)
            else []
        )
        if unknown:
            msg = (
                f"CascadeJudge takes no {', '.join(unknown)}: set them on the cheap "
                "and strong judges."
            )
            raise ValueError(msg)
        return data

    @model_validator(mode="after")
    def _stages_mark_their_logs(self) -> CascadeJudge:
        # A verdict log tells the stages apart: the cheap judge's verdicts are no
        # labels to train on, the strong judge's are.
        if self.cheap.verdict_log is not None and self.cheap.log_source == "judge":
            self.cheap = self.cheap.remade(log_source="cascade-cheap")
        if self.strong.verdict_log is not None and self.strong.log_source == "judge":
            self.strong = self.strong.remade(log_source="cascade-strong")
        return self

    @model_validator(mode="after")
    def _cheap_can_be_confident(self) -> CascadeJudge:
        if self.unscored == "escalate" and not self.cheap.logprobs:
            msg = (
                "The cheap judge has logprobs=False, so none of its NOs has a score "
                "and every pair would be escalated. Give it logprobs=True (a model "
                "with a `logprobs` option, e.g. ChatOpenAI), or set "
                "unscored='final' to take its unscored NOs as final."
            )
            raise ValueError(msg)
        return self

    @property
    def final_llm(self) -> BaseChatModel:
        """The strong judge's model: its verdicts are final for escalated pairs."""
        return self.strong.llm

    @property
    def identity(self) -> str:
        """The strong judge's identity: its verdicts are final."""
        return self.strong.identity

    def with_call_retry(self, retry: CallRetry) -> CascadeJudge:
        """A copy whose stages both use `retry`; the counts stay shared."""
        return self.model_copy(
            update={
                "cheap": self.cheap.with_call_retry(retry),
                "strong": self.strong.with_call_retry(retry),
            }
        )

    # -- what the cascade decides -----------------------------------------------------

    @property
    def stats(self) -> CascadeStats:
        """Counts since the judge was made or `reset_stats` was called."""
        with self._lock:
            counts = dict(self._counts)
        return CascadeStats(
            cheap_calls=counts.pop("cheap", 0),
            final_by_cheap=counts.pop("final", 0),
            escalated_by=cast("dict[Escalation, int]", counts),
        )

    def reset_stats(self) -> None:
        """Start counting from zero."""
        with self._lock:
            self._counts.clear()

    def escalation(self, verdict: Verdict | None) -> Escalation | None:
        """Why the cheap `verdict` goes to the strong judge; None if it is final.

        Args:
            verdict: The cheap judge's verdict, or None if it raised.
        """
        if verdict is None or verdict.failed:
            return "failed"
        if verdict.applies:
            return "yes"
        if verdict.score is None:
            return None if self.unscored == "final" else "unscored"
        return None if verdict.score <= self.no_threshold else "uncertain"

    def _triage(self, verdict: Verdict | None) -> Verdict | None:
        """Count the cheap verdict; return it as final, or None to escalate."""
        reason = self.escalation(verdict)
        with self._lock:
            self._counts["cheap"] += 1
            self._counts[reason or "final"] += 1
        if reason is None and verdict is not None:
            return verdict.model_copy(update={"decided_by": "cheap"})
        return None

    # -- the judge interface ---------------------------------------------

    def cache_key(self, text: str, rule: Rule) -> str:
        """Key of a cascade verdict: both stages' keys and the escalation settings."""
        payload = json.dumps(
            [
                "cascade",
                self.cheap.cache_key(text, rule),
                self.strong.cache_key(text, rule),
                self.no_threshold,
                self.unscored,
            ]
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def recall(self, text: str, rules: Sequence[Rule]) -> dict[str, Verdict]:
        """The pairs both stages' caches decide: at most two lookups.

        The cheap stage's verdicts of every rule in one lookup; its confident NOs
        are final, and the strong stage's verdicts of the rest in a second. A pair
        either cache lacks is left to the fan-out, which judges it as always.
        """
        cheap = self.cheap.recall(text, rules)
        strong = self.strong.recall(text, self._escalated(rules, cheap))
        return self._decided(cheap, strong)

    async def arecall(self, text: str, rules: Sequence[Rule]) -> dict[str, Verdict]:
        """Async `recall`."""
        cheap = await self.cheap.arecall(text, rules)
        strong = await self.strong.arecall(text, self._escalated(rules, cheap))
        return self._decided(cheap, strong)

    def _escalated(
        self, rules: Sequence[Rule], cheap: dict[str, Verdict]
    ) -> list[Rule]:
        return [
            rule
            for rule in rules
            if rule.rule_id in cheap
            and self.escalation(cheap[rule.rule_id]) is not None
        ]

    def _decided(
        self, cheap: dict[str, Verdict], strong: dict[str, Verdict]
    ) -> dict[str, Verdict]:
        # Counted as the fan-out counts a judgment; a pair left to it, not here.
        decided: dict[str, Verdict] = {}
        for rule_id, verdict in cheap.items():
            if self.escalation(verdict) is None:
                final = self._triage(verdict)
                if final is not None:
                    decided[rule_id] = final
            elif rule_id in strong:
                self._triage(verdict)
                decided[rule_id] = strong[rule_id].model_copy(
                    update={"decided_by": "strong"}
                )
        return decided

    def prefix_share(self, text: str, rules: Sequence[Rule]) -> float:
        """The cheap judge's prompt prefix share: it judges every pair."""
        return self.cheap.prefix_share(text, rules)

    # The stages judge as the fan-outs do, without a run of their own: the stage
    # model calls are then children of the caller's run.
    def _judge(
        self,
        request: JudgeInput,
        run_manager: CallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        try:
            cheap = self.cheap.judge_pair(request, _stage(config, "cheap"))
        except JudgmentError:
            cheap = None
        final = self._triage(cheap)
        if final is not None:
            return final
        verdict = self.strong.judge_pair(request, _stage(config, "strong"))
        return verdict.model_copy(update={"decided_by": "strong"})

    async def _ajudge(
        self,
        request: JudgeInput,
        run_manager: AsyncCallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Verdict:
        try:
            cheap = await self.cheap.ajudge_pair(request, _stage(config, "cheap"))
        except JudgmentError:
            cheap = None
        final = self._triage(cheap)
        if final is not None:
            return final
        verdict = await self.strong.ajudge_pair(request, _stage(config, "strong"))
        return verdict.model_copy(update={"decided_by": "strong"})


def _stage(config: RunnableConfig, stage: str) -> RunnableConfig:
    # The fan-out names each pair's run `judge:<rule id>`; the stages extend it,
    # and each makes a run of its own.
    child = cast(
        "RunnableConfig",
        {
            **config,
            "run_name": f"{config.get('run_name') or 'judge'}:{stage}",
            "metadata": {**config.get("metadata", {}), "tag_judge_stage": stage},
        },
    )
    child.pop("run_id", None)
    return child
