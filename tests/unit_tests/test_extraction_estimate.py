"""`estimate_extraction` and `tag extract --estimate`: the cost before any call.

The estimate is a dry run of the extraction on a metering stand-in; it is checked
against runs of the same documents under the extraction fake, each request counted
with the estimate's own counter: phase 1 must match exactly, phases 2-3 too on
text whose every sentence the fake reads as the estimate does. Phases 4-5 are
estimates: phase 4 covers rules sharing a few large tags, and states the most calls
rules spread over small tags can make.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from pydantic import Field

from langchain_tag import cli
from langchain_tag.extraction import ExtractionReport, extract_rules
from langchain_tag.extraction.estimate import (
    ExtractionEstimate,
    estimate_extraction,
)
from langchain_tag.extraction.pairs import (
    DEFAULT_MAX_PAIRS,
    comparison_calls_bound,
    packed_groups_bound,
)
from langchain_tag.testing import ExtractionFakeChatModel
from langchain_tag.usage import PromptCaching, TokenPrices, token_counter

COUNTER = token_counter()
PHASE_MARKERS = {
    "spans": "You find the normative statements",
    "atomics": "You split normative statements",
    "rules": "You turn atomic normative units",
    "relations": "You compare operational rules",
}
ROWS = ("spans", "atomics", "rules", "relations", "recovery")

TOPICS = (
    "the salary of {n} players when the team is over the cap",
    "a trade bonus of {n} percent before the trade deadline",
    "the contract of season {n} after the draft",
    "the salary cap hold for pick {n} unless the league approves it",
)
GUIDE = "\n\n".join(
    f"## Article {part}\n\nThis article was agreed in {2000 + part}.\n\n"
    + " ".join(
        f"A team {('must', 'should', 'must never')[n % 3]} report "
        f"{TOPICS[(part + n) % 4].format(n=part * 10 + n)}."
        for n in range(5)
    )
    for part in range(12)
)
"""60 rules: every normative sentence has a cue word both the fake and the
estimate read, no "; " (the fake would split it), one sentence of background a
section."""


class RecordingFake(ExtractionFakeChatModel):
    """The extraction fake, keeping the messages of every call."""

    received: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def measured(model: RecordingFake) -> dict[str, Counter[str]]:
    """Calls and input tokens per prompt kind, counted as the estimate counts."""
    found: dict[str, Counter[str]] = {}
    for messages in model.received:
        system = str(messages[0].content)
        kind = next(k for k, marker in PHASE_MARKERS.items() if marker in system)
        row = found.setdefault(kind, Counter())
        row["calls"] += 1
        row["input_tokens"] += COUNTER.messages(messages)
    return found


def run_and_estimate(
    text: str, **settings: Any
) -> tuple[ExtractionReport, dict[str, Counter[str]], ExtractionEstimate]:
    doc = Document(page_content=text, metadata={"source": "guide.md"})
    model = RecordingFake()
    rulebook = extract_rules(
        [doc], llm=model, domain="NBA", checkpoint=None, **settings
    )
    report = ExtractionReport.model_validate(rulebook.diagnostics)
    found = estimate_extraction([doc], domain="NBA", **settings)
    return report, measured(model), found


def test_phase_one_is_exact_and_phases_two_and_three_match_a_faithful_model() -> None:
    report, sent, found = run_and_estimate(GUIDE, max_section_tokens=80)
    assert found.sections == report.sections > 1
    assert found.normative_sentences == found.rules == report.rules == 60
    for row in ("spans", "atomics", "rules"):
        phase = found.phases[row]
        assert (phase.calls, phase.input_tokens) == (
            sent[row]["calls"],
            sent[row]["input_tokens"],
        ), row
        assert phase.output_tokens > 0
    assert found.phases["spans"].basis == "exact"
    assert found.phases["atomics"].basis == found.phases["rules"].basis == "estimated"


@pytest.mark.parametrize("max_pairs", [None, DEFAULT_MAX_PAIRS, 40, 3])
def test_phase_four_and_recovery_are_estimates(max_pairs: int | None) -> None:
    report, sent, found = run_and_estimate(
        GUIDE, max_section_tokens=80, max_pairs=max_pairs, rules_per_comparison=8
    )
    relations = found.phases["relations"]
    assert relations.basis == found.phases["recovery"].basis == "estimated"
    # The guide's rules share four large tags: the estimate covers them.
    assert relations.calls >= sent["relations"]["calls"] > 0
    worst = comparison_calls_bound(found.rule_pairs, max_pairs)
    assert sent["relations"]["calls"] <= worst
    assert f"at most {worst:,} calls (3 x {found.pairs:,} pairs" in relations.how
    # Priced from the stand-in's rules, not the fake's wording: within 2% under
    # the cap of 40 (the same pairs in fewer, fuller calls), above otherwise.
    assert relations.input_tokens >= 0.95 * sent["relations"]["input_tokens"]
    assert found.rule_pairs == 60 * 59 // 2 >= report.candidate_pairs
    assert found.pairs == min(max_pairs or found.rule_pairs, found.rule_pairs)
    assert found.max_pairs == max_pairs
    recovery = found.phases["recovery"]
    assert recovery.calls == found.phases["atomics"].calls  # a call a section
    assert recovery.calls >= report.phases["recovery"].calls
    assert f"at most one call a section ({found.sections})" in recovery.how


def test_the_cap_bounds_the_estimate_of_a_large_document() -> None:
    large = "\n\n".join([GUIDE] * 5)
    capped = estimate_extraction([large], max_pairs=DEFAULT_MAX_PAIRS)
    uncapped = estimate_extraction([large], max_pairs=None)
    assert capped.rules == uncapped.rules == 300
    assert capped.pairs == DEFAULT_MAX_PAIRS < uncapped.pairs == 300 * 299 // 2
    # The run's plan as if of one tag: the 5,000 most similar pairs (here copies
    # of a rule) packed into calls of 16 rules, at most 1 + 4,999 // 8; uncapped,
    # every pair of 38 chunks of 8.
    assert 0 < capped.phases["relations"].calls <= packed_groups_bound(5000, 16)
    assert uncapped.phases["relations"].calls == 38 * 37 // 2
    how = capped.phases["relations"].how
    assert "the 5,000 most similar (max_pairs=5000, --max-pairs)" in how
    assert "at most 15,000 calls" in how
    assert "over the cap, at most 5,000/8 plus one per tag holding a chosen pair" in how
    assert "over the cap" not in uncapped.phases["relations"].how


IMPORTS = (
    "Imports must be on separate lines. Imports should be one per line.\n\n"
    "Imports must come first. Lines must stay short."
)
"""Four rules the fake tags [imports, layout] x 2, [imports], [layout]."""
SALARIES = "\n\n".join(
    " ".join(f"A team must report the salary of player {10 * p + n}." for n in range(5))
    for p in range(8)
)
"""40 rules, all of them tagged `salary` alone by the fake."""


def test_rules_over_small_tags_make_more_calls_than_estimated_within_the_worst() -> (
    None
):
    report, sent, found = run_and_estimate(IMPORTS)
    assert found.rules == report.rules == 4
    relations = found.phases["relations"]
    # As if all four shared one tag: one call. Two tags of three rules: two.
    assert (relations.calls, sent["relations"]["calls"]) == (1, 2)
    assert report.candidate_pairs == 5
    assert relations.basis == "estimated"
    text = found.format()
    row = next(line for line in text.splitlines() if line.startswith("relations "))
    assert row.split()[1:3] == ["~1", f"~{relations.input_tokens:,}"]
    assert "≤" not in text
    assert (
        "Rules spread over many small tags make more, smaller calls: at most 18 "
        in (relations.how)
    )
    assert sent["relations"]["calls"] <= 18


@pytest.mark.parametrize("max_pairs", [None, 100])
def test_rules_sharing_one_tag_stay_within_the_estimate(max_pairs: int | None) -> None:
    report, sent, found = run_and_estimate(
        SALARIES, max_section_tokens=80, rules_per_comparison=8, max_pairs=max_pairs
    )
    assert found.rules == report.rules == 40
    assert report.candidate_pairs == 40 * 39 // 2
    relations = found.phases["relations"]
    assert relations.calls >= sent["relations"]["calls"] > 1
    # Tokens are priced from the estimate's rules, not the model's wording: here
    # 4% under uncapped (full calls of 8), above over the cap (smaller calls).
    assert relations.input_tokens >= 0.9 * sent["relations"]["input_tokens"]


def test_skipped_phases_cost_nothing_and_their_stand_ins_are_exact() -> None:
    report, sent, found = run_and_estimate(
        GUIDE, max_section_tokens=80, skip_phases=[1, 2, 3]
    )
    assert [found.phases[row].basis for row in ROWS] == [
        "skipped",
        "skipped",
        "skipped",
        "exact",
        "skipped",
    ]
    assert found.phases["relations"].calls == sent["relations"]["calls"]
    assert found.phases["relations"].input_tokens == sent["relations"]["input_tokens"]
    assert found.rules == report.rules
    assert sum(p.calls for r, p in found.phases.items() if r != "relations") == 0


def test_prices_and_cached_tokens() -> None:
    prices = TokenPrices(input=0.15, output=0.60)
    found = estimate_extraction([GUIDE], prices=prices)
    total = found.usage
    assert total.calls == sum(p.calls for p in found.phases.values())
    listed = prices.cost(total)
    assert listed is not None
    assert found.dollars() == pytest.approx(listed)
    assert found.dollars(batch=True) == pytest.approx(listed / 2)
    text = found.format()
    assert "Price: ~$" in text  # phases 2-5 are estimates
    assert "at 50% off (flex processing)" in text
    # A provider caching from 64 tokens serves the shared system prompts.
    cached = estimate_extraction([GUIDE], caching=PromptCaching(min_tokens=64))
    assert cached.phases["spans"].cached_input_tokens > 0
    assert cached.phases["relations"].cached_input_tokens > 0
    assert cached.phases["recovery"].cached_input_tokens == 0  # a stated case: none
    none = estimate_extraction([GUIDE], caching=None)
    assert none.usage.cached_input_tokens == 0
    assert "none assumed" in none.format()


def test_the_token_counter_is_the_one_of_usage() -> None:
    found = estimate_extraction([GUIDE])
    assert found.token_counter == COUNTER.name


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one document"):
        estimate_extraction([])
    with pytest.raises(ValueError, match="is empty"):
        estimate_extraction(["  \n"])
    with pytest.raises(ValueError, match="max_pairs"):
        estimate_extraction([GUIDE], max_pairs=0)
    with pytest.raises(ValueError, match="phase numbers 1-5"):
        estimate_extraction([GUIDE], skip_phases=[6])


# --- tag extract --estimate -----------------------------------------------------------


@pytest.fixture
def tag_extract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    """Run `tag extract guide.md ARGS` with no API key and no model allowed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    Path("guide.md").write_text(GUIDE, encoding="utf-8")

    def no_model(**_: Any) -> None:
        pytest.fail("--estimate made a model")

    monkeypatch.setattr("langchain_tag.models.default_chat_model", no_model)

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["extract", "guide.md", *argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_tag_extract_estimate_prints_each_phase_and_writes_nothing(
    tag_extract: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    code, out, err = tag_extract("--estimate", "--domain", "NBA", "-o", "rules.json")
    assert (code, err) == (0, "")
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for row in (*ROWS, "total"):
        assert row in rows, row
    assert rows["relations"].split()[1].startswith("~")
    assert "no model was called" in out
    assert "Price: no prices given (tag extract: --price-in and --price-out" in out
    assert "--estimate: nothing was written to rules.json." in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guide.md"]


def test_tag_extract_estimate_prices_with_the_shared_options(
    tag_extract: Callable[..., tuple[int, str, str]],
) -> None:
    code, out, _ = tag_extract(
        "--estimate", "--price-in", "0.15", "--price-out", "0.60", "--max-pairs", "7"
    )
    assert code == 0
    assert "at list prices" in out
    assert "the 7 most similar (max_pairs=7, --max-pairs)" in out
    code, _, err = tag_extract("-o", "rules.json", "--price-in", "0.15")
    assert code == 2
    assert "--price-in and --price-out go together, with --estimate" in err


@pytest.mark.parametrize("bad", ["0", "-5", "many", "1.5"])
def test_a_bad_max_pairs_is_a_one_line_error(
    bad: str, tag_extract: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    code, out, err = tag_extract("--estimate", "--max-pairs", bad)
    assert (code, out) == (2, "")
    assert err == (
        "tag extract: error: --max-pairs must be an integer >= 1 (rule pairs phase "
        f"4 compares at most), or none for no cap, got {bad!r}.\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guide.md"]


def test_max_pairs_none_lifts_the_cap(
    tag_extract: Callable[..., tuple[int, str, str]],
) -> None:
    code, out, _ = tag_extract("--estimate", "--max-pairs", "none")
    assert code == 0
    assert "most similar" not in out


def test_tag_extract_without_output_asks_for_it_or_an_estimate(
    tag_extract: Callable[..., tuple[int, str, str]],
) -> None:
    code, out, err = tag_extract()
    assert (code, out) == (2, "")
    assert err == (
        "tag extract: error: -o/--output is required: the rulebook JSON to write "
        "(or pass --estimate to see what the extraction would cost first).\n"
    )


def test_the_help_names_the_default_cap(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["extract", "--help"])
    assert f"(default {DEFAULT_MAX_PAIRS}:" in " ".join(capsys.readouterr().out.split())


def test_a_capped_run_reports_its_skipped_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("guide.md").write_text(GUIDE, encoding="utf-8")
    model = ExtractionFakeChatModel()
    monkeypatch.setattr("langchain_tag.models.default_chat_model", lambda **_: model)
    argv = ["extract", "guide.md", "-o", "rules.json", "--no-checkpoint", "-q"]
    assert cli.main([*argv, "--max-pairs", "20"]) == 0
    out = capsys.readouterr().out
    assert "skipped by max_pairs=20 (--max-pairs); the most similar kept" in out
    report = ExtractionReport.model_validate(
        json.loads(Path("rules.json").read_text())["diagnostics"]
    )
    assert report.max_pairs == 20
    assert report.pairs_skipped == report.candidate_pairs - report.pairs_compared > 0
