"""Loaders for the real evaluation data: RuleArena-NBA, ObliQA, HumanEval and WNC.

The data lives in the shared data directory
(`langchain_tag_experiments.data.shared_data_dir`, overridden by `$TAG_DATA_DIR`),
never in the package. Each loader reads its folder,
checks what it reads, and returns pydantic records; a missing or malformed file
raises an error that names the file and what to do.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import io
import json
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from langchain_core.documents import Document
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from langchain_tag._text import read_text
from langchain_tag.errors import TAGError, TextEncodingError
from langchain_tag.rules import Rule, Rulebook, SourceDocument, SourceSpan
from langchain_tag_experiments.data import DATA_DIR_ENV, shared_data_dir

__all__ = [
    "DataNotFoundError",
    "DatasetError",
    "HumanEvalProblem",
    "LabelledInput",
    "NBADataWarning",
    "NBADataset",
    "NBAProblem",
    "ObliQADataset",
    "ObliQAPassage",
    "ObliQAQuestion",
    "WNCPair",
    "load_humaneval",
    "load_labelled",
    "load_nba",
    "load_obliqa",
    "load_wnc",
    "obliqa_document_key",
    "pep8_path",
]

NBA_DIR = "rulearena_nba"
OBLIQA_DIR = "obliqa_sample"
HUMANEVAL_FILE = "humaneval/HumanEval.jsonl.gz"
PEP8_FILE = "pep8/pep-0008.rst"
WNC_DIR = "wnc_sample"

_T = TypeVar("_T")

PASSAGE_SEPARATOR = "\n\n"
"""What joins an ObliQA document's passages into the text TAG extracts from."""


class DatasetError(TAGError, ValueError):
    """A data file is malformed: the message names the file and the record."""


class DataNotFoundError(DatasetError, FileNotFoundError):
    """The shared data directory or one of its files is missing."""


def _data_dir(data_dir: str | os.PathLike[str] | None) -> Path:
    found = shared_data_dir(data_dir)
    if found is None:
        where = data_dir or os.environ.get(DATA_DIR_ENV) or "../shared/data"
        msg = (
            f"No shared data directory at {where}. Pass data_dir, or set "
            f"{DATA_DIR_ENV} to the directory holding rulearena_nba/, obliqa_sample/, "
            "humaneval/ and wnc_sample/."
        )
        raise DataNotFoundError(msg)
    return found


def _file(data_dir: Path, relative: str) -> Path:
    path = data_dir / relative
    if not path.is_file():
        msg = (
            f"{path} not found. The shared data directory {data_dir} lacks "
            f"{relative}; point {DATA_DIR_ENV} (or data_dir) at a complete copy."
        )
        raise DataNotFoundError(msg)
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        msg = f"{path} is not valid UTF-8 JSON ({exc}); restore it from the source."
        raise DatasetError(msg) from None


