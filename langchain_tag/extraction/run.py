"""`extract_rules`: the extraction graph run to completion, resumable.

`extract_rules` runs the five-phase graph of `graph.py` under a SQLite checkpointer
and a durable store of the model's answers, so that an interrupted run resumes where
it stopped and a re-run after an edit only sends the changed sections to the model.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from uuid import uuid4

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langchain_core.stores import BaseStore
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import StateSnapshot

from langchain_tag.cache import InMemoryVerdictCache, SQLiteVerdictCache
from langchain_tag.errors import CheckpointError
from langchain_tag.extraction.documents import DocumentLike, to_documents
from langchain_tag.extraction.graph import (
    DEFAULT_DOMAIN,
    INVOCATION_KEY,
    ExtractionInput,
    ExtractionSettings,
    build_extraction_graph,
    source_documents,
)
from langchain_tag.extraction.pairs import DEFAULT_MAX_PAIRS
from langchain_tag.extraction.report import ExtractionReport
from langchain_tag.models import CallRetry, default_chat_model, model_identity
from langchain_tag.rule_schemas import CONDITION_SCHEMA
from langchain_tag.rules import Rulebook, SourceDocument

DEFAULT_CHECKPOINT = Path(".langchain-tag") / "extraction.sqlite"
"""Where runs are checkpointed unless told otherwise (relative to the working dir)."""

Checkpoint = str | Path | BaseCheckpointSaver[Any] | None
"""A SQLite path, a checkpointer, None, or "default" for `DEFAULT_CHECKPOINT`."""
ProgressCallback = Callable[[str, int], None]
"""Called with (node name, number of tasks of that node finished so far)."""


def _as_documents(documents: Iterable[DocumentLike]) -> list[Document]:
    docs = to_documents(documents)  # files are loaded here, before any model call
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
            settings.merge,
            # Settings added later count only when not at their default, so the
            # ids of runs made before them stay put.
            *([] if settings.max_pairs == DEFAULT_MAX_PAIRS else [settings.max_pairs]),
            *(
                []
                if settings.schema == CONDITION_SCHEMA
                else [settings.schema.digest()]
            ),
        ],
        default=str,
    )
    return "extract-" + hashlib.sha256(payload.encode()).hexdigest()[:24]


def changed_documents(
    recorded: Iterable[SourceDocument], documents: Iterable[DocumentLike]
) -> dict[str, list[str]]:
    """How `documents` differ from those a rulebook records, by document id.

    The documents get the ids extraction would give them; content is compared by
    SHA-256. Order and source paths are not compared: they change no rule.

    Returns:
        The ids "added", "removed" and "edited"; all lists empty for the same
        documents.
    """
    before = {d.document_id: d.sha256 for d in recorded}
    now = {d.document_id: d.sha256 for d in source_documents(_as_documents(documents))}
    return {
        "added": [i for i in now if i not in before],
        "removed": [i for i in before if i not in now],
        "edited": [i for i in now if i in before and now[i] != before[i]],
    }


ANSWERS_TABLE = "extraction_answers"


@contextmanager
def _persistence(
    checkpoint: Checkpoint,
) -> Iterator[tuple[BaseCheckpointSaver[Any], BaseStore[str, str]]]:
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
) -> AsyncIterator[tuple[BaseCheckpointSaver[Any], BaseStore[str, str]]]:
    if isinstance(checkpoint, BaseCheckpointSaver) or checkpoint is None:
        with _persistence(checkpoint) as pair:
            yield pair
        return
    path = _checkpoint_path(checkpoint)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        yield saver, SQLiteVerdictCache(path, table=ANSWERS_TABLE)


def _checkpoint_path(checkpoint: str | Path) -> Path:
    """The checkpoint file, its folder made; a path that cannot be one refused.

    Raises:
        CheckpointError: The path is a directory, or it cannot be created or
            opened as a SQLite file (said with the reason and what to pass).
    """
    path = DEFAULT_CHECKPOINT if checkpoint == "default" else Path(checkpoint)
    fix = "pass a file path such as .langchain-tag/extract.sqlite"
    if path.is_dir():
        msg = f"checkpoint {path} is a directory; {fix} (or {path / 'extract.sqlite'})."
        raise CheckpointError(msg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        msg = (
            f"checkpoint {path}: {path.parent} (or a folder above it) is a file; {fix}."
        )
        raise CheckpointError(msg) from None
    except OSError as error:
        msg = f"checkpoint {path}: cannot make its folder ({error.strerror}); {fix}."
        raise CheckpointError(msg) from None
    try:
        sqlite3.connect(path).close()
    except (OSError, sqlite3.Error) as error:
        reason = getattr(error, "strerror", None) or str(error)
        msg = f"checkpoint {path} cannot be opened ({reason}); {fix}."
        raise CheckpointError(msg) from None
    return path


@dataclass
class _Run:
    """One call of `extract_rules`: its input and settings, and its progress."""

    input: ExtractionInput
    settings: ExtractionSettings
    on_progress: ProgressCallback | None
    on_stored: Callable[[], None] | None = None
    done: Counter[str] = field(default_factory=Counter)

    @classmethod
    def start(
        cls,
        documents: Iterable[DocumentLike],
        llm: BaseChatModel | None,
        domain: str,
        skip_phases: Iterable[int],
        settings: dict[str, Any],
        on_progress: ProgressCallback | None,
        on_stored: Callable[[], None] | None,
    ) -> _Run:
        docs = _as_documents(documents)
        run_settings = ExtractionSettings(
            llm=llm or default_chat_model(),
            skip_phases=frozenset(skip_phases),
            **settings,
        )
        key = run_id_for(docs, domain, run_settings)
        run_input: ExtractionInput = {
            "documents": docs,
            "domain": domain,
            "run_key": key,
        }
        return cls(run_input, run_settings, on_progress, on_stored)

    def config(
        self, thread_id: str | None, max_concurrency: int, callbacks: Callbacks
    ) -> RunnableConfig:
        # A new invocation id each call: the report counts the calls made under it.
        thread = thread_id or self.input["run_key"]
        return {
            "configurable": {"thread_id": thread, INVOCATION_KEY: uuid4().hex},
            "max_concurrency": max_concurrency,
            "callbacks": callbacks,
        }

    def graph(
        self,
        saver: BaseCheckpointSaver[Any],
        answers: BaseStore[str, str],
        retry: CallRetry | None,
    ) -> CompiledStateGraph[Any, ExtractionSettings, Any, Any]:
        """The graph on `saver`; answers go to the caller's store, else `answers`."""
        # Compared with None: a store has a length, and the caller's empty store (a
        # first run) is still where its answers must go.
        if self.settings.answers is None:
            self.settings = replace(self.settings, answers=answers)
        return build_extraction_graph(checkpointer=saver, retry=retry)

    def finished(self, values: dict[str, Any]) -> Rulebook | None:
        """The thread's rulebook if it is this run's, with every answer readable.

        A run where some answers could not be read is run again: the readable
        answers come back from the answer store and only the others are asked again.
        """
        if "rulebook" not in values or values.get("run_key") != self.input["run_key"]:
            return None
        rulebook = Rulebook.model_validate(values["rulebook"])
        report = ExtractionReport.model_validate(rulebook.diagnostics)
        return None if report.unreadable else rulebook

    def stored(self, rulebook: Rulebook) -> Rulebook:
        """`rulebook`, a finished run's returned without running: the caller is told."""
        if self.on_stored is not None:
            self.on_stored()
        return rulebook

    def stream(self, snapshot: StateSnapshot, config: RunnableConfig) -> dict[str, Any]:
        """The arguments of `stream`: no input resumes the thread's interrupted run."""
        resume = (
            snapshot.next and snapshot.values.get("run_key") == self.input["run_key"]
        )
        return {
            "input": None if resume else self.input,
            "config": config,
            "context": self.settings,
            "stream_mode": "updates",
        }

    def progress(self, update: dict[str, Any]) -> None:
        for node in update:
            if node.startswith("__"):
                continue
            self.done[node] += 1
            if self.on_progress is not None:
                self.on_progress(node, self.done[node])


