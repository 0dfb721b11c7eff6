"""Where verdicts are remembered and logged: one component every backend shares.

A judgment backend (chat one rule per call, chat batched, a decision model, the
provider batch lane) only calls its model. What is around every backend is here:
reading a query's cached verdicts in one `mget`, writing each paid verdict to the
cache as soon as it is read (so a later failure of the same fan-out loses none),
and appending each judgment made to the verdict log with the fields that tell
backends, models and question renderings apart. The engine reads the cache once per
query before any fan-out (`BaseJudge.judge_rules`); the backends write through
here after each call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_tag.matching.verdicts import Verdict, VerdictSink

if TYPE_CHECKING:
    from langchain_core.stores import BaseStore

    from langchain_tag.rules import Rule

__all__ = ["VerdictMemory"]


@dataclass(frozen=True)
class VerdictMemory:
    """A judge's verdict cache and verdict log, keyed and marked by the judge.

    Args:
        cache: Any `BaseStore[str, str]`; None remembers nothing.
        log: Where judgments made are appended (`VerdictLog`); None keeps none.
        key: The cache key of a verdict on (text, rule).
        log_fields: The log's fields of a verdict on `rule` (model, question
            version, profile, source, and the exploration rate passed, if any).
    """

    cache: BaseStore[str, str] | None
    log: VerdictSink | None
    key: Callable[[str, Rule], str]
    log_fields: Callable[[Rule, float | None], dict[str, Any]]

    # -- the cache ----------------------------------------------------------------

    def recall(self, text: str, rules: Sequence[Rule]) -> dict[str, Verdict]:
        """The cached verdicts of `rules` on `text`, by rule id: one `mget`."""
        if self.cache is None or not rules:
            return {}
        return _hits(rules, self.cache.mget(self._keys(text, rules)))

    async def arecall(self, text: str, rules: Sequence[Rule]) -> dict[str, Verdict]:
        """Async `recall`."""
        if self.cache is None or not rules:
            return {}
        return _hits(rules, await self.cache.amget(self._keys(text, rules)))

    def remember(
        self, text: str, rules: Sequence[Rule], verdicts: Sequence[Verdict]
    ) -> None:
        """Cache the successful `verdicts` of `rules` on `text` in one `mset`."""
        if self.cache is not None:
            stored = _stored(self._keys(text, rules), verdicts)
            if stored:
                self.cache.mset(stored)

    async def aremember(
        self, text: str, rules: Sequence[Rule], verdicts: Sequence[Verdict]
    ) -> None:
        """Async `remember`."""
        if self.cache is not None:
            stored = _stored(self._keys(text, rules), verdicts)
            if stored:
                await self.cache.amset(stored)

    # -- the log ------------------------------------------------------------------

    def record(
        self,
        text: str,
        rule: Rule,
        verdict: Verdict,
        explore: float | None = None,
    ) -> Verdict:
        """Append one judgment made to the log; returns `verdict`."""
        if self.log is not None:
            self.log.record(text, rule, verdict, **self.log_fields(rule, explore))
        return verdict

    async def arecord(
        self,
        text: str,
        rule: Rule,
        verdict: Verdict,
        explore: float | None = None,
    ) -> Verdict:
        """Async `record`."""
        if self.log is not None:
            await self.log.arecord(
                text, rule, verdict, **self.log_fields(rule, explore)
            )
        return verdict

    def settle(
        self,
        text: str,
        rules: Sequence[Rule],
        verdicts: Sequence[Verdict],
        explored: Mapping[str, float] | None = None,
    ) -> list[Verdict]:
        """Cache, then log, the verdicts of one call: what every backend does after.

        Args:
            text: The input.
            rules: The rules the call judged.
            verdicts: Their verdicts, in the same order (failed ones are logged,
                never cached).
            explored: Rule id -> the rate at which shadow judging drew it.
        """
        self.remember(text, rules, verdicts)
        explored = explored or {}
        return [
            self.record(text, rule, verdict, explored.get(rule.rule_id))
            for rule, verdict in zip(rules, verdicts, strict=True)
        ]

    async def asettle(
        self,
        text: str,
        rules: Sequence[Rule],
        verdicts: Sequence[Verdict],
        explored: Mapping[str, float] | None = None,
    ) -> list[Verdict]:
        """Async `settle`."""
        await self.aremember(text, rules, verdicts)
        explored = explored or {}
        return [
            await self.arecord(text, rule, verdict, explored.get(rule.rule_id))
            for rule, verdict in zip(rules, verdicts, strict=True)
        ]

    def settle_pairs(
        self,
        judged: Sequence[tuple[str, Rule, Verdict]],
        explored: Mapping[tuple[str, str], float] | None = None,
    ) -> None:
        """`settle` for verdicts on many inputs at once (answers of a batch job).

        Args:
            judged: `(text, rule, verdict)` per judgment.
            explored: `(text, rule id)` -> the rate at which shadow judging drew it.
        """
        if self.cache is not None:
            stored = _stored(
                [self.key(text, rule) for text, rule, _ in judged],
                [verdict for *_, verdict in judged],
            )
            if stored:
                self.cache.mset(stored)
        explored = explored or {}
        for text, rule, verdict in judged:
            self.record(text, rule, verdict, explored.get((text, rule.rule_id)))

    def _keys(self, text: str, rules: Sequence[Rule]) -> list[str]:
        return [self.key(text, rule) for rule in rules]


def _hits(rules: Sequence[Rule], stored: Sequence[str | None]) -> dict[str, Verdict]:
    return {
        rule.rule_id: Verdict.model_validate_json(value).model_copy(
            update={"cached": True, "rule_id": rule.rule_id}
        )
        for rule, value in zip(rules, stored, strict=False)
        if value is not None
    }


def _stored(keys: Sequence[str], verdicts: Sequence[Verdict]) -> list[tuple[str, str]]:
    # Only successful verdicts: a failed one is judged again next time.
    return [
        (key, verdict.model_dump_json())
        for key, verdict in zip(keys, verdicts, strict=True)
        if not verdict.failed
    ]
