"""MatchEngine: the steps every face runs, and the parity of the retriever and graph."""

from __future__ import annotations

import copy
import math
import os
import pickle
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import (
    BaseCallbackHandler,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from langchain_tag import Rule, Rulebook, TAGRetriever, query_graph
from langchain_tag.engine import (
    MatchEngine,
    MatchOptions,
    MatchResult,
    check_filter,
    rule_passes,
)
from langchain_tag.errors import RulebookPathError, UnreliableMatchWarning
from langchain_tag.learning import (
    LabelledExample,
    LearnedPrefilter,
    SQLiteVerdictLog,
)
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.matching.prefilters import build_prefilter
from langchain_tag.models import CallRetry
from langchain_tag.query_graph import QueryContext, build_query_graph
from langchain_tag.testing import RuleAwareFakeChatModel, trigger_rulebook
from langchain_tag.usage import PromptCaching, TokenUsage, UsageCounter


def tagged_rulebook(n: int = 12) -> Rulebook:
    """Rule i applies to inputs containing `trigger-<iii>`; tagged even or odd."""
    return Rulebook(
        rules=[
            rule.model_copy(
                update={
                    "tags": ("even" if i % 2 == 0 else "odd",),
                    "metadata": {"team": "a" if i < n // 2 else "b"},
                }
            )
            for i, rule in enumerate(trigger_rulebook(n).rules)
        ]
    )


def text_for(*numbers: int) -> str:
    return "input with " + " ".join(f"trigger-{i:03d}" for i in numbers)


INPUTS = [text_for(0, 2, 3), text_for(4), text_for(1, 6, 8, 10), text_for(11)]


class ShortlistPrefilter(BaseRetriever):
    """A similarity prefilter stand-in: the same shortlist for every query."""

    rule_ids: list[str]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [
            Document(page_content="", metadata={"rule_id": rule_id})
            for rule_id in self.rule_ids
        ]


def comparable(result: MatchResult) -> dict[str, Any]:
    return result.model_dump(exclude={"elapsed_seconds"})


# --- parity: one engine, two faces ----------------------------------------------------


def face_doubles(
    tmp_path: Path, name: str
) -> tuple[RuleAwareFakeChatModel, SQLiteVerdictLog]:
    """A judge whose answers on R-003 alone cannot be read, and an empty log."""
    model = RuleAwareFakeChatModel(faults={"R-003": ["I cannot say."] * 100})
    return model, SQLiteVerdictLog(tmp_path / f"{name}.sqlite")


def judged_by_retriever(
    rulebook: Rulebook,
    model: RuleAwareFakeChatModel,
    log: SQLiteVerdictLog,
    **options: Any,
) -> list[MatchResult]:
    prefilter = options.pop("prefilter", None)
    judge = ApplicabilityJudge(
        llm=model,
        rules_per_call=options.pop("rules_per_call", 1),
        on_error="not_applicable",
        verdict_log=log,
        cache=None,
    )
    retriever = TAGRetriever(
        rulebook=rulebook, judge=judge, prefilter=prefilter, **options
    )
    return [retriever.match(text) for text in INPUTS]


def judged_by_graph(
    rulebook: Rulebook,
    model: RuleAwareFakeChatModel,
    log: SQLiteVerdictLog,
    **options: Any,
) -> list[MatchResult]:
    context = QueryContext(
        judge_model=model,
        executor_model=RuleAwareFakeChatModel(),
        on_error="not_applicable",
        verdict_log=log,
        **options,
    )
    graph = build_query_graph()
    data = rulebook.model_dump(mode="json")
    return [
        graph.invoke({"query": text, "rulebook": data}, context=context)["result"]
        for text in INPUTS
    ]


PARITY_WARNINGS = pytest.mark.filterwarnings(
    "ignore::langchain_tag.matching.UnreliableMatchWarning",
    "ignore:score_threshold=:UserWarning",
)


@PARITY_WARNINGS
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"filter": {"tags": "even"}, "k": 2},
        {"rules_per_call": 3, "max_concurrency": 2},
        {"prefilter": "shortlist", "score_threshold": 0.5, "filter": {"team": "a"}},
    ],
    ids=["plain", "filter-k", "batched", "prefilter"],
)
def test_retriever_and_graph_agree(tmp_path: Path, options: dict[str, Any]) -> None:
    rulebook = tagged_rulebook()
    results = {}
    calls = {}
    logs = {}
    for face, run in (("retriever", judged_by_retriever), ("graph", judged_by_graph)):
        chosen = dict(options)
        if chosen.get("prefilter") == "shortlist":
            chosen["prefilter"] = ShortlistPrefilter(
                rule_ids=["R-000", "R-002", "R-003", "R-004", "R-010", "R-011"]
            )
        model, log = face_doubles(tmp_path, face)
        results[face] = run(rulebook, model, log, **chosen)
        calls[face] = sorted(model.prompts)
        logs[face] = [
            (r.rule_id, r.applies, r.error is not None)
            for r in sorted(log.records(), key=lambda r: (r.text, r.rule_id))
        ]
    assert [comparable(r) for r in results["retriever"]] == [
        comparable(r) for r in results["graph"]
    ]
    assert calls["retriever"] == calls["graph"]
    assert calls["retriever"], "the fake judge was called"
    assert logs["retriever"] == logs["graph"]
    # The failing rule is flagged, never a silent NO.
    failed = {rule_id for r in results["graph"] for rule_id in r.failed_rule_ids}
    assert failed <= {"R-003"}


