"""The chat model the notebooks and demos run with, and a note saying which it is."""

from __future__ import annotations

from langchain_core.language_models import BaseChatModel

from langchain_tag.models import configured_model
from langchain_tag.testing.extraction import JudgeAndExtractorFakeChatModel

OFFLINE_NOTE = (
    "**Offline run: the results below come from a fake model, not an LLM.** "
    "Neither `OPENAI_API_KEY` nor `OPENAI_BASE_URL` is set, so "
    "`JudgeAndExtractorFakeChatModel` plays the LLM's roles deterministically, for "
    "demonstration: as extractor it turns sentences with normative cue words into "
    "rules; as judge it answers YES when a backtick-quoted fragment of a rule's "
    "condition occurs in the input; as executor it echoes the prompt it was given, "
    "so you see exactly what reached it. The code paths are the real ones; the "
    "answers say nothing about model quality. Set `OPENAI_API_KEY` (or "
    "`OPENAI_BASE_URL` and `TAG_MODEL` for an OpenAI-compatible server) and run "
    "again to use a real model."
)


class NotebookModel:
    """The chat model a notebook or demo runs with, and a note saying which it is.

    Displayed in Jupyter it renders that note as Markdown (and `print` shows it), so
    a reader always knows whether results come from a real model or the fake.
    """

    def __init__(
        self, llm: BaseChatModel, *, offline: bool, description: str = ""
    ) -> None:
        """Wrap `llm`; `offline` says it is the deterministic fake."""
        self.llm = llm
        self.offline = offline
        self.description = description or type(llm).__name__

    @property
    def note(self) -> str:
        """Which model runs, as Markdown."""
        if self.offline:
            return OFFLINE_NOTE
        return (
            f"**Real model:** {self.description}, configured from the environment "
            "(`OPENAI_API_KEY` / `OPENAI_BASE_URL`, `TAG_MODEL`)."
        )

    def __str__(self) -> str:
        """The note."""
        return self.note

    _repr_markdown_ = __str__  # Jupyter renders the note as Markdown

    def __repr__(self) -> str:
        """The model's class and whether it is the offline fake."""
        return f"NotebookModel({type(self.llm).__name__}, offline={self.offline})"


def notebook_model() -> NotebookModel:
    """The model for notebooks and demos: a real one when configured, else the fake.

    With `OPENAI_API_KEY` or `OPENAI_BASE_URL` set this is `default_chat_model()`;
    otherwise a `JudgeAndExtractorFakeChatModel`, so the notebooks run top to bottom
    offline (with `OFFLINE_NOTE` shown, since the fake's answers are no evidence of
    quality).
    """
    configured = configured_model()
    if configured is not None:
        return NotebookModel(
            configured.llm,
            offline=False,
            description=f"`{configured.name}` at {configured.where}",
        )
    return NotebookModel(JudgeAndExtractorFakeChatModel(), offline=True)
