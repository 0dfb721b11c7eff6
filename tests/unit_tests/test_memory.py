"""`VerdictMemory`: one lookup per read, successful verdicts cached, all logged."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.matching import Verdict
from langchain_tag.matching.memory import VerdictMemory
from langchain_tag.rules import Rule
from langchain_tag.testing import trigger_rulebook

RULES = trigger_rulebook(3).rules


class Store(InMemoryVerdictCache):
    def __init__(self) -> None:
        super().__init__()
        self.trips: list[str] = []

    def mget(self, keys: Sequence[str]) -> list[str | None]:
        self.trips.append("mget")
        return super().mget(keys)

    def mset(self, key_value_pairs: Sequence[tuple[str, str]]) -> None:
        self.trips.append("mset")
        super().mset(key_value_pairs)


class Log:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, bool, dict[str, Any]]] = []

    def record(self, text: str, rule: Rule, verdict: Verdict, **fields: Any) -> None:
        self.records.append((text, rule.rule_id, verdict.failed, fields))

    async def arecord(
        self, text: str, rule: Rule, verdict: Verdict, **fields: Any
    ) -> None:
        self.record(text, rule, verdict, **fields)


def memory(store: Store, log: Log) -> VerdictMemory:
    return VerdictMemory(
        store,
        log,
        key=lambda text, rule: f"{text}|{rule.rule_id}",
        log_fields=lambda rule, explore: {"model": "m", "explore": explore},
    )


def test_settle_caches_successes_in_one_write_and_logs_every_judgment() -> None:
    store, log = Store(), Log()
    remembered = memory(store, log)
    verdicts = [
        Verdict(rule_id="R-000", applies=True, score=0.9),
        Verdict(rule_id="R-001", applies=False, error="timed out"),
        Verdict(rule_id="R-002", applies=False),
    ]
    settled = remembered.settle("t", RULES, verdicts, {"R-002": 0.05})
    assert settled == verdicts
    assert store.trips == ["mset"]
    assert [r[1:3] for r in log.records] == [
        ("R-000", False),
        ("R-001", True),
        ("R-002", False),
    ]
    assert log.records[2][3] == {"model": "m", "explore": 0.05}
    known = remembered.recall("t", RULES)
    assert store.trips == ["mset", "mget"]
    assert sorted(known) == ["R-000", "R-002"]  # the failed one is judged again
    assert all(v.cached for v in known.values())
    assert known["R-000"].score == 0.9


def test_async_and_many_inputs_at_once() -> None:
    store, log = Store(), Log()
    remembered = memory(store, log)
    judged = [
        (text, rule, Verdict(rule_id=rule.rule_id, applies=True))
        for text in ("a", "b")
        for rule in RULES
    ]
    remembered.settle_pairs(judged, {("b", "R-001"): 0.1})
    assert store.trips == ["mset"]
    assert len(log.records) == 6
    assert [r[3]["explore"] for r in log.records].count(0.1) == 1
    known = asyncio.run(remembered.arecall("b", RULES))
    assert sorted(known) == ["R-000", "R-001", "R-002"]


def test_nothing_to_remember_costs_no_round_trip() -> None:
    store, log = Store(), Log()
    remembered = memory(store, log)
    remembered.settle(
        "t", RULES[:1], [Verdict(rule_id="R-000", applies=False, error="x")]
    )
    assert remembered.recall("t", []) == {}
    assert store.trips == []