def fitted_prefilter(rulebook: Rulebook) -> LearnedPrefilter:
    """A learned prefilter trained on the fake's ground truth over many inputs."""
    examples = [
        LabelledExample(
            text_for(i, (i + 5) % 12),
            rule.rule_id,
            rule.rule_id in {f"R-{i:03d}", f"R-{(i + 5) % 12:03d}"},
        )
        for i in range(12)
        for _ in range(2)
        for rule in rulebook.rules
    ]
    prefilter = LearnedPrefilter(rulebook, min_examples=2, min_df=1)
    prefilter.fit(examples)
    return prefilter


@PARITY_WARNINGS
def test_retriever_and_graph_agree_with_a_learned_prefilter(tmp_path: Path) -> None:
    rulebook = tagged_rulebook()
    results = {}
    calls = {}
    for face, run in (("retriever", judged_by_retriever), ("graph", judged_by_graph)):
        model, log = face_doubles(tmp_path, face)
        results[face] = run(
            rulebook, model, log, prefilter=fitted_prefilter(rulebook), explore=0.5
        )
        calls[face] = sorted(model.prompts)
    assert [comparable(r) for r in results["retriever"]] == [
        comparable(r) for r in results["graph"]
    ]
    assert calls["retriever"] == calls["graph"]
    last = results["graph"][-1]
    assert last.recall_estimate is not None
    assert sum(len(r.explored_rule_ids) for r in results["graph"]) > 0


@PARITY_WARNINGS
@pytest.mark.parametrize("name", ["bm25:3", "learned:model.npz"])
def test_a_prefilter_named_in_the_graph_context_acts_as_the_object(
    name: str, tmp_path: Path
) -> None:
    # A JSON context over a server cannot carry a prefilter object: its name does.
    rulebook = tagged_rulebook()
    fitted_prefilter(rulebook).save(tmp_path / "model.npz")
    given = (
        build_prefilter(rulebook, "bm25", 3)
        if name.startswith("bm25")
        else LearnedPrefilter.load(tmp_path / "model.npz", rulebook)
    )
    results = {}
    calls = {}
    for face in ("object", "name"):
        model, log = face_doubles(tmp_path, face)
        context = QueryContext(
            judge_model=model,
            executor_model=RuleAwareFakeChatModel(),
            on_error="not_applicable",
            verdict_log=log,
            prefilter=given if face == "object" else name,
            explore=0.0,
        )
        graph = build_query_graph(rulebook_dir=tmp_path)
        data = rulebook.model_dump(mode="json")
        results[face] = [
            graph.invoke({"query": text, "rulebook": data}, context=context)["result"]
            for text in INPUTS
        ]
        calls[face] = sorted(model.prompts)
    assert [comparable(r) for r in results["object"]] == [
        comparable(r) for r in results["name"]
    ]
    assert calls["object"] == calls["name"]
    judged = sum(r.candidates for r in results["name"])
    assert judged < len(rulebook.rules) * len(INPUTS)  # the name did shortlist


