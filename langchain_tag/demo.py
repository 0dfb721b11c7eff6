"""`tag demo`: the whole method on PEP 8 and a few code snippets, end to end.

1. Extract rules from sections of PEP 8 (bundled: it is in the public domain).
2. Store them in an embedded Chroma database (offline MiniLM embeddings).
3. For each snippet: shortlist rules by similarity, judge each one's condition
   against the snippet, and execute with the matched rules' actions only.

The model is the configured one (`OPENAI_API_KEY` or `OPENAI_BASE_URL`, see
`default_chat_model`) or, with nothing configured, SmolLM2-135M served locally by
llama.cpp (`langchain_tag.local_model`). That one is for offline smoke runs: it
judges poorly and rarely extracts a rule, and the demo says so. When extraction
yields no rule, matching and execution run on the curated PEP 8 rulebook shipped with
the package (`langchain_tag.resources`, written by hand, not extracted), and the demo
says that too.
"""

from __future__ import annotations

import functools
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from langchain_core.documents import Document
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, Field

from langchain_tag._text import slug
from langchain_tag.engine import MatchResult
from langchain_tag.errors import (
    LocalServerError,
    ModelNotConfiguredError,
    UnreliableMatchWarning,
)
from langchain_tag.execution import CODE_TEMPLATE, ActionOnlyExecutor
from langchain_tag.matching import ApplicabilityJudge, DecisionJudge
from langchain_tag.matching.judge import ModelJudge
from langchain_tag.models import configured_model
from langchain_tag.resources import curated_rulebook
from langchain_tag.retrievers import TAGRetriever
from langchain_tag.rules import Rulebook
from langchain_tag.usage import UsageCounter

if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings

    from langchain_tag.extraction.sectioning import Section
    from langchain_tag.local_model import InProcessModel, LocalOpenAIServer

DOMAIN = "Python code style (PEP 8)"
DEFAULT_SECTIONS = ("Imports", "Programming Recommendations")
"""The PEP 8 sections extracted by default: the ones the snippets break."""
OFFLINE_SECTIONS = ("Imports",)
"""The PEP 8 sections the offline model extracts by default: one, since on 2 cores
it reads a section's prompt in ~2 s and writes ~25 tokens a second."""
DEFAULT_WORKDIR = Path(".langchain-tag") / "demo"
PEP8_MAX_SECTION_TOKENS = 1500
CURATED_MIN_RULES = 5
"""With fewer curated rules quoted from the extracted sections, the fallback uses all
of the curated rulebook."""
LOCAL_SERVER_PORT = 38471
"""The offline model server's port when it is free."""
LOCAL_EXTRACTION_TOKENS = 384
"""Longest extraction answer of the offline model (~15 s on 2 cores); a rule takes
~60 tokens of JSON, and a longer answer from SmolLM2 is rarely readable."""
LOCAL_EXECUTION_TOKENS = 300
"""Longest executor answer of the offline model."""


class Snippet(BaseModel):
    """A code snippet to match and execute: a function to complete, as in HumanEval."""

    title: str
    code: str


DEMO_SNIPPETS = (
    Snippet(
        title="wildcard import",
        code='from os.path import *\n\n\ndef config_path(directory):\n    """Return '
        'the path of config.json inside directory."""\n',
    ),
    Snippet(
        title="comparison to None with ==",
        code='def first_missing(values):\n    """Return the index of the first None in '
        'values, or -1."""\n    for index, value in enumerate(values):\n        '
        "if value == None:\n",
    ),
    Snippet(
        title="bare except",
        code='def parse_port(text):\n    """Return text as a port number, or None if '
        'it is not a number."""\n    try:\n        return int(text)\n    except:\n',
    ),
    Snippet(
        title="prefix check by slicing",
        code='def is_private(name):\n    """Return True if name starts with an '
        'underscore."""\n    if name[:1] == "_":\n',
    ),
)
"""Realistic starts of functions, each breaking a PEP 8 recommendation."""


def pep8_text() -> str:
    """PEP 8 as bundled with the package (reStructuredText, public domain)."""
    return (
        resources.files("langchain_tag")
        .joinpath("resources", "pep-0008.rst")
        .read_text(encoding="utf-8")
    )


