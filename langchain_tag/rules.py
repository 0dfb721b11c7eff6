"""The rulebook: atomic condition-action rules and the file that holds them.

A `Rule` is the unit TAG retrieves (principle P1 of the method). A `Rulebook` is the
set of rules extracted from one or more source documents, with the documents' content
hashes and the extraction diagnostics, saved as one JSON file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from langchain_tag._text import decode_text
from langchain_tag.errors import RulebookError, TextEncodingError
from langchain_tag.rule_schemas import BUILT_IN_SCHEMAS, RuleSchema

__all__ = [
    "FORMAT_VERSION",
    "NormativeType",
    "PreferredAction",
    "Relationship",
    "Rule",
    "RuleLineage",
    "RuleRelation",
    "Rulebook",
    "SourceDocument",
    "SourceSpan",
    "rule_text",
]

FORMAT_VERSION = 1
"""Version of the rulebook file format this release writes and reads."""

Relationship = Literal["duplicate", "subsumption", "overlap", "conflict"]
PreferredAction = Literal["merge", "keep_both", "manual_review"]
NormativeType = Literal[
    "requirement",
    "prohibition",
    "recommendation",
    "permission",
    "exception",
    "conditional",
]

PROFILE_FIELDS = ("applies_when", "constraint", "violation_check", "does_not_apply_to")
"""Optional rule fields used by domain rule-schema profiles (e.g. the NBA matcher)."""


class SourceSpan(BaseModel):
    """Where a rule's source text sits in its source document (character offsets)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    document_id: str = Field(min_length=1)
    start: int = Field(ge=0)
    end: int = Field(ge=0, description="Exclusive end offset.")

    @model_validator(mode="after")
    def _ordered(self) -> SourceSpan:
        if self.end < self.start:
            msg = f"end ({self.end}) is before start ({self.start})"
            raise ValueError(msg)
        return self


class RuleLineage(BaseModel):
    """Extraction lineage: normative span -> atomic unit -> rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    span_ids: tuple[str, ...] = ()
    atomic_ids: tuple[str, ...] = ()
    normative_type: NormativeType | None = None
    merged_rule_ids: tuple[str, ...] = Field(
        default=(), description="Rules merged into this one as duplicates (phase 4)."
    )
    pages: tuple[int, ...] = Field(
        default=(), description="Pages (1-based) of a paged source the rule came from."
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_empty(handler(self), "pages")


class RuleRelation(BaseModel):
    """A phase-4 relation from this rule to another rule of the rulebook."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    relationship: Relationship
    other_rule_id: str = Field(min_length=1)
    preferred_action: PreferredAction | None = None
    explanation: str | None = None


class Rule(BaseModel):
    """One atomic, operational rule: when `condition` holds, do `action`.

    The judge decides applicability from `name`, `condition` and `tags` (plus the
    profile fields, or a user-defined schema's `fields`, when a rule-schema profile
    uses them); it never sees `action`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule_id: str = Field(min_length=1)
    name: str = Field(min_length=1, description="Distinctive name, 3-8 words.")
    condition: str = Field(
        min_length=1, description="Observable condition, judgeable from the input."
    )
    action: str = Field(min_length=1, description="Concrete operation to perform.")
    source_text: str = Field(default="", description="Verbatim span of the source.")
    tags: tuple[str, ...] = Field(default=(), description="1-3 category tags.")
    source: SourceSpan | None = None
    lineage: RuleLineage = Field(default_factory=RuleLineage)
    relations: tuple[RuleRelation, ...] = ()
    applies_when: str | None = None
    constraint: str | None = None
    violation_check: str | None = None
    does_not_apply_to: str | None = None
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="Judge-side fields of a user-defined rule schema (name -> text).",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Free-form user metadata, usable in filters."
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_empty(handler(self), "fields")

    @field_validator("rule_id", "name", "condition", "action")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            msg = "must not be blank"
            raise ValueError(msg)
        return value

    @property
    def source_document_id(self) -> str | None:
        """The id of the document the rule was extracted from, if known."""
        return None if self.source is None else self.source.document_id

    def content_hash(self) -> str:
        """A stable hash of every field, for change detection and idempotent sync.

        Fields added after the first release are left out when empty (see
        `_without_empty`), so the hash stored prefilters and vector-store syncs key
        on does not change on upgrade.
        """
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class SourceDocument(BaseModel):
    """A document rules were extracted from, identified by its content hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    document_id: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    n_chars: int = Field(ge=0)
    source: str | None = Field(default=None, description="Path or URL, if known.")

    @classmethod
    def from_text(
        cls, document_id: str, text: str, source: str | None = None
    ) -> SourceDocument:
        """Describe a document by hashing its text."""
        return cls(
            document_id=document_id,
            sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
            n_chars=len(text),
            source=source,
        )