@PARITY_WARNINGS
def test_a_named_prefilter_is_built_once_for_the_runs_that_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over a server each run has a context of its own: the prefilter outlives it.
    rulebook = tagged_rulebook()
    fitted_prefilter(rulebook).save(tmp_path / "model.npz")
    built: list[str] = []
    build = query_graph.PrefilterName.build

    def counted(
        self: query_graph.PrefilterName, rules: list[Rule], files: Any
    ) -> BaseRetriever:
        built.append(self.kind)
        return build(self, rules, files)

    monkeypatch.setattr(query_graph.PrefilterName, "build", counted)
    monkeypatch.setattr(query_graph, "_BUILT_PREFILTERS", OrderedDict())
    graph = build_query_graph(rulebook_dir=tmp_path)
    data = rulebook.model_dump(mode="json")

    def run(name: str) -> None:
        context = QueryContext(
            judge_model=RuleAwareFakeChatModel(),
            executor_model=RuleAwareFakeChatModel(),
            prefilter=name,
        )
        graph.invoke({"query": text_for(0), "rulebook": data}, context=context)

    for name in ("bm25:3", "bm25:3", "learned:model.npz", "learned:model.npz"):
        run(name)
    assert built == ["bm25", "learned"]
    retrained = fitted_prefilter(rulebook)
    retrained.save(tmp_path / "model.npz")
    os.utime(tmp_path / "model.npz", ns=(1, 1))  # a new file, whatever the clock
    run("learned:model.npz")
    assert built == ["bm25", "learned", "learned"]


def test_a_prefilter_name_is_checked_before_any_call(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'hybrid:0'.*'bm25:N'.*'learned:FILE.npz'"):
        QueryContext(prefilter="hybrid:0")
    model = RuleAwareFakeChatModel()
    served = build_query_graph(rulebook_dir=None)
    with pytest.raises(RulebookPathError):
        served.invoke(
            {
                "query": text_for(0),
                "rulebook": tagged_rulebook().model_dump(mode="json"),
            },
            context=QueryContext(judge_model=model, prefilter="learned:/etc/hostname"),
        )
    assert model.calls == 0


# --- steps ----------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "   \n\t "])
def test_blank_input_costs_no_judgment(query: str) -> None:
    model = RuleAwareFakeChatModel()
    engine = MatchEngine(ApplicabilityJudge(llm=model))
    result = engine.match(query, tagged_rulebook().rules)
    assert result.documents == []
    assert result.verdicts == []
    assert result.candidates == 0
    assert result.reason == "the input is empty or blank: nothing to judge"
    assert model.calls == 0


def test_blank_input_through_the_retriever_returns_nothing() -> None:
    model = RuleAwareFakeChatModel()
    retriever = TAGRetriever(rulebook=tagged_rulebook(), llm=model)
    assert retriever.invoke("  ") == []
    assert model.calls == 0


def test_unknown_filter_key_is_refused_naming_the_known_ones() -> None:
    rules = tagged_rulebook().rules
    with pytest.raises(ValueError, match=r"'tag'.*Known keys:.*tags.*team"):
        check_filter({"tag": "even"}, rules)
    model = RuleAwareFakeChatModel()
    retriever = TAGRetriever(rulebook=tagged_rulebook(), llm=model)
    with pytest.raises(ValueError, match="Unknown filter key"):
        retriever.invoke(text_for(0), filter={"tag": "even"})
    assert model.calls == 0


def test_filter_keys_may_be_fields_or_metadata() -> None:
    rules = tagged_rulebook().rules
    check_filter({"tags": "odd", "team": "b", "source_document_id": None}, rules)
    check_filter(lambda rule: True, rules)
    assert [
        r.rule_id for r in rules if rule_passes(r, {"tags": "odd", "team": "b"})
    ] == [
        "R-007",
        "R-009",
        "R-011",
    ]


def test_options_are_checked_before_any_judgment() -> None:
    with pytest.raises(ValueError, match="k must be"):
        MatchOptions(k=-1)
    with pytest.raises(ValueError, match="score_threshold"):
        MatchOptions(score_threshold=2.0)


def test_plan_then_judge_then_result_is_match() -> None:
    rules = tagged_rulebook().rules
    model = RuleAwareFakeChatModel()
    engine = MatchEngine(ApplicabilityJudge(llm=model, cache=None))
    plan = engine.plan(text_for(1, 2), rules, MatchOptions(filter={"tags": "even"}))
    assert [r.rule_id for r in plan.candidates] == [
        f"R-{i:03d}" for i in range(0, 12, 2)
    ]
    assert model.calls == 0
    # The graph judges one call unit per task; the verdicts come back in any order.
    counter = UsageCounter()
    verdicts = [
        v
        for unit in reversed(engine.call_units(plan))
        for v in engine.judge_rules(plan, counter.watch(), unit)
    ]
    stepped = engine.result(plan, verdicts, counter.usage)
    assert [v.rule_id for v in stepped.verdicts] == [r.rule_id for r in plan.candidates]
    assert [d.id for d in stepped.documents] == ["R-002"]
    whole = engine.match(text_for(1, 2), rules, MatchOptions(filter={"tags": "even"}))
    assert comparable(whole) == comparable(stepped)


def test_retraining_never_blocks_a_retrieval(tmp_path: Path) -> None:
    rulebook = tagged_rulebook()
    started, release = threading.Event(), threading.Event()

    class SlowToTrain(LearnedPrefilter):
        def fit(self, examples: Any, *args: Any, **kwargs: Any) -> Any:
            started.set()
            assert release.wait(timeout=30)
            return super().fit(examples, *args, **kwargs)

    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), verdict_log=log)
    retriever = TAGRetriever(
        rulebook=rulebook,
        judge=judge,
        # The pydantic plugin types a subclass's __init__ by its fields.
        prefilter=SlowToTrain(rulebook),  # type: ignore[call-arg]
        retrain_every=len(rulebook),
    )
    retriever.invoke(text_for(1))  # logs 12 verdicts: training is due
    assert started.wait(timeout=30)
    # Training is under way and blocked; a retrieval still completes.
    assert [d.id for d in retriever.invoke(text_for(2))] == ["R-002"]
    release.set()
    training = (
        retriever.engine.retrainer.running if retriever.engine.retrainer else None
    )
    if training is not None:
        training.result(timeout=30)
    assert retriever.prefilter is not None
    assert retriever.prefilter.fitted  # type: ignore[attr-defined]