def pep8_sections(
    titles: Sequence[str] | None = DEFAULT_SECTIONS, max_sections: int | None = None
) -> list[Section]:
    """The sections of PEP 8 to extract from, in document order.

    Args:
        titles: Section titles (a section's own heading, case-insensitive); None
            for the whole document. A long section comes in several parts.
        max_sections: Keep at most this many of them.

    Raises:
        ValueError: A title names no section of PEP 8 (the message lists them), or
            `max_sections` is below 1.
    """
    from langchain_tag.extraction.sectioning import split_sections  # noqa: PLC0415

    if max_sections is not None and max_sections < 1:
        msg = f"--max-sections must be at least 1, got {max_sections}."
        raise ValueError(msg)
    sections = split_sections(
        pep8_text(), "pep-0008", fmt="rst", max_tokens=PEP8_MAX_SECTION_TOKENS
    )
    if titles is not None:
        wanted = {title.strip().casefold() for title in titles if title.strip()}
        chosen = [s for s in sections if _title(s).casefold() in wanted]
        unknown = wanted - {_title(s).casefold() for s in chosen}
        if unknown or not wanted:
            known = ", ".join(dict.fromkeys(_title(s) for s in sections if _title(s)))
            msg = (
                f"PEP 8 has no section titled {', '.join(sorted(unknown)) or '(none)'}"
                f". Its sections are: {known}; or pass --sections all."
            )
            raise ValueError(msg)
        sections = chosen
    return sections[:max_sections]


def _title(section: Section) -> str:
    return section.heading_path[-1] if section.heading_path else ""


# --- the models -------------------------------------------------------------------


@dataclass(frozen=True)
class DemoModels:
    """The model in each of the demo's three roles, and how to describe it."""

    extractor: BaseChatModel
    judge: ModelJudge
    """A chat judge, or offline in this process a decision judge."""
    executor: BaseChatModel
    description: str
    quality_note: str | None = None
    """Shown before and after the results when the model is not one to trust."""
    stop: Callable[[], None] | None = None
    """Ends a local model at once (on Ctrl-C: calls waiting on it then fail at once
    instead of running to their end)."""
    check: Callable[[], None] | None = None
    """Raises `LocalServerError` if a local model server has died: its calls would
    otherwise fail as bare connection errors."""
    offline: bool = False
    """The local model (SmolLM2), not a configured one."""


@contextmanager
def demo_models(
    *,
    offline: bool = False,
    model: str | None = None,
    logprobs: bool = True,
    local_server: bool = False,
) -> Iterator[DemoModels]:
    """The configured model in every role, or SmolLM2 run locally.

    With `OPENAI_API_KEY` or `OPENAI_BASE_URL` set (and not `offline`), the model is
    `default_chat_model()`. Otherwise SmolLM2-135M runs in this process
    (`InProcessModel`: no compiler, any CPU), or with `local_server` (which
    implies `offline`) behind llama.cpp's OpenAI-compatible server, reached by
    `ChatOpenAI` over HTTP. Its answers are JSON-constrained so that they parse; it
    is for offline smoke runs and judges poorly.

    Raises:
        ModelNotConfiguredError: No model is configured and the local one is not
            installed.
    """
    configured = None if offline or local_server else configured_model(model)
    if configured is not None:
        llm = configured.llm
        judge = ApplicabilityJudge(
            llm=llm, logprobs=logprobs, on_error="not_applicable"
        )
        yield DemoModels(llm, judge, llm, f"{configured.name} at {configured.where}")
        return
    from langchain_tag import local_model  # noqa: PLC0415 - only offline

    try:
        path = local_model.smollm2_model_path()
        local = (
            local_model.LocalOpenAIServer(path, port=_stable_port())
            if local_server
            else local_model.InProcessModel(path)
        )
    except (ImportError, FileNotFoundError) as error:
        msg = (
            "No chat model is configured and the offline one is not installed. "
            "Set OPENAI_API_KEY (or OPENAI_BASE_URL and TAG_MODEL for an "
            f"OpenAI-compatible server), or install the offline model: {error}"
        )
        raise ModelNotConfiguredError(msg) from error
    if isinstance(local, local_model.LocalOpenAIServer):
        with local as server:
            yield _local_models(
                server,
                f"SmolLM2-135M-Instruct (llama.cpp server at {server.base_url}, "
                "offline)",
                stop=functools.partial(server.stop, grace=0),
                check=server.check,
            )
        return
    try:
        yield _local_models(
            local,
            "SmolLM2-135M-Instruct (transformers in this process, offline)",
            stop=local.close,
        )
    finally:
        local.close()


