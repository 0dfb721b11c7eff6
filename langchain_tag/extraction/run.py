"""`extract_rules`: the extraction graph run to completion, resumable.

`extract_rules` runs the five-phase graph of `graph.py` under a SQLite checkpointer
and a durable store of the model's answers, so that an interrupted run resumes where
it stopped and a re-run after an edit only sends the changed sections to the model.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache, VerdictCache
from langchain_tag.extraction.graph import (
    DEFAULT_DOMAIN,
    ExtractionInput,
    ExtractionSettings,
    build_extraction_graph,
)
from langchain_tag.extraction.phases import unreadable_problem
from langchain_tag.extraction.report import ExtractionReport
from langchain_tag.models import CallRetry, default_chat_model, model_identity
from langchain_tag.rules import Rulebook

DEFAULT_CHECKPOINT = Path(".langchain-tag") / "extraction.sqlite"
"""Where runs are checkpointed unless told otherwise (relative to the working dir)."""

Checkpoint = str | Path | BaseCheckpointSaver[Any] | None
"""A SQLite path, a checkpointer, None, or "default" for `DEFAULT_CHECKPOINT`."""
ProgressCallback = Callable[[str, int], None]
"""Called with (node name, number of tasks of that node finished so far)."""


def _as_documents(documents: Iterable[Document | str]) -> list[Document]:
    docs = [
        d if isinstance(d, Document) else Document(page_content=d) for d in documents
    ]
    if not docs:
        msg = "extract_rules needs at least one document."
        raise ValueError(msg)
    for position, doc in enumerate(docs, 1):
        if not doc.page_content.strip():
            where = doc.metadata.get("source") or doc.id or f"document {position}"
            msg = (
                f"Document {where!r} is empty: there is nothing to extract rules from."
            )
            raise ValueError(msg)
    return docs


def run_id_for(
    documents: Iterable[Document], domain: str, settings: ExtractionSettings
) -> str:
    """The thread id of a run: the same documents, domain and settings resume it."""
    llm = settings.llm or default_chat_model()
    payload = json.dumps(
        [
            [
                [
                    d.id,
                    d.metadata.get("source"),
                    hashlib.sha256(d.page_content.encode()).hexdigest(),
                ]
                for d in documents
            ],
            domain,
            model_identity(llm),
            settings.key(),
            settings.max_section_tokens,
            settings.units_per_call,
            settings.rules_per_comparison,
            settings.faithfulness_mode,
            settings.faithfulness_threshold,
            settings.min_coverage_overlap,
        ],
        default=str,
    )
    return "extract-" + hashlib.sha256(payload.encode()).hexdigest()[:24]


ANSWERS_TABLE = "extraction_answers"


@contextmanager
def _persistence(
    checkpoint: Checkpoint,
) -> Iterator[tuple[BaseCheckpointSaver[Any], VerdictCache]]:
    if isinstance(checkpoint, BaseCheckpointSaver):
        yield checkpoint, InMemoryVerdictCache()
        return
    if checkpoint is None:
        yield InMemorySaver(), InMemoryVerdictCache()
        return
    path = _checkpoint_path(checkpoint)
    # Threads of the fan-out share the connection; SqliteSaver serialises access.
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        yield SqliteSaver(conn), SQLiteVerdictCache(path, table=ANSWERS_TABLE)
    finally:
        conn.close()


@asynccontextmanager
async def _apersistence(
    checkpoint: Checkpoint,
) -> AsyncIterator[tuple[BaseCheckpointSaver[Any], VerdictCache]]:
    if isinstance(checkpoint, BaseCheckpointSaver) or checkpoint is None:
        with _persistence(checkpoint) as pair:
            yield pair
        return
    path = _checkpoint_path(checkpoint)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        yield saver, SQLiteVerdictCache(path, table=ANSWERS_TABLE)


def _checkpoint_path(checkpoint: str | Path) -> Path:
    path = DEFAULT_CHECKPOINT if checkpoint == "default" else Path(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _prepare(
    documents: Iterable[Document | str],
    llm: BaseChatModel | None,
    skip_phases: Iterable[int],
    settings: dict[str, Any],
) -> tuple[list[Document], ExtractionSettings]:
    docs = _as_documents(documents)
    skipped = frozenset(skip_phases)
    if not skipped <= {1, 2, 3, 4, 5}:
        msg = f"skip_phases takes phase numbers 1-5, got {sorted(skipped)}."
        raise ValueError(msg)
    return docs, ExtractionSettings(
        llm=llm or default_chat_model(), skip_phases=skipped, **settings
    )


def _with_answers(
    settings: ExtractionSettings, default: VerdictCache
) -> ExtractionSettings:
    """Settings whose answer store is the caller's, or else the checkpoint's."""
    # Compared with None: a store has a length, and the caller's empty store (a
    # first run) is still where its answers must go.
    if settings.answers is not None:
        return settings
    return replace(settings, answers=default)


def _config(
    thread_id: str, max_concurrency: int, callbacks: Callbacks
) -> RunnableConfig:
    return {
        "configurable": {"thread_id": thread_id},
        "max_concurrency": max_concurrency,
        "callbacks": callbacks,
    }


def _finished(values: dict[str, Any], run_key: str) -> bool:
    """Whether the thread holds this run's rulebook, with every answer readable.

    A run where some answers could not be read is run again: the readable answers
    come back from the answer store and only the unreadable ones are asked again.
    """
    if "rulebook" not in values or values.get("run_key") != run_key:
        return False
    report = ExtractionReport.model_validate(values["rulebook"]["diagnostics"])
    return not any(
        unreadable_problem(problem)
        for phase in report.phases.values()
        for problem in phase.problems
    )


def _inputs(
    pending: tuple[str, ...],
    values: dict[str, Any],
    documents: list[Document],
    domain: str,
    run_key: str,
) -> ExtractionInput | None:
    """None resumes the thread's interrupted run; new input starts a fresh one."""
    if pending and values.get("run_key") == run_key:
        return None
    return {"documents": documents, "domain": domain, "run_key": run_key}