def test_failed_judgments_warn_once_per_retrieval_in_every_face() -> None:
    rulebook = tagged_rulebook()
    failing = {f"R-{i:03d}": ["I cannot say."] * 10 for i in (1, 3, 5)}
    query = text_for(0, 1)
    retriever = TAGRetriever(
        rulebook=rulebook,
        judge=ApplicabilityJudge(
            llm=RuleAwareFakeChatModel(faults=failing), on_error="not_applicable"
        ),
    )
    graph = build_query_graph()
    context = QueryContext(
        judge_model=RuleAwareFakeChatModel(faults=failing),
        executor_model=RuleAwareFakeChatModel(),
        on_error="not_applicable",
    )
    data = rulebook.model_dump(mode="json")
    for run in (
        lambda: retriever.invoke(query),
        lambda: graph.invoke({"query": query, "rulebook": data}, context=context),
    ):
        with pytest.warns(UnreliableMatchWarning) as caught:
            run()
        unreliable = [w for w in caught if w.category is UnreliableMatchWarning]
        assert len(unreliable) == 1
        assert "3 of 12 judgments failed" in str(unreliable[0].message)


# --- the faces keep their engine right ----------------------------------------------


def test_a_judge_set_anew_is_the_one_that_judges() -> None:
    first, second = RuleAwareFakeChatModel(), RuleAwareFakeChatModel()
    retriever = TAGRetriever(rulebook=tagged_rulebook(3), llm=first)
    copied = retriever.model_copy(update={"judge": ApplicabilityJudge(llm=second)})
    copied.invoke(text_for(1))
    assert (first.calls, second.calls) == (0, 3)
    retriever.judge = ApplicabilityJudge(llm=second, cache=None)
    retriever.invoke(text_for(2))
    assert (first.calls, second.calls) == (0, 6)
    assert retriever.engine is retriever.engine  # rebuilt only on a change


def test_a_non_string_query_opens_no_run() -> None:
    started: list[object] = []

    class Runs(BaseCallbackHandler):
        def on_retriever_start(self, *args: Any, **kwargs: Any) -> None:
            started.append(args)

    retriever = TAGRetriever(rulebook=tagged_rulebook(3), llm=RuleAwareFakeChatModel())
    with pytest.raises(TypeError, match="The query must be a str"):
        retriever.invoke(42, config={"callbacks": [Runs()]})  # type: ignore[arg-type]
    assert started == []