def _json_lines(path: Path, lines: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """`("line N", record)` for each non-blank line of a JSON-lines file."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except json.JSONDecodeError as exc:
            msg = f"{path} line {number} is not valid JSON ({exc.msg})."
            raise DatasetError(msg) from None


def _json_list(path: Path, what: str) -> Iterator[tuple[str, Any]]:
    """`(f"{what} N", entry)` for each entry of a file holding a JSON list."""
    entries = _read_json(path)
    if not isinstance(entries, list):
        msg = f"{path} is not a JSON list of {what}s."
        raise DatasetError(msg)
    return ((f"{what} {i}", entry) for i, entry in enumerate(entries))


def _invalid(path: Path, where: str, exc: ValidationError) -> DatasetError:
    problems = "; ".join(
        f"{'.'.join(map(str, e['loc'])) or '(record)'}: {e['msg']}"
        for e in exc.errors()
    )
    return DatasetError(f"{path} {where}: {problems}.")


def _build_all(
    path: Path, items: Iterable[tuple[str, Any]], build: Callable[[Any], _T]
) -> list[_T]:
    """`build` each record, turning a bad one into an error naming file and record."""
    built: list[_T] = []
    where = "at the start"
    try:
        for where, item in items:  # noqa: B007 - `where` names the failing record
            built.append(build(item))
    except DatasetError:
        raise
    except KeyError as exc:
        msg = f"{path} {where}: field {exc} is missing."
        raise DatasetError(msg) from None
    except ValidationError as exc:
        raise _invalid(path, where, exc) from None
    except (TypeError, ValueError) as exc:
        msg = f"{path} {where}: {exc}."
        raise DatasetError(msg) from None
    return built


# --- RuleArena-NBA ------------------------------------------------------------------


class NBADataWarning(UserWarning):
    """A RuleArena-NBA record was accepted after a correction; the message says which.

    RuleArena's own files hold a problem (in `comp_1`) whose `answer` is false while
    `illegal_operation` and `problematic_team` are set. `answer` is the primary
    gold label, so it decides: the violation fields are ignored.
    """


_BOOL = TypeAdapter(bool)
_VIOLATION_FIELDS = ("illegal_operation", "problematic_team")
NBA_SOURCE = "source"
"""Validation-context key naming where an `NBAProblem` record comes from (its file),
for the messages of `NBADataWarning`."""


class NBAProblem(BaseModel):
    """One RuleArena-NBA problem with its gold answer and gold rule labels.

    `answer` decides: a record whose answer is false but which names an illegal
    operation or a problematic team is accepted with both cleared, and an
    `NBADataWarning` names it (and its file, when validated with
    `context={NBA_SOURCE: path}`). A record whose answer is true must name both.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    level: int = Field(ge=0, le=2)
    text: str = Field(description="What the judge and the executor see.")
    team_situations: tuple[str, ...]
    player_situations: tuple[str, ...]
    operations: tuple[str, ...]
    gold_rule_ids: list[str] = Field(
        description="Catalogue rule ids, aliases resolved, duplicates removed."
    )
    dropped_labels: tuple[str, ...] = Field(
        default=(), description="Gold labels that name no catalogue rule (dropped)."
    )
    answer: bool = Field(description="True if some operation violates the rules.")
    illegal_operation: str | None = None
    problematic_team: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _answer_decides(cls, data: Any, info: ValidationInfo) -> Any:
        """An all-legal answer with a violation named: keep the answer, warn."""
        if not isinstance(data, Mapping):
            return data
        try:
            answer = _BOOL.validate_python(data.get("answer"))
        except ValidationError:
            return data  # the field's own validation reports it
        named = {f: data[f] for f in _VIOLATION_FIELDS if data.get(f) is not None}
        if answer or not named:
            return data
        context = info.context if isinstance(info.context, Mapping) else {}
        source = context.get(NBA_SOURCE)
        where = f" in {source}" if source else ""
        fields = ", ".join(f"{name}={value!r}" for name, value in named.items())
        warnings.warn(
            f"NBA problem {data.get('id')!r}{where} has answer false but sets "
            f"{fields}; ignored {' and '.join(named)} (the answer decides: every "
            "operation is legal).",
            NBADataWarning,
            stacklevel=2,
        )
        return {**data, **dict.fromkeys(_VIOLATION_FIELDS)}

    @model_validator(mode="after")
    def _violation_named(self) -> NBAProblem:
        """A violation names both the operation and the team."""
        named = self.illegal_operation is not None and self.problematic_team is not None
        if self.answer and not named:
            msg = (
                "answer is true, so illegal_operation and problematic_team must both "
                "be given"
            )
            raise ValueError(msg)
        return self


class NBADataset(BaseModel):
    """The RuleArena-NBA development split with its rule catalogue and CBA text."""

    model_config = ConfigDict(frozen=True)

    problems: list[NBAProblem]
    catalogue: Rulebook = Field(
        description="The 55 catalogue rules, ids equal to the gold labels."
    )
    cba_text: str = Field(description="reference_rules.txt: the document TAG extracts.")
    assumptions: dict[str, Any]

    @property
    def dropped_labels(self) -> Counter[str]:
        """How often each gold label without a catalogue rule was dropped."""
        return Counter(label for p in self.problems for label in p.dropped_labels)

    def assumptions_text(self) -> str:
        """The constants every problem assumes, as sentences for a prompt."""
        a = self.assumptions
        return (
            f"Salary cap for the {a['prior_salary_cap_year']} Salary Cap Year: "
            f"${a['prior_salary_cap']:,}. Average player salary for the "
            f"{a['prior_salary_cap_year']} Salary Cap Year: "
            f"${a['prior_average_player_salary']:,}. Salary cap for the "
            f"{a['current_salary_cap_year']} Salary Cap Year: ${a['salary_cap']:,}. "
            f"Luxury tax: ${a['luxury_tax']:,}. First apron level: "
            f"${a['first_apron_level']:,}. Second apron level: "
            f"${a['second_apron_level']:,}. {a['team_salary_note']}"
        )


_NBA_BLOCKS = {
    "team_situations": "Team Situations:",
    "player_situations": "Player Situations:",
    "operations": "Operations:",
}
"""A problem's fields that make up its text, with their headings, in order."""


def _catalogue_rule(entry: Any) -> Rule:
    if not isinstance(entry, dict) or not {"rule_id", "category", "description"} <= (
        entry.keys()
    ):
        msg = "not an object with rule_id, category and description"
        raise ValueError(msg)
    description = str(entry["description"])
    return Rule(
        rule_id=entry["rule_id"],
        name=str(entry["rule_id"]).replace("_", " ").capitalize(),
        condition=description,
        action=(
            "Check every proposed operation against this rule and report an "
            f"operation that breaks it: {description}"
        ),
        source_text=description,
        tags=(str(entry["category"]),),
        metadata={"category": entry["category"]},
    )


def _gold_labels(
    raw: Sequence[str], catalogue: Mapping[str, Rule], aliases: Mapping[str, str | None]
) -> tuple[list[str], list[str]]:
    """(gold ids in first-seen order without repeats, labels mapped to no rule)."""
    gold: list[str] = []
    dropped: list[str] = []
    for label in raw:
        resolved = aliases.get(label, label)
        if resolved is None:
            dropped.append(label)
        elif resolved not in catalogue:
            msg = (
                f"gold label {label!r} is neither a catalogue rule_id nor in "
                "rule_label_aliases.json; add it to the aliases file"
            )
            raise ValueError(msg)
        elif resolved not in gold:
            gold.append(resolved)
    return gold, dropped


def _nba_problem(
    record: Mapping[str, Any],
    catalogue: Mapping[str, Rule],
    aliases: Mapping[str, str | None],
    source: Path | None = None,
) -> NBAProblem:
    gold, dropped = _gold_labels(record["relevant_rules"], catalogue, aliases)
    return NBAProblem.model_validate(
        {
            **{key: record[key] for key in ("id", "level", "answer", *_NBA_BLOCKS)},
            "text": "\n\n".join(
                heading + "\n" + "\n".join(record[key])
                for key, heading in _NBA_BLOCKS.items()
            ),
            "gold_rule_ids": gold,
            "dropped_labels": tuple(dropped),
            # Absent (or "") when every operation is legal.
            "illegal_operation": record.get("illegal_operation") or None,
            "problematic_team": record.get("problematic_team") or None,
        },
        context={NBA_SOURCE: str(source)} if source is not None else None,
    )


def load_nba(data_dir: str | os.PathLike[str] | None = None) -> NBADataset:
    """Load the RuleArena-NBA development split (131 problems).

    Gold `relevant_rules` labels are catalogue rule ids, so rule-selection scoring
    (precision/recall/F1 of the selected rule ids) uses `catalogue`: the 55 catalogue
    rules as a rulebook whose `rule_id` is the catalogue id, `condition` the
    catalogue description and `tags` the category. Rules that TAG extracts from
    `cba_text` have other ids and must be mapped onto the catalogue to be scored.
    Labels are normalised with `rule_label_aliases.json`; labels that map to null
    name no rule and are dropped (kept per problem in `dropped_labels`). A problem
    whose answer is false but which names a violation is kept with the violation
    cleared, and an `NBADataWarning` names it and the file (see `NBAProblem`).

    Args:
        data_dir: The shared data directory; default `shared_data_dir()`.

    Raises:
        DataNotFoundError: The directory or one of its `rulearena_nba/` files is
            missing.
        DatasetError: A file is malformed or a gold label is unknown.
    """
    root = _data_dir(data_dir)
    catalogue_path = _file(root, f"{NBA_DIR}/rule_catalog.json")
    aliases_path = _file(root, f"{NBA_DIR}/rule_label_aliases.json")
    problems_path = _file(root, f"{NBA_DIR}/problems_dev.jsonl")
    rules = _build_all(
        catalogue_path, _json_list(catalogue_path, "catalogue rule"), _catalogue_rule
    )
    try:
        catalogue = Rulebook.from_rules(rules, domain="rulearena-nba-catalogue")
    except ValidationError as exc:
        raise _invalid(catalogue_path, "catalogue", exc) from None
    by_id = {rule.rule_id: rule for rule in catalogue.rules}
    aliases = _read_json(aliases_path)
    aliases = aliases.get("aliases") if isinstance(aliases, dict) else None
    if not isinstance(aliases, dict):
        msg = f"{aliases_path} has no 'aliases' object mapping labels to rule ids."
        raise DatasetError(msg)
    with problems_path.open(encoding="utf-8") as lines:
        problems = _build_all(
            problems_path,
            _json_lines(problems_path, lines),
            functools.partial(
                _nba_problem, catalogue=by_id, aliases=aliases, source=problems_path
            ),
        )
    return NBADataset(
        problems=problems,
        catalogue=catalogue,
        cba_text=_file(root, f"{NBA_DIR}/reference_rules.txt").read_text("utf-8"),
        assumptions=_read_json(_file(root, f"{NBA_DIR}/assumptions.json")),
    )


# --- ObliQA -------------------------------------------------------------------------


class ObliQAPassage(BaseModel):
    """One passage of an ObliQA document; `unit_id` is `DocumentID:PassageID`."""

    model_config = ConfigDict(frozen=True)

    unit_id: str
    document_id: int
    passage_id: str
    uuid: str
    text: str
    start: int = Field(description="Offset in the document's joined text.")
    end: int

    def to_document(self) -> Document:
        """The passage as a LangChain Document with id `unit_id`."""
        ids = self.model_dump(include={"unit_id", "document_id", "passage_id", "uuid"})
        return Document(id=self.unit_id, page_content=self.text, metadata=ids)


class ObliQAQuestion(BaseModel):
    """A question with its gold passages as unit ids (no gold answers exist)."""

    model_config = ConfigDict(frozen=True)

    id: str
    text: str
    gold_unit_ids: list[str] = Field(min_length=1)
    group: int | None = None


def _passage_text(unit: ObliQAPassage) -> str:
    return unit.text if unit.text.strip() else f"(passage {unit.unit_id} has no text)"


def obliqa_document_key(document_id: int) -> str:
    """The id of an ObliQA document as an extraction source (`obliqa-<id>`)."""
    return f"obliqa-{document_id}"


class ObliQADataset(BaseModel):
    """The ObliQA sample: 6 ADGM guidance documents and 491 dev questions.

    Scoring is by passage: gold references are passage unit ids. Rules map back to
    passages through `units_of_rule`, which reads the rule's source span against the
    joined document texts of `documents` (extract from those, not the raw files, so
    that the offsets agree).
    """

    model_config = ConfigDict(frozen=True)

    units: list[ObliQAPassage]
    questions: list[ObliQAQuestion]
    titles: dict[int, str]

    _by_document: dict[str, list[ObliQAPassage]] = PrivateAttr(default_factory=dict)
    _ends: dict[str, list[int]] = PrivateAttr(default_factory=dict)
    _unit_ids: frozenset[str] = PrivateAttr(default=frozenset())

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102
        for unit in self.units:
            key = obliqa_document_key(unit.document_id)
            self._by_document.setdefault(key, []).append(unit)
        self._ends = {
            key: [p.end for p in passages]
            for key, passages in self._by_document.items()
        }
        self._unit_ids = frozenset(unit.unit_id for unit in self.units)

    def _text(self, key: str) -> str:
        return PASSAGE_SEPARATOR.join(p.text for p in self._by_document[key])

    @property
    def passages(self) -> list[Document]:
        """Every passage as a Document: id and metadata `unit_id`, document order."""
        return [unit.to_document() for unit in self.units]

    @property
    def documents(self) -> list[Document]:
        """One Document per ObliQA document: its passages joined, for extraction.

        The id is `obliqa-<DocumentID>`, which extraction uses as the rules' source
        document id; `units_of_rule` relies on it and on these exact texts.
        """
        return [
            Document(
                id=key,
                page_content=self._text(key),
                metadata={
                    "document_id": passages[0].document_id,
                    "title": self.titles.get(passages[0].document_id, key),
                },
            )
            for key, passages in self._by_document.items()
        ]

    def passage_rulebook(self) -> Rulebook:
        """A passage rulebook: one pseudo-rule per passage, NOT extracted rules.

        Each rule's id is the passage's unit id, and its condition and action are the
        passage text, so applicability judging and similarity run over passages
        with the rule machinery (the CHUNKS+APPLICABILITY baseline). The source span
        and `metadata["unit_id"]` tie each rule to its passage. A passage with no
        text (one heading-only passage of document 36) gets a placeholder, so every
        unit has its rule.
        """
        return Rulebook.from_rules(
            [
                Rule(
                    rule_id=unit.unit_id,
                    name=f"ObliQA passage {unit.unit_id}",
                    condition=_passage_text(unit),
                    action=_passage_text(unit),
                    source_text=unit.text,
                    source=SourceSpan(
                        document_id=obliqa_document_key(unit.document_id),
                        start=unit.start,
                        end=unit.end,
                    ),
                    metadata={"unit_id": unit.unit_id},
                )
                for unit in self.units
            ],
            domain="obliqa-passages",
            documents=[
                SourceDocument.from_text(key, self._text(key))
                for key in self._by_document
            ],
            diagnostics={"kind": "passage rulebook (one rule per passage)"},
        )

    def units_of_rule(self, rule: Rule) -> set[str]:
        """The passage unit ids a rule comes from.

        A rule with `metadata["unit_id"]` (a passage rulebook's) maps to that unit.
        Any other rule maps through its source span to every passage the span
        overlaps in the joined document texts of `documents`; a span that touches
        only the separators between passages maps to no unit.

        Raises:
            ValueError: The rule has neither, or its source document is not one of
                this sample's documents (extracted from other texts?).
        """
        unit_id = rule.metadata.get("unit_id")
        if isinstance(unit_id, str):
            if unit_id not in self._unit_ids:
                msg = (
                    f"rule {rule.rule_id!r}: unit_id {unit_id!r} is not an ObliQA unit."
                )
                raise ValueError(msg)
            return {unit_id}
        source = rule.source
        if source is None or source.document_id not in self._by_document:
            where = (
                "no source span"
                if source is None
                else f"source document {source.document_id!r}"
            )
            msg = (
                f"rule {rule.rule_id!r} has {where}, so it cannot be mapped to an "
                f"ObliQA passage. Extract rules from ObliQADataset.documents (ids "
                f"{', '.join(sorted(self._by_document))}) to keep the source spans."
            )
            raise ValueError(msg)
        passages = self._by_document[source.document_id]
        stop = max(source.end, source.start + 1)  # an empty span still points
        found = set()
        # The first passage ending after the span's start; overlap runs from there.
        for passage in passages[
            bisect.bisect_right(self._ends[source.document_id], source.start) :
        ]:
            if passage.start >= stop:
                break
            found.add(passage.unit_id)
        return found


def _passage(item: Mapping[str, Any]) -> ObliQAPassage:
    """A passage at offset 0; `_passages` places it in the joined document text."""
    return ObliQAPassage(
        unit_id=f"{item['DocumentID']}:{item['PassageID']}",
        document_id=item["DocumentID"],
        passage_id=item["PassageID"],
        uuid=item["ID"],
        text=item["Passage"],
        start=0,
        end=len(item["Passage"]),
    )


def _passages(path: Path) -> list[ObliQAPassage]:
    unplaced = _build_all(path, _json_list(path, "passage"), _passage)
    placed = []
    offset = 0
    for passage in unplaced:
        end = offset + len(passage.text)
        placed.append(passage.model_copy(update={"start": offset, "end": end}))
        offset = end + len(PASSAGE_SEPARATOR)
    return placed


def _question(item: Mapping[str, Any], units: Container[str]) -> ObliQAQuestion:
    gold = [f"{p['DocumentID']}:{p['PassageID']}" for p in item["Passages"]]
    missing = [unit_id for unit_id in gold if unit_id not in units]
    if missing:
        msg = f"gold passages {missing} are not in {OBLIQA_DIR}/documents"
        raise ValueError(msg)
    return ObliQAQuestion(
        id=item["QuestionID"],
        text=item["Question"],
        gold_unit_ids=list(dict.fromkeys(gold)),
        group=item.get("Group"),
    )


def load_obliqa(data_dir: str | os.PathLike[str] | None = None) -> ObliQADataset:
    """Load the ObliQA sample: 767 passages of 6 documents and 491 dev questions.

    Args:
        data_dir: The shared data directory; default `shared_data_dir()`.

    Raises:
        DataNotFoundError: The directory or an `obliqa_sample/` file is missing.
        DatasetError: A file is malformed, a unit id repeats, or a gold passage is
            not in the documents.
    """
    root = _data_dir(data_dir)
    questions_path = _file(root, f"{OBLIQA_DIR}/questions_dev.json")
    document_files = sorted(
        (root / OBLIQA_DIR / "documents").glob("*.json"),
        key=lambda p: (len(p.stem), p.stem),  # numeric order for numeric names
    )
    if not document_files:
        _file(root, f"{OBLIQA_DIR}/documents/19.json")  # names what is missing
    units: list[ObliQAPassage] = []
    for path in document_files:
        units += _passages(path)
    seen = Counter(unit.unit_id for unit in units)
    repeated = sorted(unit_id for unit_id, n in seen.items() if n > 1)
    if repeated:
        msg = f"{OBLIQA_DIR}/documents: unit ids repeat: {', '.join(repeated[:5])}."
        raise DatasetError(msg)
    questions = _build_all(
        questions_path,
        _json_list(questions_path, "question"),
        functools.partial(_question, units=seen),
    )
    titles_path = root / OBLIQA_DIR / "document_map.json"
    names = _read_json(titles_path) if titles_path.is_file() else {}
    titles = {int(key): value[-1] for key, value in names.items() if value}
    return ObliQADataset(units=units, questions=questions, titles=titles)


# --- HumanEval and PEP 8 ------------------------------------------------------------


class HumanEvalProblem(BaseModel):
    """One HumanEval problem; run `test` as `check(<entry_point>)`."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str


def load_humaneval(
    data_dir: str | os.PathLike[str] | None = None,
) -> list[HumanEvalProblem]:
    """Load the 164 HumanEval problems from `humaneval/HumanEval.jsonl.gz`.

    Raises:
        DataNotFoundError: The directory or the file is missing.
        DatasetError: A line is not a valid problem.
    """
    path = _file(_data_dir(data_dir), HUMANEVAL_FILE)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            return _build_all(
                path, _json_lines(path, lines), HumanEvalProblem.model_validate
            )
    except (OSError, EOFError) as exc:
        msg = f"{path} is not a readable gzip file ({exc}); restore it."
        raise DatasetError(msg) from None


def pep8_path(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The PEP 8 source text (`pep8/pep-0008.rst`), the HumanEval task's document.

    Raises:
        DataNotFoundError: The directory or the file is missing.
    """
    return _file(_data_dir(data_dir), PEP8_FILE)


# --- Wiki Neutrality Corpus (WNC) sample ----------------------------------------------


class WNCPair(BaseModel):
    """One WNC sentence pair: a biased sentence and its neutral edit.

    Both sides are lowercased and tokenized as the corpus is (spaces around
    punctuation, `' s`); `langchain_tag_experiments.evaluation.npov.normalize_wnc`
    brings a model's rewrite to that form.
    """

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1)
    biased: str = Field(min_length=1, description="The sentence before the edit.")
    neutral: str = Field(min_length=1, description="The sentence after the edit.")
    source_split: str = Field(description="The upstream file's split (`train`).")
    source_line: int = Field(ge=0, description="0-based line in the upstream files.")

    @property
    def unchanged(self) -> bool:
        """True if the edit changed nothing but whitespace (4 dev pairs: noise).

        Such pairs are kept, as the corpus has them; an identity rewrite matches
        their reference exactly, so scores over all pairs credit copying a little.
        """
        return self.biased.split() == self.neutral.split()