def _local_models(
    local: InProcessModel | LocalOpenAIServer,
    description: str,
    *,
    stop: Callable[[], None],
    check: Callable[[], None] | None = None,
) -> DemoModels:
    from langchain_tag.local_model import (  # noqa: PLC0415
        JSON_RESPONSE_FORMAT,
        QUALITY_NOTE,
        InProcessModel,
    )

    # In this process, each snippet's rules are judged as one decision (one pass
    # over the snippet shared by its rules); a llama.cpp server generates a
    # constrained verdict per rule.
    judge: ModelJudge = (
        DecisionJudge(model=local.decision_model(), on_error="not_applicable")
        if isinstance(local, InProcessModel)
        else local.judge(on_error="not_applicable")
    )
    return DemoModels(
        extractor=local.chat_model(
            response_format=JSON_RESPONSE_FORMAT, max_tokens=LOCAL_EXTRACTION_TOKENS
        ),
        judge=judge,
        executor=local.chat_model(max_tokens=LOCAL_EXECUTION_TOKENS),
        description=description,
        quality_note=QUALITY_NOTE,
        stop=stop,
        check=check,
        offline=True,
    )


def _stable_port() -> int | None:
    """`LOCAL_SERVER_PORT` if it is free, else None (any free port).

    The server's address is part of the model's identity, and so of the keys of
    the stored extraction answers: on the same port a re-run reuses them.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the server binds (uvicorn): a previous run's closed connections
        # in TIME_WAIT do not count, only a process listening there does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", LOCAL_SERVER_PORT))
        except OSError:
            return None
    return LOCAL_SERVER_PORT


# --- what the demo reports --------------------------------------------------------


class MatchedRule(BaseModel):
    """One rule matched to a snippet."""

    rule_id: str
    name: str
    score: float | None = Field(description="P(YES) from logprobs, when available.")


class SnippetReport(BaseModel):
    """What happened to one snippet."""

    title: str
    code: str
    judged: int = Field(description="Rules judged after the similarity shortlist.")
    matches: list[MatchedRule]
    failed_rule_ids: list[str]
    empty_reason: str | None
    answer: str | None = Field(description="The executor's code, if it parsed.")
    answer_error: str | None
    llm_calls: int
    judging_calls: int = Field(
        description="Of `llm_calls`, the judgments' (one per rule with a chat "
        "judge, one request for all with a decision model)."
    )
    input_tokens: int
    output_tokens: int
    matching_seconds: float = Field(description="Judging the shortlisted rules.")
    seconds: float


class ExtractionCost(BaseModel):
    """What extracting the rulebook took."""

    sections: list[str] = Field(description="Titles of the PEP 8 sections used.")
    llm_calls: int
    input_tokens: int
    output_tokens: int
    seconds: float
    problems: dict[str, dict[str, int]] = Field(
        description="Per phase, what validation dropped or repaired, by reason."
    )


class DemoReport(BaseModel):
    """Everything `run_demo` did, as printed."""

    model: str
    quality_note: str | None
    rules: int
    rulebook_path: str
    extraction: ExtractionCost | None = Field(
        description="None when an existing rulebook was given."
    )
    curated: bool = Field(
        default=False,
        description="Extraction produced no rules, so the rules matched are the "
        "curated PEP 8 rulebook's (written by hand, not extracted).",
    )
    snippets: list[SnippetReport]
    seconds: float


# --- the run ----------------------------------------------------------------------


def run_demo(
    models: DemoModels,
    *,
    workdir: str | Path = DEFAULT_WORKDIR,
    sections: Sequence[Section] | None = None,
    rulebook: Rulebook | None = None,
    snippets: Sequence[Snippet] = DEMO_SNIPPETS,
    embedding: Embeddings | None = None,
    prefilter_k: int = 5,
    max_concurrency: int = 4,
    out: TextIO = sys.stdout,
) -> DemoReport:
    """Extract, store, match and execute, printing what happens as it happens.

    Args:
        models: The models (see `demo_models`).
        workdir: Where the rulebook, the extraction checkpoint and the Chroma
            database go. A re-run with the same model resumes or reuses them.
        sections: PEP 8 sections to extract from; default `pep8_sections()`.
        rulebook: Match against these rules instead of extracting any.
        snippets: The code to match and execute.
        embedding: For the rule store; default the offline `LocalMiniLMEmbeddings`.
        prefilter_k: Rules shortlisted by similarity per snippet before judging.
        max_concurrency: LLM calls in flight at most.
        out: Where the report is printed, progress included.
    """
    from langchain_tag.matching.store import RuleStore  # noqa: PLC0415 - loads chromadb

    started = time.perf_counter()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    say = functools.partial(print, file=out, flush=True)
    say(f"model: {models.description}")
    if models.quality_note:
        say(f"note: {models.quality_note}")
    say()
    extraction = None
    chosen: list[Section] = []
    if rulebook is None:
        chosen = list(pep8_sections() if sections is None else sections)
        with _watched(models, "extracting rules", "matching and executing"):
            rulebook, extraction = _extract(
                models.extractor, chosen, workdir, max_concurrency, say, started
            )
    else:
        say(f"1. Using {len(rulebook)} given rule(s), not extracted")
    name = "pep8" if extraction else "given"
    rulebook_path = workdir / f"{name}.rulebook.json"
    rulebook.save(rulebook_path)
    _say_rules(say, rulebook, extraction, rulebook_path)
    curated = extraction is not None and not len(rulebook)
    if curated:
        rulebook = curated_pep8_rules(chosen)
        rulebook_path = workdir / "curated-pep8.rulebook.json"
        rulebook.save(rulebook_path)
        say(
            "   Extraction produced no rules with this model, so matching and "
            "execution run on the curated PEP 8 rulebook shipped with the package "
            f"(written by hand, not extracted): {len(rulebook)} rule(s), saved to "
            f"{rulebook_path}"
        )
        _list_rules(say, rulebook)

    say()
    store = RuleStore(
        embedding, collection_name="pep8_demo", persist_directory=workdir / "chroma"
    )
    synced = store.sync(rulebook)
    say(
        f"2. Stored {store.count()} rule(s) in embedded Chroma at {workdir / 'chroma'} "
        f"({synced.added} added, {synced.updated} updated, {synced.removed} removed, "
        f"{synced.unchanged} unchanged)"
    )
    retriever = TAGRetriever(
        rulebook=rulebook,
        judge=models.judge,
        max_concurrency=max_concurrency,
        # An empty store has nothing to shortlist (and Chroma rejects k=0); the
        # retriever then reports that the rulebook is empty.
        prefilter=store.as_prefilter(k=min(prefilter_k, len(rulebook)))
        if len(rulebook)
        else None,
    )
    executor = ActionOnlyExecutor(llm=models.executor, template=CODE_TEMPLATE)

    say()
    say(
        f"3. Matching {len(snippets)} snippet(s): the {prefilter_k} most similar "
        f"rules are judged, {_how_judged(models.judge)}; the matched rules' actions "
        "(only those) go to the executor"
    )
    reports = []
    for number, snippet in enumerate(snippets, 1):
        say()
        say(f"[{number}/{len(snippets)}] {snippet.title}")
        say(_indent(snippet.code, 6))
        left = f"snippets {number}-{len(snippets)}" if number < len(snippets) else ""
        with _watched(
            models,
            f"matching snippet {number}",
            f"matching and executing {left or f'snippet {number}'}",
        ):
            reports.append(_run_snippet(snippet, retriever, executor))
        _say_snippet(say, reports[-1])

    total = time.perf_counter() - started
    say()
    say(
        f"total: {total:.1f} s"
        + (
            f"; extraction {extraction.llm_calls} LLM call(s) "
            f"({extraction.input_tokens} tokens in, {extraction.output_tokens} out, "
            f"{extraction.seconds:.1f} s)"
            if extraction
            else ""
        )
        + f"; matching {sum(r.matching_seconds for r in reports):.1f} s; "
        f"matching and execution {sum(r.llm_calls for r in reports)} call(s) "
        f"({sum(r.input_tokens for r in reports)} tokens in, "
        f"{sum(r.output_tokens for r in reports)} out)"
    )
    if models.quality_note:
        say(f"note: {models.quality_note}")
    return DemoReport(
        model=models.description,
        quality_note=models.quality_note,
        rules=len(rulebook),
        rulebook_path=str(rulebook_path),
        extraction=extraction,
        curated=curated,
        snippets=reports,
        seconds=total,
    )


def _how_judged(judge: ModelJudge) -> str:
    if isinstance(judge, DecisionJudge):
        return (
            "in one decision request (each rule's P(yes) read from one pass over "
            "the snippet, nothing generated)"
        )
    return "one LLM call each"


@contextmanager
def _watched(models: DemoModels, doing: str, not_done: str) -> Iterator[None]:
    """Turn a dead local model server's connection errors into what happened.

    The judge counts a failed call as not applicable and goes on, so the server is
    checked after the step as well as when it raises.
    """
    if models.check is None:
        yield
        return

    try:
        try:
            yield
        except Exception:
            models.check()
            raise
        models.check()
    except LocalServerError as error:
        msg = f"{error}\nThe demo stopped while {doing}; not done: {not_done}."
        raise LocalServerError(msg, returncode=error.returncode) from error


def _extract(
    llm: BaseChatModel,
    sections: Sequence[Section],
    workdir: Path,
    max_concurrency: int,
    say: Callable[[str], None],
    started: float,
) -> tuple[Rulebook, ExtractionCost]:
    from langchain_tag.extraction import ExtractionReport, extract_rules  # noqa: PLC0415

    titles = list(dict.fromkeys(_title(s) or "(preamble)" for s in sections))
    listed = ", ".join(titles)
    say(f"1. Extracting rules from PEP 8, {len(sections)} section(s): {listed}")
    last = ""

    def progress(node: str, _done: int) -> None:
        # One line each time extraction moves on to another step.
        nonlocal last
        if node != last:
            say(f"   [{time.perf_counter() - started:6.1f} s] {node}")
            last = node

    rulebook = extract_rules(
        [
            Document(
                page_content=s.text,
                id=f"pep8-{slug(_title(s), 'preamble')}",
                metadata={
                    "source": "pep-0008.rst",
                    "section": " > ".join(s.heading_path),
                },
            )
            for s in sections
        ],
        llm=llm,
        domain=DOMAIN,
        checkpoint=workdir / "extraction.sqlite",
        max_concurrency=max_concurrency,
        max_section_tokens=PEP8_MAX_SECTION_TOKENS,
        on_progress=progress,
    )
    report = ExtractionReport.model_validate(rulebook.diagnostics)
    phases = report.phases.values()
    return rulebook, ExtractionCost(
        sections=titles,
        llm_calls=sum(p.calls for p in phases),
        input_tokens=sum(p.input_tokens for p in phases),
        output_tokens=sum(p.output_tokens for p in phases),
        seconds=report.seconds,
        problems={name: p.problems for name, p in report.phases.items() if p.problems},
    )


def curated_pep8_rules(sections: Sequence[Section]) -> Rulebook:
    """The curated PEP 8 rulebook, restricted to the rules quoted from `sections`.

    The whole of it when fewer than `CURATED_MIN_RULES` of its rules have their
    source inside those sections (or no section is given).
    """
    curated = curated_rulebook("pep8")
    within = [
        rule
        for rule in curated.rules
        if rule.source is not None
        and any(
            rule.source.document_id == s.document_id
            and s.start <= rule.source.start
            and rule.source.end <= s.end
            for s in sections
        )
    ]
    if len(within) < CURATED_MIN_RULES:
        return curated
    return Rulebook(
        domain=curated.domain,
        rules=within,
        documents=curated.documents,
        diagnostics={
            **curated.diagnostics,
            "demo_sections": list(dict.fromkeys(_title(s) for s in sections)),
            "demo_subset": f"{len(within)} of the {len(curated)} curated rules",
        },
    )


def _say_rules(
    say: Callable[[str], None],
    rulebook: Rulebook,
    extraction: ExtractionCost | None,
    path: Path,
) -> None:
    cost = (
        f"{extraction.llm_calls} LLM call(s), {extraction.seconds:.1f} s; "
        if extraction
        else ""
    )
    say(f"   rules found: {len(rulebook)} ({cost}saved to {path})")
    _list_rules(say, rulebook)
    if len(rulebook):
        return
    if extraction is None:
        say(
            "   No rules, so nothing can match below; the executor still runs, with "
            "no guidance."
        )
        return
    # run_demo goes on with the curated rulebook and says so.
    dropped = "; ".join(
        f"{phase}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        for phase, counts in extraction.problems.items()
    )
    if dropped:
        say(
            "   The model's answers did not survive validation and the faithfulness "
            f"check (what was dropped: {dropped})."
        )


def _list_rules(say: Callable[[str], None], rulebook: Rulebook, shown: int = 5) -> None:
    for rule in rulebook.rules[:shown]:
        say(f"   - {rule.rule_id}: {rule.name}")
        say(f"       when: {_one_line(rule.condition)}")
        say(f"       do:   {_one_line(rule.action)}")
    if len(rulebook) > shown:
        say(f"   ... and {len(rulebook) - shown} more")


def _run_snippet(
    snippet: Snippet, retriever: TAGRetriever, executor: ActionOnlyExecutor
) -> SnippetReport:
    usage = UsageCounter()
    config: Any = {"callbacks": [usage]}
    started = time.perf_counter()
    with warnings.catch_warnings():
        # Failed judgments are reported below, by rule id.
        warnings.simplefilter("ignore", UnreliableMatchWarning)
        result: MatchResult = retriever.match(snippet.code, config)
    matched = time.perf_counter()
    answer, answer_error = None, None
    try:
        answer = executor.invoke(
            {"input": snippet.code, "rules": result.documents}, config
        )
    except OutputParserException as error:
        # The first line says what was wrong; langchain adds a link after it.
        answer_error = str(error).splitlines()[0]
    return SnippetReport(
        title=snippet.title,
        code=snippet.code,
        judged=len(result.verdicts),
        # A matched rule's document carries its id, name and score in its metadata.
        matches=[MatchedRule.model_validate(d.metadata) for d in result.documents],
        failed_rule_ids=result.failed_rule_ids,
        empty_reason=result.reason,
        answer=answer,
        answer_error=answer_error,
        llm_calls=usage.calls,
        judging_calls=result.usage.calls if result.usage is not None else 0,
        input_tokens=usage.usage.input_tokens or 0,
        output_tokens=usage.usage.output_tokens or 0,
        matching_seconds=matched - started,
        seconds=time.perf_counter() - started,
    )


def _say_snippet(say: Callable[[str], None], report: SnippetReport) -> None:
    say(f"   judged {report.judged} rule(s), matched {len(report.matches)}:")
    for match in report.matches:
        score = "  -  " if match.score is None else f"{match.score:.3f}"
        say(f"     {score}  {match.rule_id}  {match.name}")
    if report.empty_reason:
        say(f"     (none: {report.empty_reason})")
    if report.failed_rule_ids:
        say(
            f"   {len(report.failed_rule_ids)} judgment(s) failed and count as not "
            f"applicable: {', '.join(report.failed_rule_ids)}"
        )
    if report.answer is not None:
        say("   answer:")
        say(_indent(report.answer, 6))
    else:
        say(f"   no usable answer: {report.answer_error}")
    say(
        f"   {report.llm_calls} model call(s) ({report.judged} judgment(s) in "
        f"{report.judging_calls} call(s), 1 execution); tokens: "
        f"{report.input_tokens} in, {report.output_tokens} out; matching "
        f"{report.matching_seconds:.1f} s, in all {report.seconds:.1f} s"
    )


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line.strip() else "" for line in text.splitlines())


def _one_line(text: str) -> str:
    return " ".join(text.split())
