"""TAGRetriever: documents, order, knobs, empty results, callbacks, concurrency."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from langchain_tag import Rulebook, TAGRetriever
from langchain_tag.engine import MATCH_EVENT, rule_passes
from langchain_tag.errors import (
    JudgmentError,
    ModelNotConfiguredError,
    RulebookError,
    UnreliableMatchWarning,
)
from langchain_tag.learning import SQLiteVerdictLog, VerdictLogWarning
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook

if TYPE_CHECKING:
    from tests.unit_tests.conftest import HeldFakeChatModel

FIXTURES = Path(__file__).parent.parent / "fixtures"

# Triggers three PEP 8 rules: wildcard import, `== None`, bare `except:`.
SNIPPET = """\
from os.path import *

def load(path):
    try:
        return open(path).read()
    except:
        return None

if load("x") == None:
    print("missing")
"""
MATCHED = ["PEP8-IMPORT-WILDCARD", "PEP8-NONE-IDENTITY", "PEP8-BARE-EXCEPT"]


@pytest.fixture
def llm() -> RuleAwareFakeChatModel:
    return RuleAwareFakeChatModel()


@pytest.fixture
def retriever(pep8_rulebook: Rulebook, llm: RuleAwareFakeChatModel) -> TAGRetriever:
    return TAGRetriever(rulebook=pep8_rulebook, llm=llm)


def test_returns_rule_documents_in_rulebook_order(
    retriever: TAGRetriever, pep8_rulebook: Rulebook
) -> None:
    docs = retriever.invoke(SNIPPET)
    assert [d.id for d in docs] == MATCHED
    first = docs[0]
    rule = pep8_rulebook.get("PEP8-IMPORT-WILDCARD")
    assert rule is not None
    assert first.page_content == rule.action
    assert first.metadata["rule_id"] == rule.rule_id
    assert first.metadata["name"] == rule.name
    assert first.metadata["condition"] == rule.condition
    assert first.metadata["source_text"] == rule.source_text
    assert first.metadata["tags"] == ["imports"]
    assert first.metadata["source_document_id"] == "pep-0008"
    assert rule.source is not None
    assert first.metadata["source_start"] == rule.source.start
    assert first.metadata["relevance_score"] == 1.0


async def test_async_path_gives_the_same_documents(retriever: TAGRetriever) -> None:
    assert [d.id for d in await retriever.ainvoke(SNIPPET)] == MATCHED


def test_scores_order_the_documents(pep8_rulebook: Rulebook) -> None:
    # More confident about rules later in the rulebook.
    graded = RuleAwareFakeChatModel(
        confidence_by_rule={
            rule.rule_id: 0.55 + 0.05 * i for i, rule in enumerate(pep8_rulebook.rules)
        }
    )
    retriever = TAGRetriever(
        rulebook=pep8_rulebook,
        judge=ApplicabilityJudge(llm=graded, logprobs=True),
    )
    docs = retriever.invoke(SNIPPET)
    scores = [d.metadata["relevance_score"] for d in docs]
    assert scores == sorted(scores, reverse=True)
    assert [d.id for d in docs] == list(reversed(MATCHED))
    assert retriever.invoke(SNIPPET, score_threshold=0.8)[0].metadata["score"] >= 0.8
    assert len(retriever.invoke(SNIPPET, score_threshold=0.8)) < len(docs)


def test_k_caps_results_as_field_and_per_call(pep8_rulebook: Rulebook) -> None:
    llm = RuleAwareFakeChatModel()
    assert len(TAGRetriever(rulebook=pep8_rulebook, llm=llm, k=2).invoke(SNIPPET)) == 2
    retriever = TAGRetriever(rulebook=pep8_rulebook, llm=llm)
    assert [d.id for d in retriever.invoke(SNIPPET, k=1)] == MATCHED[:1]


def test_metadata_filters(retriever: TAGRetriever, llm: RuleAwareFakeChatModel) -> None:
    docs = retriever.invoke(SNIPPET, filter={"tags": "imports"})
    assert [d.id for d in docs] == ["PEP8-IMPORT-WILDCARD"]
    # Only the filtered rules were judged.
    assert llm.calls == 2
    docs = retriever.invoke(SNIPPET, filter={"tags": ["exceptions", "comparisons"]})
    assert [d.id for d in docs] == MATCHED[1:]
    docs = retriever.invoke(
        SNIPPET, filter=lambda rule: rule.rule_id.endswith("EXCEPT")
    )
    assert [d.id for d in docs] == ["PEP8-BARE-EXCEPT"]


def test_rule_passes_reads_fields_and_metadata(pep8_rulebook: Rulebook) -> None:
    rule = pep8_rulebook.rules[0].model_copy(update={"metadata": {"severity": "low"}})
    assert rule_passes(rule, {"source_document_id": "pep-0008"})
    assert rule_passes(rule, {"severity": ["low", "high"]})
    assert not rule_passes(rule, {"severity": "high"})
    assert not rule_passes(rule, {"tags": "nothing"})
    assert rule_passes(rule, None)


def test_empty_result_says_why(retriever: TAGRetriever) -> None:
    events: list[tuple[str, Any]] = []

    class Events(BaseCallbackHandler):
        def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
            events.append((name, data))

    assert retriever.invoke("x = 1", {"callbacks": [Events()]}) == []
    assert events[0][0] == MATCH_EVENT
    assert events[0][1]["empty_reason"] == (
        "no rule's condition is satisfied by the input (9 judged)"
    )
    assert retriever.match("x", filter={"tags": "nope"}).reason == (
        "the filter {'tags': 'nope'} excluded all 9 rules"
    )
    assert retriever.match(SNIPPET, k=0).reason == "k=0"
    empty = TAGRetriever(rulebook=Rulebook(), llm=RuleAwareFakeChatModel())
    assert empty.match("x").reason == "the rulebook has no rules"
    assert retriever.match(SNIPPET).reason is None


def test_match_reports_every_verdict(retriever: TAGRetriever) -> None:
    result = retriever.match(SNIPPET)
    assert [d.id for d in result.documents] == MATCHED
    assert len(result.verdicts) == 9
    assert [v.rule_id for v in result.verdicts if v.applies] == MATCHED
    assert result.candidates == result.total_rules == 9
    assert result.failed_rule_ids == []
    assert 0.5 < result.prefix_share < 1
    summary = result.summary()
    assert summary["matched_rule_ids"] == MATCHED
    assert summary["applicable"] == 3


def test_prefilter_shortlists_before_judging(
    pep8_rulebook: Rulebook, llm: RuleAwareFakeChatModel
) -> None:
    class Shortlist(BaseRetriever):
        ids: list[str]

        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            return [
                Document(page_content="", metadata={"rule_id": rule_id})
                for rule_id in self.ids
            ]

    retriever = TAGRetriever(
        rulebook=pep8_rulebook,
        llm=llm,
        prefilter=Shortlist(ids=["PEP8-BARE-EXCEPT", "PEP8-LAMBDA-ASSIGN", "R-GONE"]),
    )
    result = retriever.match(SNIPPET)
    assert [d.id for d in result.documents] == ["PEP8-BARE-EXCEPT"]
    assert result.candidates == 2
    assert llm.calls == 2


def test_failed_judgments_raise_by_default(pep8_rulebook: Rulebook) -> None:
    llm = RuleAwareFakeChatModel(faults={"PEP8-BARE-EXCEPT": [ValueError("boom")]})
    retriever = TAGRetriever(rulebook=pep8_rulebook, llm=llm)
    with pytest.raises(JudgmentError, match="PEP8-BARE-EXCEPT"):
        retriever.invoke(SNIPPET)


def test_failed_judgments_are_flagged_under_not_applicable(
    pep8_rulebook: Rulebook,
) -> None:
    llm = RuleAwareFakeChatModel(faults={"PEP8-BARE-EXCEPT": [ValueError("boom")]})
    judge = ApplicabilityJudge(llm=llm, on_error="not_applicable")
    retriever = TAGRetriever(rulebook=pep8_rulebook, judge=judge)
    with pytest.warns(UnreliableMatchWarning, match="PEP8-BARE-EXCEPT"):
        result = retriever.match(SNIPPET)
    assert [d.id for d in result.documents] == [MATCHED[0], MATCHED[1]]
    assert result.failed_rule_ids == ["PEP8-BARE-EXCEPT"]
    assert result.summary()["failed_rule_ids"] == ["PEP8-BARE-EXCEPT"]


def test_every_llm_call_nests_under_the_retriever_run(retriever: TAGRetriever) -> None:
    class Recorder(BaseCallbackHandler):
        def __init__(self) -> None:
            self.parents: dict[uuid.UUID, uuid.UUID | None] = {}
            self.retriever_runs: list[uuid.UUID] = []
            self.chat_runs: list[uuid.UUID] = []

        def on_retriever_start(
            self, serialized: Any, query: str, *, run_id: uuid.UUID, **kwargs: Any
        ) -> None:
            self.parents[run_id] = kwargs.get("parent_run_id")
            self.retriever_runs.append(run_id)

        def on_chain_start(
            self, serialized: Any, inputs: Any, *, run_id: uuid.UUID, **kwargs: Any
        ) -> None:
            self.parents[run_id] = kwargs.get("parent_run_id")

        def on_chat_model_start(
            self, serialized: Any, messages: Any, *, run_id: uuid.UUID, **kwargs: Any
        ) -> None:
            self.parents[run_id] = kwargs.get("parent_run_id")
            self.chat_runs.append(run_id)

    def root_of(recorder: Recorder, run_id: uuid.UUID) -> uuid.UUID:
        while (parent := recorder.parents.get(run_id)) is not None:
            run_id = parent
        return run_id

    for call in (retriever.invoke, lambda q, c: asyncio.run(retriever.ainvoke(q, c))):
        recorder = Recorder()
        assert isinstance(retriever.judge, ApplicabilityJudge)
        retriever.judge.cache = None  # every rule really calls the model
        call(SNIPPET, {"callbacks": [recorder]})
        assert len(recorder.chat_runs) == 9
        (retriever_run,) = recorder.retriever_runs
        assert {root_of(recorder, run) for run in recorder.chat_runs} == {retriever_run}


@pytest.mark.parametrize("max_concurrency", [2, 5])
@pytest.mark.parametrize("use_async", [False, True])
def test_batch_is_bounded_across_queries(
    pep8_rulebook: Rulebook,
    max_concurrency: int,
    overlapping: Callable[..., RuleAwareFakeChatModel],
    *,
    use_async: bool,
) -> None:
    llm = overlapping(max_concurrency)  # the bound is reached, whatever the speed
    retriever = TAGRetriever(
        rulebook=pep8_rulebook,
        judge=ApplicabilityJudge(llm=llm, cache=None),
        max_concurrency=max_concurrency,
    )
    queries = [SNIPPET, "x = 1", SNIPPET, "f = lambda: 0"]
    if use_async:
        results = asyncio.run(retriever.abatch(queries))
    else:
        results = retriever.batch(queries)
    assert llm.calls == 36
    assert llm.peak_in_flight == max_concurrency
    assert [d.id for d in results[0]] == MATCHED
    assert [d.id for d in results[2]] == MATCHED
    assert [d.id for d in results[3]] == ["PEP8-LAMBDA-ASSIGN"]


def test_from_rulebook_accepts_paths_and_objects(pep8_rulebook: Rulebook) -> None:
    llm = RuleAwareFakeChatModel()
    from_path = TAGRetriever.from_rulebook(
        FIXTURES / "pep8_rulebook.json", llm=llm, k=2
    )
    from_str = TAGRetriever.from_rulebook(str(FIXTURES / "pep8_rulebook.json"), llm=llm)
    from_obj = TAGRetriever.from_rulebook(pep8_rulebook, llm=llm)
    assert from_path.k == 2
    assert from_path.rulebook == from_obj.rulebook == from_str.rulebook
    judge = ApplicabilityJudge(llm=llm)
    assert TAGRetriever.from_rulebook(pep8_rulebook, judge=judge).judge is judge


def test_llm_and_judge_together_is_an_error(pep8_rulebook: Rulebook) -> None:
    llm = RuleAwareFakeChatModel()
    with pytest.raises(ValueError, match="either llm= or judge="):
        TAGRetriever(rulebook=pep8_rulebook, llm=llm, judge=ApplicabilityJudge(llm=llm))


def test_without_a_model_the_error_lists_every_option(
    pep8_rulebook: Rulebook, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TAG_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelNotConfiguredError) as caught:
        TAGRetriever.from_rulebook(pep8_rulebook)
    message = str(caught.value)
    for option in ("llm=", "OPENAI_API_KEY", "OPENAI_BASE_URL", "TAG_MODEL"):
        assert option in message


def test_missing_rulebook_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="file not found"):
        TAGRetriever.from_rulebook(tmp_path / "nope.json", llm=RuleAwareFakeChatModel())


# --- options, ids and input checked before anything is judged ---------------------

TRIGGERS = "trigger-000 trigger-001 trigger-002"


def trigger_retriever(**kwargs: Any) -> tuple[TAGRetriever, RuleAwareFakeChatModel]:
    model = RuleAwareFakeChatModel()
    return TAGRetriever(rulebook=trigger_rulebook(5), llm=model, **kwargs), model


# --- per-call options are checked before anything is judged ---------------------------


def test_every_applicable_rule_comes_back_without_k() -> None:
    tag, _ = trigger_retriever()
    assert len(tag.invoke(TRIGGERS)) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # Before: kept[:-1] silently dropped the last of three matches.
        ({"k": -1}, "k must be None or an integer >= 0"),
        # Before: a slicing TypeError after all five rules had been judged.
        ({"k": "2"}, "k must be None or an integer >= 0"),
        ({"k": 1.5}, "k must be None or an integer >= 0"),
        ({"k": True}, "k must be None or an integer >= 0"),
        ({"score_threshold": 1.5}, r"score_threshold must be .* in \[0, 1\]"),
        ({"score_threshold": -0.1}, r"score_threshold must be .* in \[0, 1\]"),
    ],
)
async def test_bad_per_call_options_fail_before_any_model_call(
    options: dict[str, Any], message: str
) -> None:
    tag, model = trigger_retriever()
    with pytest.raises(ValueError, match=message):
        tag.invoke(TRIGGERS, **options)
    with pytest.raises(ValueError, match=message):
        await tag.ainvoke(TRIGGERS, **options)
    with pytest.raises(ValueError, match=message):
        tag.match(TRIGGERS, **options)
    assert model.calls == 0


def test_unknown_per_call_keywords_are_refused() -> None:
    # Before: silently ignored, so a typo (`treshold`) changed nothing.
    tag, model = trigger_retriever()
    with pytest.raises(TypeError, match=r"unknown keyword argument.*treshold"):
        tag.invoke(TRIGGERS, treshold=0.5)
    assert model.calls == 0


# --- ids checked at use ---------------------------------------------------------------


def test_a_duplicate_id_added_after_construction_is_refused() -> None:
    # Before: the dict of ids kept the later rule, so the rule that matched was
    # reported with the other rule's name and action.
    tag, model = trigger_retriever()
    first = tag.rulebook.rules[0]
    tag.rulebook.rules.append(
        first.model_copy(update={"condition": "never", "action": "Do the other"})
    )
    with pytest.raises(RulebookError, match=r"'R-000' is used by more than one rule"):
        tag.invoke(TRIGGERS)
    assert model.calls == 0


# --- the run config's max_concurrency -------------------------------------------------


def six_rules_on(model: RuleAwareFakeChatModel) -> TAGRetriever:
    judge = ApplicabilityJudge(llm=model, cache=None)  # every call reaches the model
    return TAGRetriever(rulebook=trigger_rulebook(6), judge=judge)


def test_the_run_configs_max_concurrency_is_honoured(
    overlapping: Callable[..., RuleAwareFakeChatModel], held_llm: HeldFakeChatModel
) -> None:
    # Before: `config={"max_concurrency": 1}` was ignored: 8 judgments in flight.
    # A bound above one is reached (calls wait until that many are in flight); a
    # bound of one is kept while each call is held until the test has seen it alone.
    model = overlapping(2)
    six_rules_on(model).invoke(TRIGGERS)
    assert model.peak_in_flight > 1  # the retriever's own bound is 8

    tag = six_rules_on(held_llm)
    held_llm.one_at_a_time(lambda: tag.invoke(TRIGGERS, config={"max_concurrency": 1}))
    assert held_llm.peak_in_flight == 1

    held_llm.reset()
    held_llm.one_at_a_time(
        lambda: tag.batch([TRIGGERS, "trigger-004"], config={"max_concurrency": 1})
    )
    assert held_llm.peak_in_flight == 1
    assert held_llm.calls == 12

    model = overlapping(2)
    six_rules_on(model).invoke(TRIGGERS, config={"max_concurrency": 2})
    assert model.peak_in_flight == 2


def test_the_run_configs_max_concurrency_is_honoured_async(
    held_llm: HeldFakeChatModel,
) -> None:
    tag = six_rules_on(held_llm)
    held_llm.one_at_a_time(
        lambda: asyncio.run(
            tag.abatch([TRIGGERS, "trigger-004"], config={"max_concurrency": 1})
        )
    )
    assert held_llm.peak_in_flight == 1
    assert held_llm.calls == 12


# --- rough edges ----------------------------------------------------------------------


@pytest.mark.parametrize("rulebook", [Rulebook(), trigger_rulebook(2)])
def test_a_non_string_query_gets_a_clear_type_error(rulebook: Rulebook) -> None:
    # Before, with nothing to judge: TypeError: unhashable type: 'slice'.
    tag = TAGRetriever(rulebook=rulebook, llm=RuleAwareFakeChatModel())
    with pytest.raises(TypeError, match="The query must be a str, got dict"):
        tag.invoke({"question": "x"})  # type: ignore[arg-type]


def test_a_lone_surrogate_is_refused_with_the_fix() -> None:
    # Before: UnicodeEncodeError deep inside the cache key's hashing.
    tag, model = trigger_retriever()
    broken = "trigger-000 \udcff"
    with pytest.raises(ValueError, match=r"lone surrogate '\\udcff' at position 12"):
        tag.invoke(broken)
    with pytest.raises(ValueError, match="lone surrogate"):
        ApplicabilityJudge(llm=model).invoke((broken, tag.rulebook.rules[0]))
    assert model.calls == 0


def test_score_threshold_without_scores_warns_once() -> None:
    # Before: the threshold silently did nothing (unscored verdicts rank as 1.0).
    tag, _ = trigger_retriever(score_threshold=0.5)
    with pytest.warns(UserWarning, match="no effect on verdicts without a score"):
        assert len(tag.invoke(TRIGGERS)) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tag.invoke(TRIGGERS)


# --- the verdict log is a side channel ----------------------------------------------


def test_a_locked_verdict_log_loses_neither_the_retrieval_nor_a_verdict(
    tmp_path: Path,
) -> None:
    path = tmp_path / "verdicts.sqlite"
    log = SQLiteVerdictLog(path, timeout=0.01)
    model = RuleAwareFakeChatModel()
    judge = ApplicabilityJudge(
        llm=model, verdict_log=log, on_error="not_applicable", cache=None
    )
    tag = TAGRetriever(rulebook=trigger_rulebook(5), judge=judge)
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.warns(VerdictLogWarning, match=str(path.name)):
            assert [d.id for d in tag.invoke(TRIGGERS)] == ["R-000", "R-001", "R-002"]
        assert log.pending == 5
    finally:
        holder.rollback()
        holder.close()
    assert [d.id for d in tag.invoke("trigger-004")] == ["R-004"]
    assert log.pending == 0
    assert len(log) == 10  # the five paid while locked, then the five after
    assert model.calls == 10