_SPLIT_NAME = re.compile(r"[a-z0-9_]+")


def load_wnc(
    data_dir: str | os.PathLike[str] | None = None, *, split: str = "dev"
) -> list[WNCPair]:
    """Load the WNC sample's sentence pairs (`wnc_sample/pairs_<split>.jsonl`).

    The dev split has 1,000 biased -> neutral pairs from Wikipedia NPOV edits, the
    offline stand-in for the TAG paper's NPOV Noticeboard cases. Pairs whose two
    sides are identical are kept; `WNCPair.unchanged` flags them.

    Args:
        data_dir: The shared data directory; default `shared_data_dir()`.
        split: Which file; only `dev` is in the shared data.

    Raises:
        ValueError: `split` is not a plain lower-case name.
        DataNotFoundError: The directory or the split's file is missing.
        DatasetError: A line is not valid JSON, a field is missing or has the
            wrong type (the message names file, line and field), or ids repeat.
    """
    if not _SPLIT_NAME.fullmatch(split):
        msg = f"split must be a lower-case name such as 'dev', got {split!r}."
        raise ValueError(msg)
    path = _file(_data_dir(data_dir), f"{WNC_DIR}/pairs_{split}.jsonl")
    with path.open(encoding="utf-8") as lines:
        pairs = _build_all(path, _json_lines(path, lines), WNCPair.model_validate)
    repeated = sorted(i for i, n in Counter(p.id for p in pairs).items() if n > 1)
    if repeated:
        msg = f"{path}: ids repeat: {', '.join(repeated[:5])}."
        raise DatasetError(msg)
    return pairs