def extract_rules(
    documents: Iterable[DocumentLike],
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
    on_stored: Callable[[], None] | None = None,
    **settings: Any,
) -> Rulebook:
    """Extract a verified rulebook from documents (the five phases of Stage 1).

    Args:
        documents: LangChain documents from any loader, plain strings, or paths
            (`pathlib.Path`) of PDF, HTML, DOCX or text files, loaded by
            `load_document` before any model call (a file that cannot be loaded
            raises `DocumentError`, naming it). Markdown, reStructuredText and plain
            text are sectioned by their structure, HTML and DOCX by their headings.
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
        on_stored: Called when the finished run is returned as it was stored,
            without running: no node runs and no model is called, and the report
            is that of the call that finished the run (`ExtractionReport.format(
            stored=True)` labels it so).
        **settings: Other `ExtractionSettings` fields (`max_section_tokens`,
            `faithfulness_mode`, `merge`, `max_pairs`, ...). `merge="duplicates"`
            (default, the method) merges only pairs phase 4 judged duplicates;
            `merge="preferred"` also merges pairs the model marked
            `preferred_action: "merge"` (subsumptions, overlaps). `max_pairs`
            (default 5,000; None for no cap) bounds the rule pairs phase 4
            compares: over it, the most similar pairs sharing a tag are compared
            and the report counts the others as skipped.

    Returns:
        The rulebook; its `diagnostics` hold the `ExtractionReport`. Its calls are
        those made by this call; answers from the store, and calls made before an
        interruption this call resumed, are counted as reused. A finished run
        returned at once keeps the report of the call that finished it
        (`on_stored` is called then).
    """
    run = _Run.start(
        documents, llm, domain, skip_phases, settings, on_progress, on_stored
    )
    config = run.config(thread_id, max_concurrency, callbacks)
    with _persistence(checkpoint) as (saver, answers):
        graph = run.graph(saver, answers, retry)
        snapshot = graph.get_state(config)
        if (rulebook := run.finished(snapshot.values)) is not None:
            return run.stored(rulebook)
        for update in graph.stream(**run.stream(snapshot, config)):
            run.progress(update)
        return Rulebook.model_validate(graph.get_state(config).values["rulebook"])


async def aextract_rules(
    documents: Iterable[DocumentLike],
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
    on_stored: Callable[[], None] | None = None,
    **settings: Any,
) -> Rulebook:
    """Async `extract_rules`: the fan-out's LLM calls run on the event loop."""
    run = _Run.start(
        documents, llm, domain, skip_phases, settings, on_progress, on_stored
    )
    config = run.config(thread_id, max_concurrency, callbacks)
    async with _apersistence(checkpoint) as (saver, answers):
        graph = run.graph(saver, answers, retry)
        snapshot = await graph.aget_state(config)
        if (rulebook := run.finished(snapshot.values)) is not None:
            return run.stored(rulebook)
        async for update in graph.astream(**run.stream(snapshot, config)):
            run.progress(update)
        state = await graph.aget_state(config)
        return Rulebook.model_validate(state.values["rulebook"])