async def test_async_retrieval_reads_the_verdict_log_off_the_event_loop(
    tmp_path: Path,
) -> None:
    rulebook = tagged_rulebook(3)
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    retriever = TAGRetriever(
        rulebook=rulebook,
        judge=ApplicabilityJudge(llm=RuleAwareFakeChatModel(), verdict_log=log),
        prefilter=LearnedPrefilter(rulebook),
        retrain_every=100,
    )
    polled_in: list[threading.Thread] = []
    retrainer = retriever.engine.retrainer
    assert retrainer is not None
    poll = retrainer.poll

    def recording(rules: Any = None) -> Any:
        polled_in.append(threading.current_thread())
        return poll(rules)

    retrainer.poll = recording  # type: ignore[method-assign]
    await retriever.ainvoke(text_for(1))
    assert polled_in
    assert polled_in[0] is not threading.main_thread()


def test_a_context_copies_and_pickles_without_its_engines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(query_graph, "_environment_model", RuleAwareFakeChatModel)
    context = QueryContext(k=2, filter={"tags": "even"})
    engine = context.engine(CallRetry())
    assert context.engine(CallRetry()) is engine
    pickled = pickle.loads(pickle.dumps(context))  # noqa: S301 - our own bytes
    for other in (copy.deepcopy(context), pickled):
        assert other.k == context.k
        assert other.engine(CallRetry()) is not engine


def test_runs_without_a_context_share_one_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(query_graph, "_environment_model", RuleAwareFakeChatModel)
    built: list[object] = []
    real = QueryContext.settings

    def counting(context: QueryContext, *args: Any) -> Any:
        built.append(context)
        return real(context, *args)

    monkeypatch.setattr(QueryContext, "settings", counting)
    graph = build_query_graph()
    data = tagged_rulebook().model_dump(mode="json")
    for number in (1, 2):
        output = graph.invoke({"query": text_for(number), "rulebook": data})
        assert [m["rule_id"] for m in output["matches"]] == [f"R-{number:03d}"]
    assert len(built) == 1  # not one judge (and bound) per match_rule task


# --- usage: what a retrieval's judgments cost ---------------------------------------

CACHING = PromptCaching(min_tokens=64, block_tokens=16)
"""A provider caching short prefixes, so the fake's prompts are cached."""


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_match_counts_the_judgments_usage_cached_tokens_included(
    face: str,
) -> None:
    model = RuleAwareFakeChatModel(report_usage=True, prompt_caching=CACHING)
    engine = MatchEngine(ApplicabilityJudge(llm=model, cache=None))
    rules = tagged_rulebook().rules
    caller = UsageCounter()  # what the caller's own callbacks see
    result = (
        engine.match(text_for(1, 2), rules, config=caller.watch())
        if face == "sync"
        else await engine.amatch(text_for(1, 2), rules, config=caller.watch())
    )
    assert result.usage == caller.usage
    usage = result.usage
    assert usage is not None
    assert usage.calls == model.calls == len(rules)
    # The fake counts 4 characters a token, rounded up.
    assert usage.input_tokens == sum(math.ceil(len(p) / 4) for p in model.prompts)
    # The input comes before the rule: later judgments read the shared prefix.
    assert 0 < (usage.cached_input_tokens or 0) < usage.input_tokens
    assert result.summary()["usage"] == usage.model_dump()


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_match_counts_every_attempt_of_a_retried_judgment(face: str) -> None:
    rules = tagged_rulebook().rules
    model = RuleAwareFakeChatModel(
        report_usage=True, faults={rules[0].rule_id: [ConnectionError("reset")]}
    )
    retry = CallRetry(max_attempts=3, initial_delay=0, jitter=0)
    engine = MatchEngine(ApplicabilityJudge(llm=model, cache=None, retry=retry))
    caller = UsageCounter()
    result = (
        engine.match(text_for(1), rules, config=caller.watch())
        if face == "sync"
        else await engine.amatch(text_for(1), rules, config=caller.watch())
    )
    assert result.usage is not None
    # The failed attempt is a call (counted as the callbacks count it), with no
    # tokens of its own.
    assert result.usage.calls == model.calls == len(rules) + 1
    assert result.usage == caller.usage


def test_verdicts_from_the_cache_cost_nothing() -> None:
    model = RuleAwareFakeChatModel(report_usage=True)
    engine = MatchEngine(ApplicabilityJudge(llm=model))  # the default verdict cache
    rules = tagged_rulebook().rules
    first = engine.match(text_for(3), rules)
    again = engine.match(text_for(3), rules)
    assert first.usage is not None
    assert first.usage.calls == len(rules)
    assert again.usage == TokenUsage()  # no call: a known zero
    assert again.summary()["usage"] == {
        "calls": 0,
        "input_tokens": 0,
        "cached_input_tokens": 0,
        "output_tokens": 0,
    }