# --- A user's labelled inputs (`tag eval custom`) -------------------------------------


class LabelledInput(BaseModel):
    """One labelled input of a user's own set: the rules that apply to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, description="Default: `line-N` (its line).")
    input: str = Field(min_length=1, description="What is judged and executed.")
    applicable: tuple[str, ...] = Field(
        description="The ids of the rules that apply to it (may be empty)."
    )
    reference: str | None = Field(
        default=None, description="The expected answer, to score the executor's."
    )

    @field_validator("applicable", mode="before")
    @classmethod
    def _a_list(cls, value: object) -> object:
        # Refused by pydantic as "not a valid tuple": a type no JSON file holds.
        if isinstance(value, (list, tuple)):
            return value
        if isinstance(value, str):
            given = f"the string {value!r}"
        elif isinstance(value, dict):
            given = "an object"
        else:
            given = json.dumps(value)
        kind = "list_of_rule_ids"
        msg = (
            'must be a list of rule ids, e.g. ["R-1", "R-2"], or [] when no rule '
            "applies; got {given}"
        )
        raise PydanticCustomError(kind, msg, {"given": given})


def load_labelled(path: str | os.PathLike[str]) -> list[LabelledInput]:
    """Read a JSON-lines file of labelled inputs (UTF-8, or UTF-16 with its mark).

    Each line is `{"input": ..., "applicable": [rule ids]}`, optionally with
    `"reference"` (the expected answer) and `"id"` (default `line-N`). Unknown fields
    are refused, so a misspelt `"applicable"` is not silently a no-rule input.

    Raises:
        DataNotFoundError: The file is missing.
        DatasetError: The file cannot be read or is in another encoding (file,
            line and byte named, as `_text.read_text` says), a line is not JSON or
            not such a record (file, line, field named), ids repeat, or the file
            holds no input.
    """
    source = Path(path)
    if not source.is_file():
        msg = f"No labelled inputs at {source}: pass the JSON-lines file's path."
        raise DataNotFoundError(msg)

    def build(located: tuple[str, Any]) -> LabelledInput:
        where, record = located  # "line N": the default id is "line-N"
        if not isinstance(record, dict):
            msg = 'not a JSON object {"input": ..., "applicable": [...]}'
            raise TypeError(msg)
        return LabelledInput.model_validate({"id": where.replace(" ", "-"), **record})

    try:
        text = read_text(source)
    except TextEncodingError as error:
        raise DatasetError(str(error)) from None
    except OSError as error:
        msg = f"{source}: cannot be read ({error.strerror}); check its permissions."
        raise DatasetError(msg) from None
    # Universal newlines, as `open` reads: "line N" is the line an editor shows.
    lines = io.StringIO(text, newline=None)
    records = [(where, (where, r)) for where, r in _json_lines(source, lines)]
    inputs = _build_all(source, records, build)
    if not inputs:
        msg = f"{source} holds no labelled input."
        raise DatasetError(msg)
    repeated = sorted(i for i, n in Counter(x.id for x in inputs).items() if n > 1)
    if repeated:
        msg = (
            f"{source}: ids repeat: {', '.join(repeated[:5])}; give each input its own."
        )
        raise DatasetError(msg)
    return inputs