def _finish(output: dict[str, Any]) -> Rulebook:
    return Rulebook.model_validate(output["rulebook"])


def extract_rules(
    documents: Iterable[Document | str],
    *,
    llm: BaseChatModel | None = None,
    domain: str = DEFAULT_DOMAIN,
    skip_phases: Iterable[int] = (),
    checkpoint: Checkpoint = "default",
    thread_id: str | None = None,
    max_concurrency: int = 8,
    retry: CallRetry | None = None,
    callbacks: Callbacks = None,
    on_progress: ProgressCallback | None = None,
    **settings: Any,
) -> Rulebook:
    """Extract a verified rulebook from documents (the five phases of Stage 1).

    Args:
        documents: LangChain documents from any loader, or plain strings. Markdown,
            reStructuredText and plain text are sectioned by their structure.
        llm: The extracting chat model; default from the environment.
        domain: What the documents govern ("Python code style", "NBA salary cap").
        skip_phases: Ablations: phases 1-5 to skip.
        checkpoint: A SQLite path, a LangGraph checkpointer, None for no
            persistence, or "default" (`.langchain-tag/extraction.sqlite`). With a
            path, the model's answers are kept there too: a killed run resumes
            without asking again, and unchanged sections are never sent again.
            With a checkpointer (e.g. `PostgresSaver`), finished tasks are kept in
            it, and answers only for this call unless `answers=` names a store.
        thread_id: The run to create or resume; default derived from the
            documents, domain, model and settings, so re-running the same call
            resumes an interrupted run (and returns a finished one at once, unless
            some of its answers were unreadable: those are asked again).
        max_concurrency: LLM calls in flight at most.
        retry: Backoff for transient model errors.
        callbacks: LangChain callbacks for the run (tracing).
        on_progress: Called as nodes finish, e.g. for a progress bar.
        **settings: Other `ExtractionSettings` fields (`max_section_tokens`,
            `faithfulness_mode`, ...).

    Returns:
        The rulebook; its `diagnostics` hold the `ExtractionReport`.
    """
    docs, run_settings = _prepare(documents, llm, skip_phases, settings)
    run_key = run_id_for(docs, domain, run_settings)
    config = _config(thread_id or run_key, max_concurrency, callbacks)
    with _persistence(checkpoint) as (saver, answers):
        run_settings = _with_answers(run_settings, answers)
        graph = build_extraction_graph(checkpointer=saver, retry=retry)
        snapshot = graph.get_state(config)
        if _finished(snapshot.values, run_key):
            return _finish(snapshot.values)
        inputs = _inputs(snapshot.next, snapshot.values, docs, domain, run_key)
        done: dict[str, int] = {}
        for update in graph.stream(
            inputs, config, context=run_settings, stream_mode="updates"
        ):
            _progress(update, done, on_progress)
        return _finish(graph.get_state(config).values)


async def aextract_rules(
    documents: Iterable[Document | str],
    *,
    llm: BaseChatModel | None = None,
    domain: str = DEFAULT_DOMAIN,
    skip_phases: Iterable[int] = (),
    checkpoint: Checkpoint = "default",
    thread_id: str | None = None,
    max_concurrency: int = 8,
    retry: CallRetry | None = None,
    callbacks: Callbacks = None,
    on_progress: ProgressCallback | None = None,
    **settings: Any,
) -> Rulebook:
    """Async `extract_rules`: the fan-out's LLM calls run on the event loop."""
    docs, run_settings = _prepare(documents, llm, skip_phases, settings)
    run_key = run_id_for(docs, domain, run_settings)
    config = _config(thread_id or run_key, max_concurrency, callbacks)
    async with _apersistence(checkpoint) as (saver, answers):
        run_settings = _with_answers(run_settings, answers)
        graph = build_extraction_graph(checkpointer=saver, retry=retry)
        snapshot = await graph.aget_state(config)
        if _finished(snapshot.values, run_key):
            return _finish(snapshot.values)
        inputs = _inputs(snapshot.next, snapshot.values, docs, domain, run_key)
        done: dict[str, int] = {}
        async for update in graph.astream(
            inputs, config, context=run_settings, stream_mode="updates"
        ):
            _progress(update, done, on_progress)
        return _finish((await graph.aget_state(config)).values)


def _progress(
    update: dict[str, Any], done: dict[str, int], on_progress: ProgressCallback | None
) -> None:
    for node in update:
        if node.startswith("__"):
            continue
        done[node] = done.get(node, 0) + 1
        if on_progress is not None:
            on_progress(node, done[node])
