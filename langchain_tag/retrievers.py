"""`TAGRetriever`: applicability retrieval as a drop-in LangChain retriever.

Where a similarity retriever returns the passages most like the query, `TAGRetriever`
returns the rules whose condition the query satisfies, one judgment per rule, each
returned as a `Document` whose content is the rule's action (the executor sees only
actions, principle P3). It is a thin face over `langchain_tag.engine.MatchEngine`,
which the query graph and the agent middleware run too.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForRetrieverRun,
    CallbackManager,
    CallbackManagerForRetrieverRun,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, ensure_config
from pydantic import ConfigDict, Field, PrivateAttr

from langchain_tag._text import check_text
from langchain_tag.engine import (
    MATCH_EVENT,
    MatchEngine,
    MatchOptions,
    MatchResult,
)
from langchain_tag.errors import RulebookError
from langchain_tag.matching import BaseJudge
from langchain_tag.matching.profiles import profile_for
from langchain_tag.rules import Rulebook
from langchain_tag.settings import JudgeModel, MatchSettings

__all__ = ["TAGRetriever"]

logger = logging.getLogger(__name__)

_PER_CALL = ("k", "filter", "score_threshold")


class TAGRetriever(BaseRetriever, MatchSettings):
    """Retrieve the rules whose condition the query satisfies.

    Each candidate rule gets one applicability judgment; the rules judged applicable
    come back as `Document(id=rule_id, page_content=action, metadata={...})`, ordered
    by relevance score (logprob-based when available, else 1.0), then rulebook order.

    Setup:
        ```bash
        pip install langchain-tag
        export OPENAI_API_KEY=...  # or pass any chat model as llm=
        ```

    Instantiate:
        ```python
        from langchain_tag import TAGRetriever

        retriever = TAGRetriever.from_rulebook("pep8.rulebook.json", llm=llm, k=5)
        ```

    Invoke:
        ```python
        docs = retriever.invoke("from os import *")
        docs[0].metadata["rule_id"], docs[0].page_content
        ```

    Use within a chain: anywhere a vector store's `as_retriever()` was used; the
    documents' `page_content` is what the executor should follow.

    Per call, `invoke(query, k=..., filter=..., score_threshold=...)` overrides the
    fields of the same names. When nothing applies the result is `[]`, and the reason
    is in the `tag_match` custom event of the run (and in `match(...).reason`).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    rulebook: Rulebook
    """The rules to retrieve from."""
    judge: BaseJudge = Field(default=None)  # type: ignore[assignment]
    """Judges each (query, rule) pair; built from `llm` and the other options
    (`MatchSettings`) by the rulebook's rule schema when not given."""

    _engine: MatchEngine | None = PrivateAttr(default=None)
    _engine_of: tuple[Any, ...] = PrivateAttr(default=())
    _engine_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        # None until built here: the field's type is what users read after.
        if cast("BaseJudge | None", self.judge) is None:
            self.judge = self.build_judge(profile_for(self.rulebook))
        _ = self.engine  # a bad combination of options fails here, not at use

    @property
    def engine(self) -> MatchEngine:
        """The matching engine this retriever runs (the query graph runs the same).

        Built from `judge`, `prefilter`, `explore`, `retrain_every` and
        `max_concurrency`, and built again when one of them is set anew (on this
        retriever or on a `model_copy`): the engine keeps the concurrency bound,
        the shadow-judging counts and the retrainer across retrievals.
        """
        settings = (
            id(self.judge),
            id(self.prefilter),
            self.explore,
            self.retrain_every,
            self.max_concurrency,
        )
        with self._engine_lock:
            if self._engine is None or settings != self._engine_of:
                self._engine = self.build_engine(judge=self.judge)
                self._engine_of = settings
            return self._engine

    @classmethod
    def from_rulebook(
        cls,
        rulebook: Rulebook | str | os.PathLike[str],
        llm: JudgeModel | None = None,
        **kwargs: Any,
    ) -> TAGRetriever:
        """Build a retriever over a rulebook object or file.

        Args:
            rulebook: A `Rulebook`, or the path of a rulebook JSON file.
            llm: The judge model: a chat model, a decision model, or a model
                string; default from the environment (`default_judge_model`).
                Ignored if `judge=` is passed.
            **kwargs: Other options (`MatchSettings`: `k`, `score_threshold`,
                `filter`, `prefilter`, `cache`, `max_concurrency`, `judge`, ...).
        """
        if not isinstance(rulebook, Rulebook):
            rulebook = Rulebook.load(rulebook)
        if kwargs.get("judge") is None:
            kwargs["llm"] = llm
        return cls(rulebook=rulebook, **kwargs)

    @classmethod
    def from_documents(
        cls,
        documents: Iterable[Document | str | os.PathLike[str]],
        llm: JudgeModel | None = None,
        *,
        rulebook_path: str | os.PathLike[str] | None = None,
        domain: str = "instruction",
        extraction: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> TAGRetriever:
        """Extract a rulebook from documents, then retrieve over it.

        A rulebook file at `rulebook_path` is loaded only if it records the same
        documents: the same ids (as extraction gives them) with the same content
        (SHA-256); their order and source paths do not matter. If documents were
        added, removed or edited, a warning names them, the rulebook is extracted
        again and the file replaced. Under a persistent checkpoint (the default)
        that costs only the changed sections' calls; with `extraction=
        {"checkpoint": None}` every section is sent again. The domain and the
        extraction settings are not compared: delete the file to apply new ones.

        Args:
            documents: LangChain documents from any loader, strings, or paths
                (`pathlib.Path`) of PDF, HTML, DOCX or text files, loaded once
                by `load_document`.
            llm: The model for extraction and judging; default from the environment.
                A decision model judges only: extraction then uses the
                environment's chat model (`default_chat_model`).
            rulebook_path: Where to keep the rulebook (saved atomically); see above.
            domain: What the documents govern, for the extraction prompts.
            extraction: Other `extract_rules` arguments (`checkpoint`,
                `skip_phases`, `max_concurrency`, ...).
            **kwargs: `TAGRetriever` fields (`k`, `judge`, ...).

        Raises:
            RulebookError: The file at `rulebook_path` records no documents (it was
                not extracted), so it cannot be checked; it is left untouched.
            DocumentError: A path's file cannot be loaded (empty, scanned,
                encrypted, damaged); the message names it. No model is called.
        """
        # Imported here: extraction loads langgraph.
        from langchain_tag.extraction import extract_rules  # noqa: PLC0415
        from langchain_tag.extraction.documents import to_documents  # noqa: PLC0415
        from langchain_tag.extraction.run import changed_documents  # noqa: PLC0415

        docs = to_documents(documents)  # loaded once: compared, then extracted
        path = None if rulebook_path is None else Path(rulebook_path)
        if path is not None and path.exists():
            rulebook = Rulebook.load(path)
            if not rulebook.documents:
                raise RulebookError(
                    path,
                    "records no source documents, so it cannot be checked against "
                    "the documents given.",
                    "Load it with TAGRetriever.from_rulebook(Rulebook.load(path)), "
                    "or delete it to extract the documents again.",
                )
            changes = changed_documents(rulebook.documents, docs)
            if not any(changes.values()):
                return cls.from_rulebook(rulebook, llm=llm, **kwargs)
            changed = "; ".join(
                f"{what}: {', '.join(ids)}" for what, ids in changes.items() if ids
            )
            logger.warning(
                "Rulebook %s was extracted from other documents (%s): extracting "
                "again.",
                path,
                changed,
            )
        extractor = llm if isinstance(llm, BaseChatModel) else None
        rulebook = extract_rules(
            docs, llm=extractor, domain=domain, **dict(extraction or {})
        )
        if path is not None:
            rulebook.save(path)
        return cls.from_rulebook(rulebook, llm=llm, **kwargs)

    @classmethod
    def from_vectorstore(
        cls,
        vectorstore: Any,
        llm: JudgeModel | None = None,
        **kwargs: Any,
    ) -> TAGRetriever:
        """Extract rules from the documents already stored in a Chroma collection.

        Chunks that carry `source` and `start_index` metadata (as LangChain's text
        splitters add with `add_start_index=True`) are reassembled into their
        documents first, so sections and source offsets refer to the whole text;
        other chunks are extracted as documents of their own.

        Args:
            vectorstore: A `langchain_chroma.Chroma` store (anything with Chroma's
                `get(include=[...])`).
            llm: The model for extraction and judging.
            **kwargs: As for `from_documents`.
        """
        stored = vectorstore.get(include=["documents", "metadatas"])
        chunks = [
            Document(page_content=text or "", metadata=metadata or {}, id=chunk_id)
            for chunk_id, text, metadata in zip(
                stored["ids"], stored["documents"], stored["metadatas"], strict=True
            )
        ]
        return cls.from_documents(reassemble_chunks(chunks), llm, **kwargs)

    # -- public API beyond BaseRetriever ----------------------------------------------

    def options(self, **overrides: Any) -> MatchOptions:
        """This retriever's `k`, `filter` and `score_threshold`, with per-call ones.

        Raises:
            TypeError: An override is not one of those three.
            ValueError: A value is out of range.
        """
        unknown = sorted(set(overrides) - set(_PER_CALL))
        if unknown:
            msg = (
                f"TAGRetriever got unknown keyword argument(s) {', '.join(unknown)}; "
                f"per call it takes {', '.join(_PER_CALL)}."
            )
            raise TypeError(msg)
        chosen = {name: getattr(self, name) for name in _PER_CALL}
        return MatchOptions(**{**chosen, **overrides})

    def match(
        self, query: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> MatchResult:
        """Retrieve, returning every verdict and the empty-result reason as well.

        One retriever run, as `invoke` makes (`invoke` returns its documents).
        """
        options, run_id = self._checked(query, kwargs)
        config = ensure_config(config)
        run_manager = CallbackManager.configure(
            **self._callbacks(config)
        ).on_retriever_start(None, query, name=self._run_name(config), run_id=run_id)
        try:
            result = self._match(query, options, run_manager, config)
        except BaseException as error:
            run_manager.on_retriever_error(error)
            raise
        run_manager.on_retriever_end(result.documents)
        return result

    async def amatch(
        self, query: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> MatchResult:
        """Async `match`."""
        options, run_id = self._checked(query, kwargs)
        config = ensure_config(config)
        run_manager = await AsyncCallbackManager.configure(
            **self._callbacks(config)
        ).on_retriever_start(None, query, name=self._run_name(config), run_id=run_id)
        try:
            result = await self._amatch(query, options, run_manager, config)
        except BaseException as error:
            await run_manager.on_retriever_error(error)
            raise
        await run_manager.on_retriever_end(result.documents)
        return result

    # -- BaseRetriever ----------------------------------------------------------------

    def invoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        """Retrieve the applicable rules; per call: `k`, `filter`, `score_threshold`.

        An empty or blank query is judged against no rule and returns `[]`.
        """
        return self.match(input, config, **kwargs).documents

    async def ainvoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        """Async `invoke`."""
        return (await self.amatch(input, config, **kwargs)).documents

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        return self._match(query, self.options(**kwargs), run_manager).documents

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        **kwargs: Any,
    ) -> list[Document]:
        result = await self._amatch(query, self.options(**kwargs), run_manager)
        return result.documents

    # -- the run around the engine ----------------------------------------------------

    def _checked(
        self, query: object, kwargs: dict[str, Any]
    ) -> tuple[MatchOptions, Any]:
        """Query, options and run id, refused before any run or judgment."""
        check_text(query, "The query")
        run_id = kwargs.pop("run_id", None)
        self.rulebook.check()
        return self.options(**kwargs), run_id

    def _callbacks(self, config: RunnableConfig) -> dict[str, Any]:
        """The callback manager's arguments, as `BaseRetriever.invoke` gives them."""
        return {
            "inheritable_callbacks": config.get("callbacks"),
            "local_callbacks": None,
            "inheritable_tags": config.get("tags"),
            "local_tags": self.tags,
            "inheritable_metadata": {
                **(config.get("metadata") or {}),
                **self._get_ls_params(),
            },
            "local_metadata": self.metadata,
        }

    def _run_name(self, config: RunnableConfig) -> str:
        return str(config.get("run_name") or self.get_name())

    def _match(
        self,
        query: str,
        options: MatchOptions,
        run_manager: CallbackManagerForRetrieverRun,
        config: RunnableConfig | None = None,
    ) -> MatchResult:
        child = _child_config(run_manager, config)
        result = self.engine.match(query, self.rulebook.rules, options, child)
        dispatch_custom_event(MATCH_EVENT, result.summary(), config=child)
        return result

    async def _amatch(
        self,
        query: str,
        options: MatchOptions,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        config: RunnableConfig | None = None,
    ) -> MatchResult:
        child = _child_config(run_manager, config)
        result = await self.engine.amatch(query, self.rulebook.rules, options, child)
        await adispatch_custom_event(MATCH_EVENT, result.summary(), config=child)
        return result


def _child_config(
    run_manager: CallbackManagerForRetrieverRun | AsyncCallbackManagerForRetrieverRun,
    config: RunnableConfig | None,
) -> RunnableConfig:
    """The engine's config: this run's callbacks, the caller's concurrency bound.

    `max_concurrency` (as `batch` passes it) bounds this call's judgments within the
    retriever's own bound.
    """
    child: RunnableConfig = {"callbacks": run_manager.get_child()}
    limit = (config or {}).get("max_concurrency")
    if limit is not None:
        child["max_concurrency"] = limit
    return child


def reassemble_chunks(chunks: Sequence[Document]) -> list[Document]:
    """Rebuild documents from overlapping chunks that know their source and offset.

    Chunks with `metadata["source"]` and an integer `metadata["start_index"]` are laid
    back at their offsets (overlaps agree, so later chunks just extend the text, and
    a gap, whitespace the splitter stripped, becomes newlines); the others are
    returned as they are, in their original order.
    """
    placed: dict[str, list[Document]] = defaultdict(list)
    loose: list[Document] = []
    for chunk in chunks:
        source, start = chunk.metadata.get("source"), chunk.metadata.get("start_index")
        if isinstance(source, str) and isinstance(start, int):
            placed[source].append(chunk)
        else:
            loose.append(chunk)
    documents = []
    for source, parts in placed.items():
        text = ""
        for part in sorted(parts, key=lambda c: c.metadata["start_index"]):
            start = part.metadata["start_index"]
            # Splitters strip the whitespace they cut at; newlines fill exactly that
            # gap, so every later chunk lands at its own offset.
            text = text.ljust(start, "\n")[:start] + part.page_content
        documents.append(Document(page_content=text, metadata={"source": source}))
    return documents + loose