def test_a_model_reporting_no_usage_shows_unknown_tokens_not_zero() -> None:
    engine = MatchEngine(ApplicabilityJudge(llm=RuleAwareFakeChatModel(), cache=None))
    result = engine.match(text_for(5), tagged_rulebook().rules)
    assert result.summary()["usage"] == {
        "calls": 12,
        "input_tokens": None,
        "cached_input_tokens": None,
        "output_tokens": None,
    }


# --- the learned prefilter's skip records ---------------------------------------------


def test_the_engine_records_what_the_learned_prefilter_skipped(
    tmp_path: Path,
) -> None:
    """Retraining keeps the recall promise from these records (the learning loop)."""
    rulebook = tagged_rulebook()
    prefilter = fitted_prefilter(rulebook)
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    judge = ApplicabilityJudge(llm=RuleAwareFakeChatModel(), verdict_log=log)
    engine = MatchEngine(judge, prefilter=prefilter, explore=0.5)
    query = text_for(3)
    result = engine.match(query, rulebook.rules)
    _, skipped, rates = prefilter.screen(query, rulebook.rules)
    assert skipped
    # Written with the retrieval's verdicts, explored ones too.
    assert log.pending == 0
    assert [(s.rule_id, s.skipped_yes, s.explore) for s in log.skips()] == [
        (rule_id, rates[rule_id], 0.5) for rule_id in skipped
    ]
    assert set(result.explored_rule_ids) <= set(skipped)
    assert len(log) == result.candidates
    # A judge without a log: nothing to record, nothing fails.
    plain = MatchEngine(
        ApplicabilityJudge(llm=RuleAwareFakeChatModel()), prefilter=prefilter
    )
    assert [d.id for d in plain.match(query, rulebook.rules).documents] == ["R-003"]


# --- judging ahead: prejudge ---------------------------------------------------------


def test_prejudge_online_fills_the_cache_match_then_calls_nothing() -> None:
    rulebook = trigger_rulebook(6)
    model = RuleAwareFakeChatModel()
    engine = MatchEngine(ApplicabilityJudge(llm=model))
    texts = ["trigger-001 here", "trigger-002 and trigger-004", "trigger-001 here"]
    report = engine.prejudge(texts, rulebook.rules, via="online")
    assert (report.requests, report.online, report.cached) == (18, 12, 6)
    assert model.calls == 12  # the repeated input was judged once
    results = [engine.match(text, rulebook.rules) for text in texts]
    assert model.calls == 12
    assert all(v.cached for result in results for v in result.verdicts)
    assert [d.id for d in results[1].documents] == ["R-002", "R-004"]


def test_prejudge_plans_as_match_does() -> None:
    rulebook = trigger_rulebook(6)
    model = RuleAwareFakeChatModel()
    engine = MatchEngine(ApplicabilityJudge(llm=model))
    only = MatchOptions(filter=lambda rule: rule.rule_id in {"R-001", "R-003"})
    report = engine.prejudge(["trigger-001"], rulebook.rules, only, via="online")
    assert report.requests == 2  # the filter applies before anything is judged
    with pytest.raises(ValueError, match="via must be 'batch' or 'online'"):
        engine.prejudge(["x"], rulebook.rules, via="carrier pigeon")  # type: ignore[arg-type]
    assert model.calls == 2


def test_looking_ahead_records_no_skips_the_retrieval_records_them_once(
    tmp_path: Path,
) -> None:
    rulebook = tagged_rulebook()
    prefilter = fitted_prefilter(rulebook)
    log = SQLiteVerdictLog(tmp_path / "log.sqlite")
    model = RuleAwareFakeChatModel()
    engine = MatchEngine(
        ApplicabilityJudge(llm=model, verdict_log=log), prefilter=prefilter
    )
    query = text_for(3)
    engine.prejudge([query], rulebook.rules, via="online")
    log.flush()
    assert list(log.skips()) == []  # judged ahead: the retrieval records its own
    judged = model.calls
    result = engine.match(query, rulebook.rules)
    assert model.calls == judged  # every verdict came from the cache
    log.flush()  # skips wait for the log's next write; a cached retrieval has none
    _, skipped, _ = prefilter.screen(query, rulebook.rules)
    assert [s.rule_id for s in log.skips()] == skipped
    assert result.candidates == judged
