"""Regression tests: extraction work that is reused is reported and used right.

- A resumed extraction reports the calls it sent to the model as made, and the
  answers it took from the checkpoint or the answer store as reused.
- `TAGRetriever.from_documents` with an existing `rulebook_path` loads the file only
  for the documents it records; for other documents it extracts again.

Everything runs on `ExtractionFakeChatModel`, whose `calls` and `prompts` say what
the model was really sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document

from langchain_tag.errors import RulebookError
from langchain_tag.extraction import (
    ExtractionReport,
    aextract_rules,
    extract_rules,
    prompts,
)
from langchain_tag.matching import ApplicabilityJudge
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rulebook
from langchain_tag.testing import (
    ExtractionFakeChatModel,
    RuleAwareFakeChatModel,
    trigger_rulebook,
)

GUIDE = """\
# Python style guide

## Imports

Imports are always put at the top of the file, after the module docstring.
Wildcard imports such as `from os import *` must never be used in a module.

## Naming

Function names should be lowercase, with words separated by underscores.
Avoid names like `l`, `O` or `I`, because they look like digits.

## Comments

Comments that contradict the code are worse than no comments.
Block comments should start with `# ` and a single space.
"""

FAQ = """\
# Frequently asked questions

## Line length

Lines must be limited to 79 characters, so `black --line-length 79` is used.
Long strings should be split with implicit concatenation inside parentheses.
"""

PHASE_MARKERS = {
    "spans": prompts.SPAN_DETECTION_SYSTEM.split("{domain}")[0],
    "atomics": prompts.DECOMPOSITION_SYSTEM.split("{domain}")[0],
    "rules": prompts.OPERATIONALISATION_SYSTEM.split("{domain}")[0],
    "relations": prompts.RELATIONS_SYSTEM.split("{domain}")[0],
}
"""Opening words of each phase's system prompt."""


def doc(text: str, source: str) -> Document:
    return Document(page_content=text, metadata={"source": source})


def report_of(rulebook: Rulebook) -> ExtractionReport:
    return ExtractionReport.model_validate(rulebook.diagnostics)


def prompt_phases(sent: Sequence[str]) -> Counter[str]:
    return Counter(
        next(name for name, marker in PHASE_MARKERS.items() if marker in prompt)
        for prompt in sent
    )


def full_calls(documents: Sequence[Document]) -> int:
    """How many calls a fresh extraction of the documents makes."""
    fake = ExtractionFakeChatModel()
    extract_rules(documents, llm=fake, checkpoint=None)
    return fake.calls


# --- the report of a resumed run ------------------------------------------------------