class Rulebook(BaseModel):
    """An ordered set of rules with their provenance, saved as one JSON file."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = Field(default=FORMAT_VERSION, ge=1)
    domain: str | None = None
    rules: list[Rule] = Field(default_factory=list)
    documents: list[SourceDocument] = Field(default_factory=list)
    diagnostics: dict[str, Any] = Field(
        default_factory=dict, description="Extraction report (per-phase counts, ...)."
    )
    rule_schema: RuleSchema | None = Field(
        default=None,
        description="The schema the rules were extracted in; None: the condition "
        "schema (condition and action).",
    )

    @field_validator("rule_schema", mode="before")
    @classmethod
    def _schema_by_name(cls, value: object) -> object:
        # A built-in schema may be named, as `tag extract --schema` names it.
        return BUILT_IN_SCHEMAS.get(value, value) if isinstance(value, str) else value

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_empty(handler(self), "rule_schema")

    @model_validator(mode="after")
    def _consistent(self) -> Rulebook:
        if self.format_version > FORMAT_VERSION:
            msg = (
                f"format_version {self.format_version} is newer than this release "
                f"reads ({FORMAT_VERSION})"
            )
            raise ValueError(msg)
        _check_consistency(self.rules)
        return self

    _positions: dict[str, int] = PrivateAttr(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        """Equal when every field is; the private lookup index does not count."""
        if not isinstance(other, Rulebook):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # mutable, like any pydantic model

    def __len__(self) -> int:
        """Number of rules."""
        return len(self.rules)

    def check(self) -> None:
        """Check the rules as they are now: `rules` is a plain list users may edit.

        Raises:
            RulebookError: Two rules share an id, or a relation names a missing rule.
        """
        try:
            _check_consistency(self.rules)
        except ValueError as error:
            raise RulebookError(
                None,
                f"{error}.",
                "Give every rule its own rule_id (and keep relations to rules of the "
                "rulebook) before retrieving or saving.",
            ) from None

    def _position_of(self, rule_id: str) -> int | None:
        # `rules` is a plain list users may edit, so a stale index is rebuilt.
        position = self._positions.get(rule_id)
        if (
            position is None
            or position >= len(self.rules)
            or (self.rules[position].rule_id != rule_id)
        ):
            self._positions = {rule.rule_id: i for i, rule in enumerate(self.rules)}
            position = self._positions.get(rule_id)
        return position

    def get(self, rule_id: str) -> Rule | None:
        """The rule with this id, or None."""
        position = self._position_of(rule_id)
        return None if position is None else self.rules[position]

    def position(self, rule_id: str) -> int:
        """The rule's position in the rulebook (its stable order).

        Raises:
            KeyError: No rule has this id.
        """
        position = self._position_of(rule_id)
        if position is None:
            raise KeyError(rule_id)
        return position

    @classmethod
    def from_rules(
        cls, rules: Iterable[Rule | Mapping[str, Any]], **kwargs: Any
    ) -> Rulebook:
        """Build a rulebook from rules or plain dicts, validating everything."""
        return cls(
            rules=[r if isinstance(r, Rule) else Rule(**r) for r in rules], **kwargs
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the rulebook atomically: a crash leaves the previous file intact.

        The JSON goes to a temporary file in the same directory, is flushed to disk,
        then renamed over `path` in one step.

        Returns:
            The path written.

        Raises:
            RulebookError: The rules were edited into an inconsistent state
                (duplicate ids, relations to missing rules); nothing is written.
        """
        self.check()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = self.model_dump_json(indent=2).encode("utf-8") + b"\n"
        _atomic_write_bytes(target, data)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Rulebook:
        """Read a rulebook file; errors say which file, which field, what to do.

        The file is UTF-8 (with or without a byte-order mark) or UTF-16 with its
        mark, as every text file a user gives `tag` (`_text.read_text`).

        Raises:
            RulebookError: The file is missing, unreadable, truncated, not a rulebook,
                from a newer release, or has an invalid field.
        """
        source = Path(path)
        try:
            raw = source.read_bytes()
        except FileNotFoundError:
            raise RulebookError(
                source,
                "file not found.",
                "Check the path, or create a rulebook by extracting rules from your "
                "documents (`tag extract FILES -o rulebook.json`).",
            ) from None
        except IsADirectoryError:
            raise RulebookError(
                source, "is a directory, not a file.", "Pass the rulebook JSON file."
            ) from None
        except OSError as exc:
            raise RulebookError(
                source, f"cannot be read ({exc.strerror}).", "Check its permissions."
            ) from exc
        return cls.from_json(raw, path=source)

    @classmethod
    def from_json(
        cls, raw: bytes | str, *, path: str | os.PathLike[str] | None = None
    ) -> Rulebook:
        """Parse rulebook JSON; `path` is only used to name the file in errors.

        Raises:
            RulebookError: See `load`.
        """
        try:
            # The reader of every user's text file: UTF-8 (a byte-order mark, as
            # some editors write, is not part of the JSON) or marked UTF-16.
            text = (
                decode_text(raw, what=str(path or "rulebook"))
                if isinstance(raw, bytes)
                else raw
            )
        except TextEncodingError as exc:
            raise RulebookError(
                path, exc.problem, f"{exc.fix} Or re-run `tag extract`."
            ) from None
        if not text.strip():
            raise RulebookError(
                path,
                "is empty.",
                "It was probably cut off while being written; restore a backup or "
                "re-run extraction.",
            )
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            # A rulebook is one JSON object; one not closed at the end was cut off.
            truncated = not text.rstrip().endswith("}")
            problem = (
                f"is not valid JSON: {exc.msg} (line {exc.lineno}, column "
                f"{exc.colno})"
                + ("; the file ends early: truncated?" if truncated else ".")
            )
            raise RulebookError(
                path,
                problem,
                "Fix the JSON by hand at that position, restore a backup, or re-run "
                "extraction.",
            ) from None
        return cls.from_data(data, path=path)

    @classmethod
    def from_data(
        cls, data: object, *, path: str | os.PathLike[str] | None = None
    ) -> Rulebook:
        """Validate a rulebook given as plain data (parsed JSON, a server's input).

        Raises:
            RulebookError: Not a rulebook, from a newer release, or an invalid
                field, named with its rule id.
        """
        if not isinstance(data, dict) or "rules" not in data:
            raise RulebookError(
                path,
                "is JSON but not a rulebook (expected an object with 'format_version' "
                "and 'rules').",
                "Pass a file written by Rulebook.save or `tag extract`.",
            )
        version = data.get("format_version")
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise RulebookError(
                path,
                f"has format_version {version}, written by a newer langchain-tag; "
                f"this release reads format_version {FORMAT_VERSION} and older.",
                "Upgrade langchain-tag (pip install -U langchain-tag).",
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RulebookError(
                path, _describe_validation_error(exc, data), _FIX_FIELDS
            ) from None


_MAX_REPORTED = 5
_FIX_FIELDS = (
    "Correct the named field (see the Rule model in langchain_tag.rules for the "
    "allowed fields), or re-run extraction."
)


def _describe_validation_error(exc: ValidationError, data: Mapping[str, Any]) -> str:
    """Name each bad field by path, with the rule id where the path is in a rule."""
    problems = []
    for error in exc.errors():
        location = error["loc"]
        parts: list[str] = []
        for item in location:
            if isinstance(item, int):
                parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
            else:
                parts.append(str(item))
        where = ".".join(parts) or "(top level)"
        rule_hint = ""
        position = location[1] if location[:1] == ("rules",) and location[1:] else None
        if isinstance(position, int):
            rules = data.get("rules")
            if isinstance(rules, list) and position < len(rules):
                rule = rules[position]
                if isinstance(rule, dict) and isinstance(rule.get("rule_id"), str):
                    rule_hint = f" (rule_id {rule['rule_id']!r})"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field (a typo, or written by another tool?)"
        if location:
            problems.append(f"field {where}{rule_hint}: {message}")
        else:  # rulebook-level checks name their fields in the message
            problems.append(message.removeprefix("Value error, "))
    shown = problems[:_MAX_REPORTED]
    hidden = len(problems) - len(shown)
    more = f" (and {hidden} more)" if hidden else ""
    return "invalid " + "; ".join(shown) + more + "."


def _without_empty(data: dict[str, Any], key: str) -> dict[str, Any]:
    """`data` without `key` when empty: a field added after the first release.

    Left out when unused, files read by earlier releases stay readable and rule
    hashes stay the same.
    """
    if key in data and not data[key]:
        del data[key]
    return data


def _check_consistency(rules: Sequence[Rule]) -> None:
    """Rule ids are unique and every relation points at a rule of the rulebook."""
    first_at: dict[str, int] = {}
    for i, rule in enumerate(rules):
        if rule.rule_id in first_at:
            msg = (
                f"rules[{i}].rule_id: {rule.rule_id!r} is used by more than one rule "
                f"(first at rules[{first_at[rule.rule_id]}])"
            )
            raise ValueError(msg)
        first_at[rule.rule_id] = i
    for i, rule in enumerate(rules):
        for j, relation in enumerate(rule.relations):
            if relation.other_rule_id not in first_at:
                msg = (
                    f"rules[{i}].relations[{j}].other_rule_id: rule {rule.rule_id!r} "
                    f"has a {relation.relationship} relation to "
                    f"{relation.other_rule_id!r}, which is not in the rulebook"
                )
                raise ValueError(msg)


# --- atomic save ---------------------------------------------------------------------


def _new_file_mode(target: Path) -> int:
    """The mode a rewrite of `target` should have: its own, or what umask allows."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)  # reading the umask means setting it; restore at once
        os.umask(umask)
        return 0o666 & ~umask


def _writer_alive(pid: int) -> bool:
    if sys.platform == "win32":
        return True  # os.kill(pid, 0) would send CTRL_C_EVENT: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _remove_stale_temp_files(target: Path) -> None:
    """Delete temporary files of saves to `target` whose writer was killed."""
    head, tail = f".{target.name}.", ".tmp"
    for path in target.parent.iterdir():
        name = path.name
        if not (name.startswith(head) and name.endswith(tail)):
            continue
        pid = name[len(head) :].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _writer_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _atomic_write_bytes(target: Path, data: bytes) -> None:
    """Write `data` to `target` via a same-directory temp file and an atomic rename.

    A writer killed mid-save leaves its temporary file behind; the next save to the
    same target removes it.
    """
    mode = _new_file_mode(target)
    # The writer's pid is in the name, so a later save can tell a temporary file
    # left by a killed writer from one that another writer is still filling.
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent
    )
    try:
        # mkstemp creates the file 0600; give it the mode the target should keep.
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp_name).replace(target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp_name).unlink()
        raise
    # Persist the rename itself; not every platform lets a directory be opened.
    with contextlib.suppress(OSError):
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    _remove_stale_temp_files(target)


def rule_text(rule: Rule) -> str:
    """The text embedded for a rule: what a similarity prefilter compares an input to.

    The judge decides from name and condition (never the action), so those are what
    an input should resemble; tags add the category vocabulary.
    """
    lines = [rule.name, rule.condition]
    # Profiles such as the NBA matcher judge from `applies_when` as well.
    if rule.applies_when:
        lines.append(rule.applies_when)
    if rule.tags:
        lines.append("Tags: " + ", ".join(rule.tags))
    return "\n".join(lines)