def extract(*, asynchronous: bool, **kwargs: Any) -> Rulebook:
    if asynchronous:
        return asyncio.run(aextract_rules(**kwargs))
    return extract_rules(**kwargs)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_resumed_run_reports_calls_made_and_calls_reused(
    tmp_path: Path,
    asynchronous: bool,  # noqa: FBT001 - a parameter
) -> None:
    """A run resumed after an error counts only the calls it made itself as made.

    The first run stops at its second phase-3 call, after its phase-1 and phase-2
    calls and some phase-3 calls finished. The resumed run takes those from the
    checkpoint (or the answer store) and sends only the rest to the model. Before
    the fix, every call on the thread counted as made by the resumed run: its report
    said all of them were made and 0 reused, however few the server received.
    """
    documents = [doc(GUIDE, "guide.md"), doc(FAQ, "faq.md")]
    everything = full_calls(documents)
    db = tmp_path / "run.sqlite"
    failing = ExtractionFakeChatModel(
        faults={"rules": [None, ValueError("model refused")]}
    )
    # The interrupted run is synchronous in both cases: an async run that fails
    # can leave the checkpoint file write-locked in this process (LangGraph's
    # AsyncSqliteSaver; reproduced on the previous release too), which is not
    # what this test is about. The resumed run is sync or async.
    with pytest.raises(ValueError, match="model refused"):
        extract(
            asynchronous=False,
            documents=documents,
            llm=failing,
            checkpoint=db,
            max_concurrency=2,
        )
    answered_before = failing.calls - 1  # the refused call has no answer

    healthy = ExtractionFakeChatModel()
    rulebook = extract(
        asynchronous=asynchronous, documents=documents, llm=healthy, checkpoint=db
    )
    assert 0 < healthy.calls < everything  # resumed, not started again
    report = report_of(rulebook)
    made = {name: phase.calls for name, phase in report.phases.items()}
    reused = {name: phase.stored_answers for name, phase in report.phases.items()}
    assert {name: n for name, n in made.items() if n} == prompt_phases(healthy.prompts)
    assert sum(made.values()) == healthy.calls
    assert sum(reused.values()) == answered_before
    assert sum(made.values()) + sum(reused.values()) == everything
    # Tokens are those of the calls made (the fake counts 4 characters a token).
    input_tokens = sum(p.input_tokens for p in report.phases.values())
    assert input_tokens == sum(len(p) // 4 for p in healthy.prompts)
    assert (
        f"LLM calls: {healthy.calls} made, {answered_before} reused" in report.format()
    )


def test_fresh_and_incremental_runs_report_their_calls(tmp_path: Path) -> None:
    """A fresh run reuses nothing; a re-run after an edit reuses the rest."""
    db = tmp_path / "run.sqlite"
    first = ExtractionFakeChatModel()
    report = report_of(
        extract_rules([doc(GUIDE, "guide.md")], llm=first, checkpoint=db)
    )
    assert sum(p.calls for p in report.phases.values()) == first.calls
    assert sum(p.stored_answers for p in report.phases.values()) == 0

    edited = GUIDE.replace("Wildcard imports", "Star imports")
    second = ExtractionFakeChatModel()
    report = report_of(
        extract_rules([doc(edited, "guide.md")], llm=second, checkpoint=db)
    )
    assert 0 < second.calls < first.calls
    assert sum(p.calls for p in report.phases.values()) == second.calls
    reused = sum(p.stored_answers for p in report.phases.values())
    assert reused == full_calls([doc(edited, "guide.md")]) - second.calls


# --- TAGRetriever.from_documents with an existing rulebook ----------------------------


def retriever(
    documents: Iterable[Document | str],
    path: Path,
    fake: ExtractionFakeChatModel,
    checkpoint: Path | None,
) -> TAGRetriever:
    return TAGRetriever.from_documents(
        documents,
        llm=fake,
        rulebook_path=path,
        extraction={"checkpoint": checkpoint},
        judge=ApplicabilityJudge(llm=RuleAwareFakeChatModel()),
    )


def same_rules(a: Rulebook, b: Rulebook) -> None:
    assert [r.model_dump() for r in a.rules] == [r.model_dump() for r in b.rules]
    assert a.documents == b.documents


def test_from_documents_re_extracts_edited_documents_incrementally(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An edited document is extracted again, and only its changed section is sent.

    Before the fix the second call loaded the file as it was: the rules of the
    old text, no call made, no word said.
    """
    path, db = tmp_path / "guide.rulebook.json", tmp_path / "run.sqlite"
    original = [doc(GUIDE, "docs/guide.md"), doc(FAQ, "docs/faq.md")]
    retriever(original, path, ExtractionFakeChatModel(), db)

    edited_text = GUIDE.replace("Wildcard imports", "Star imports")
    edited = [doc(edited_text, "docs/guide.md"), original[1]]
    fake = ExtractionFakeChatModel()
    with caplog.at_level(logging.WARNING, logger="langchain_tag.retrievers"):
        second = retriever(edited, path, fake, db)
    assert 0 < fake.calls < full_calls(edited)  # incremental
    assert prompt_phases(fake.prompts)["spans"] == 1  # the Imports section
    fresh = extract_rules(edited, llm=ExtractionFakeChatModel(), checkpoint=None)
    same_rules(second.rulebook, fresh)
    assert any(r.source_text.startswith("Star imports") for r in second.rulebook.rules)
    assert Rulebook.load(path) == second.rulebook  # the file was replaced
    (record,) = caplog.records
    assert str(path) in record.getMessage()
    assert "edited: guide" in record.getMessage()
    assert "faq" not in record.getMessage()

    # The file now records the edited documents: loaded, nothing sent.
    again = ExtractionFakeChatModel()
    assert retriever(edited, path, again, db).rulebook == second.rulebook
    assert again.calls == 0


@pytest.mark.parametrize("change", ["added", "removed"])
def test_from_documents_re_extracts_added_or_removed_documents(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    path = tmp_path / "rulebook.json"
    guide, faq = doc(GUIDE, "guide.md"), doc(FAQ, "faq.md")
    before, after = (
        ([guide], [guide, faq]) if change == "added" else ([guide, faq], [guide])
    )
    retriever(before, path, ExtractionFakeChatModel(), None)

    fake = ExtractionFakeChatModel()
    with caplog.at_level(logging.WARNING, logger="langchain_tag.retrievers"):
        rulebook = retriever(after, path, fake, None).rulebook
    assert fake.calls > 0
    assert [d.document_id for d in rulebook.documents] == [
        d.metadata["source"].removesuffix(".md") for d in after
    ]
    assert {r.source.document_id for r in rulebook.rules if r.source} == {
        d.document_id for d in rulebook.documents
    }
    assert f"{change}: faq" in caplog.text
    assert Rulebook.load(path) == rulebook


def test_from_documents_loads_the_same_documents_in_any_order_from_anywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Order and source directories change no rule: the file is loaded as it is."""
    path = tmp_path / "rulebook.json"
    first = retriever(
        [doc(GUIDE, "/home/a/guide.md"), doc(FAQ, "/home/a/faq.md")],
        path,
        ExtractionFakeChatModel(),
        None,
    )
    fake = ExtractionFakeChatModel()
    with caplog.at_level(logging.WARNING, logger="langchain_tag.retrievers"):
        moved = retriever(
            iter([doc(FAQ, "/srv/b/faq.md"), doc(GUIDE, "/srv/b/guide.md")]),
            path,
            fake,
            None,
        )
    assert fake.calls == 0
    assert moved.rulebook == first.rulebook
    assert caplog.records == []


def test_from_documents_refuses_a_rulebook_that_records_no_documents(
    tmp_path: Path,
) -> None:
    """A hand-made rulebook cannot be checked: refused, and never overwritten."""
    path = tmp_path / "rulebook.json"
    trigger_rulebook(3).save(path)
    written = path.read_bytes()
    fake = ExtractionFakeChatModel()
    with pytest.raises(RulebookError, match="records no source documents"):
        retriever([doc(GUIDE, "guide.md")], path, fake, None)
    assert fake.calls == 0
    assert path.read_bytes() == written
