"""Rule schemas: which fields extraction writes for each rule, and who sees each one.

A rule is judged by the fields on its *judge* side and carried out from those on its
*executor* side; the judge never sees the executor side (the method's action
withholding). `condition` (the method's default: an observable condition and an
action) and `nba` (the paper's NBA matcher: `applies_when`, `constraint`,
`violation_check`, `does_not_apply_to`, then an action) are built in; a domain that
needs its own fields (contracts: party, trigger, obligation, exceptions) declares them
as a pydantic model (`RuleSchema.from_model`) or a JSON Schema file
(`RuleSchema.load`).

Extraction's phase 3 asks for the schema's fields; `RuleSchema.rule_values` turns an
answer into a `Rule`'s fields; `matching.profiles.schema_profile` is what the judge
sees of such rules.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from langchain_tag._text import read_text
from langchain_tag.errors import RuleSchemaError, TextEncodingError

__all__ = [
    "BUILT_IN_SCHEMAS",
    "CONDITION_SCHEMA",
    "NBA_SCHEMA",
    "RuleSchema",
    "SchemaField",
    "Side",
    "rule_schema",
]

Side = Literal["judge", "executor"]
"""Who sees a field: the applicability judge, or only the executor."""

SIDE_KEY = "x-tag-side"
"""The JSON Schema keyword (and pydantic `json_schema_extra` key) naming a side."""

_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}\Z")
# Written by extraction itself, or the rule's own bookkeeping: no schema field.
_RESERVED = frozenset(
    {
        "rule_id",
        "name",
        "rule_name",
        "atomic_id",
        "source_text",
        "category_tags",
        "tags",
        "source",
        "lineage",
        "relations",
        "metadata",
        "fields",
    }
)
# Rule attributes a schema field may fill directly (the others go to `Rule.fields`).
_RULE_ATTRIBUTES = frozenset(
    {"condition", "applies_when", "constraint", "violation_check", "does_not_apply_to"}
)


class SchemaField(BaseModel):
    """One field phase 3 writes for every rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Lowercase identifier, e.g. `trigger`.")
    description: str = Field(
        min_length=1, description="What to write: the extraction prompt's words."
    )
    side: Side = Field(description="`judge`: decides applicability; `executor`: acts.")
    required: bool = Field(
        default=True,
        description="False: the model may write null when the unit is silent.",
    )

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _NAME.match(value):
            msg = (
                f"field name {value!r} must be a lowercase identifier (letters, "
                "digits, underscores; at most 40 characters)"
            )
            raise ValueError(msg)
        if value in _RESERVED:
            msg = (
                f"field name {value!r} is written by extraction itself; choose "
                "another name"
            )
            raise ValueError(msg)
        if hasattr(BaseModel, value):  # phase 3 reads answers with a pydantic model
            msg = f"field name {value!r} is taken by pydantic; choose another name"
            raise ValueError(msg)
        return value

    @field_validator("description")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            msg = "description must not be blank: the extraction prompt reads it"
            raise ValueError(msg)
        return " ".join(value.split())


class RuleSchema(BaseModel):
    """The fields of a rule, each on the judge's side or the executor's.

    Judge-side fields are what the applicability judge decides from (with the rule's
    name and tags); executor-side fields become the rule's `action`, the only thing
    the executor gets. `condition` and `action`, when a schema has them, are the
    rule's own; otherwise the condition is the judge-side fields and the action the
    executor-side fields, each labelled by name.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Names the schema (and its profile).")
    description: str = Field(
        default="", description="What the rules are, for the extraction prompt."
    )
    fields: tuple[SchemaField, ...] = Field(
        description="At least one required field on each side (said by side when "
        "one is missing)."
    )
    judge_criteria: tuple[str, ...] = Field(
        default=(), description="Extra decision criteria for the judge, one each."
    )

    @model_validator(mode="after")
    def _sides(self) -> RuleSchema:
        names = [f.name for f in self.fields]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            msg = f"fields {repeated} are declared more than once"
            raise ValueError(msg)
        wrong = {
            f.name: f.side
            for f in self.fields
            if (f.name == "action" and f.side != "executor")
            or (f.name in _RULE_ATTRIBUTES and f.side != "judge")
        }
        if wrong:
            msg = (
                f"{', '.join(sorted(wrong))} cannot be on the "
                f"{'/'.join(sorted(set(wrong.values())))} side: `action` is the "
                "executor's, `condition` and the constraint fields are the judge's"
            )
            raise ValueError(msg)
        for side in get_args(Side):
            if not any(f.side == side and f.required for f in self.fields):
                msg = (
                    f"no required {side}-side field: a rule needs at least one field "
                    f"the {side} sees and the model must always write"
                )
                raise ValueError(msg)
        return self

    @property
    def judge_fields(self) -> tuple[SchemaField, ...]:
        """The fields the judge sees, in order."""
        return tuple(f for f in self.fields if f.side == "judge")

    @property
    def executor_fields(self) -> tuple[SchemaField, ...]:
        """The fields only the executor gets (as the rule's action), in order."""
        return tuple(f for f in self.fields if f.side == "executor")

    def built_in(self) -> RuleSchema | None:
        """The built-in schema this one is, by name and fields (their sides).

        Descriptions are not compared: a rulebook saved in an earlier wording of
        `nba` is still an `nba` rulebook.
        """
        known = BUILT_IN_SCHEMAS.get(self.name)
        if known is None or _shape(known) != _shape(self):
            return None
        return known

    def digest(self) -> str:
        """A hash of the whole schema: what extraction and judging depend on."""
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def rule_values(self, answer: Mapping[str, str | None]) -> dict[str, Any]:
        """A rule's `condition`, `action`, profile attributes and `fields`.

        `answer` maps field names to what the model wrote (None or blank: silent).
        Judge-side fields named like a `Rule` attribute (`applies_when`, ...) fill
        it; other judge-side fields go to `Rule.fields`. Executor-side fields are
        only in `action`, so that no profile can show them to the judge.
        """
        written = {
            f.name: str(answer[f.name]).strip()
            for f in self.fields
            if answer.get(f.name) is not None and str(answer[f.name]).strip()
        }
        judged = [f for f in self.judge_fields if f.name in written]
        acted = [f for f in self.executor_fields if f.name in written]
        values: dict[str, Any] = {
            name: written[name] for name in _RULE_ATTRIBUTES if name in written
        }
        if "condition" not in values:
            values["condition"] = written.get("applies_when") or _labelled(
                judged, written, "; "
            )
        # The executor gets every executor-side field: `action` first, as written.
        others = [f for f in acted if f.name != "action"]
        values["action"] = "\n".join(
            part
            for part in (written.get("action"), _labelled(others, written, "\n"))
            if part
        )
        extra = {
            f.name: written[f.name] for f in judged if f.name not in _RULE_ATTRIBUTES
        }
        if extra:
            values["fields"] = extra
        return values

    @classmethod
    def from_model(
        cls, model: type[BaseModel], *, name: str | None = None
    ) -> RuleSchema:
        """A schema from a pydantic model: its fields, descriptions and sides.

        Each field needs a `description` and a side, given as
        `Field(description=..., json_schema_extra={"x-tag-side": "executor"})`
        (`"judge"` or `"executor"`); optional fields (with a default) may be left
        empty by the model. The schema is named after the model unless `name` is.

        Raises:
            RuleSchemaError: A field lacks a description or a side, or the fields
                do not make a schema (see `RuleSchema`).
        """
        return cls.from_json_schema(
            model.model_json_schema(), name=name, where=f"model {model.__name__}"
        )

    @classmethod
    def from_json_schema(
        cls,
        schema: Mapping[str, Any],
        *,
        name: str | None = None,
        where: str = "JSON Schema",
    ) -> RuleSchema:
        """A schema from a JSON Schema object with string properties.

        Each property has a `description` and `"x-tag-side": "judge"|"executor"`;
        `required` lists the fields the model must always write; `title` names the
        schema, `description` describes its rules, and an optional
        `"x-tag-judge-criteria"` lists extra decision criteria for the judge.

        Raises:
            RuleSchemaError: Not such an object, or a property that cannot be a
                field; the message names `where` and the property.
        """
        if not isinstance(schema, Mapping) or not isinstance(
            schema.get("properties"), Mapping
        ):
            raise _error(where, "has no `properties` object naming the rule's fields.")
        required = schema.get("required", [])
        criteria = schema.get("x-tag-judge-criteria") or []
        if not isinstance(required, list) or not all(
            isinstance(r, str) for r in required
        ):
            raise _error(where, "`required` must be a list of property names.")
        if unknown := sorted(set(required) - set(schema["properties"])):
            raise _error(where, f"`required` names no property {unknown}.")
        if not isinstance(criteria, list) or not all(
            isinstance(c, str) for c in criteria
        ):
            raise _error(
                where, "`x-tag-judge-criteria` must be a list of sentences (strings)."
            )
        fields = []
        for field_name, spec in schema["properties"].items():
            if not isinstance(spec, Mapping):
                raise _error(where, f"property {field_name!r} is not an object.")
            kinds = spec.get("type", spec.get("anyOf"))
            if not _textual(kinds):
                raise _error(
                    where,
                    f"property {field_name!r} is not a string field ("
                    + ("no type" if kinds is None else f"type {json.dumps(kinds)}")
                    + '): rule fields are text ({"type": "string"}).',
                )
            fields.append(
                {
                    "name": field_name,
                    "description": spec.get("description", ""),
                    "side": spec.get(SIDE_KEY),
                    "required": field_name in required,
                }
            )
        try:
            return cls.model_validate(
                {
                    "name": name or str(schema.get("title") or "custom"),
                    "description": str(schema.get("description") or ""),
                    "fields": fields,
                    "judge_criteria": tuple(criteria),
                }
            )
        except ValidationError as exc:
            raise _error(where, _problems(exc, fields)) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RuleSchema:
        """Read a JSON Schema file (see `from_json_schema`).

        Raises:
            RuleSchemaError: Missing, unreadable, not JSON, or not a rule schema;
                the message names the file.
        """
        where = str(path)
        try:
            text = read_text(Path(path), what=where)
        except FileNotFoundError:
            raise _error(where, "no such file.", _FILE_FIX) from None
        except TextEncodingError as exc:
            raise _error(where, exc.problem, exc.fix) from None
        except OSError as exc:
            raise _error(
                where, f"cannot be read ({exc.strerror}).", _FILE_FIX
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _error(
                where,
                f"is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).",
            ) from None
        return cls.from_json_schema(data, name=None, where=where)


def _shape(schema: RuleSchema) -> list[tuple[str, Side, bool]]:
    return [(f.name, f.side, f.required) for f in schema.fields]


def _textual(kinds: object) -> bool:
    """Whether a JSON Schema `type` (or `anyOf`) allows only strings (and null)."""
    if isinstance(kinds, str):
        return kinds in {"string", "null"}
    if isinstance(kinds, list):
        return all(
            _textual(k.get("type", "") if isinstance(k, Mapping) else k) for k in kinds
        )
    return False


def _labelled(fields: list[SchemaField], written: Mapping[str, str], sep: str) -> str:
    return sep.join(f"{f.name}: {written[f.name]}" for f in fields)


def _problems(exc: ValidationError, fields: list[dict[str, Any]]) -> str:
    """What is wrong, naming the property: `fields.2.side` -> the third property."""
    errors = exc.errors()
    if any(len(e["loc"]) > 1 and e["loc"][0] == "fields" for e in errors):
        # The properties' own errors say why the list came out short.
        errors = [e for e in errors if e["loc"] != ("fields",)]
    found = []
    for error in errors[:5]:
        location = error["loc"]
        if (
            location[:1] == ("fields",)
            and len(location) > 1
            and isinstance(location[1], int)
        ):
            prop = fields[location[1]]["name"] if location[1] < len(fields) else "?"
            detail = ".".join(map(str, location[2:]))
            what = {
                "side": f'needs "{SIDE_KEY}": "judge" or "executor"',
                "description": "needs a description (the extraction prompt reads it)",
            }.get(detail, error["msg"])
            found.append(f"property {prop!r} {what}")
        else:
            found.append(str(error["msg"]).removeprefix("Value error, "))
    return "; ".join(dict.fromkeys(found)) + "."


_FIX = (
    f'A rule schema names each field with a description and "{SIDE_KEY}": "judge" '
    'or "executor" (see `tag extract --help`, option --schema).'
)


_FILE_FIX = "Pass a built-in schema's name (condition, nba) or a JSON Schema file."


def _error(where: str, problem: str, fix: str = _FIX) -> RuleSchemaError:
    return RuleSchemaError(f"Rule schema {where}: {problem} {fix}")


CONDITION_SCHEMA = RuleSchema(
    name="condition",
    description="operational rules that a matcher can test against a task input and "
    "an executor can carry out",
    fields=(
        SchemaField(
            name="condition",
            description="an observable property of the task input under which the "
            "rule applies, checkable from the input alone.",
            side="judge",
        ),
        SchemaField(
            name="action",
            description="the concrete operation to perform, not a goal.",
            side="executor",
        ),
    ),
)
"""The method's default: an observable condition (judged) and an action (executed)."""

NBA_SCHEMA = RuleSchema(
    name="nba",
    description="constraint rules that a matcher can test against a transaction "
    "scenario and an executor can check the scenario against",
    fields=(
        SchemaField(
            name="applies_when",
            description="the transaction the rule governs (signing, trade, "
            "extension, renegotiation, qualifying offer, sign-and-trade) and, when "
            "the rule is about one, the named mechanism (e.g. Mid-Level Exception, "
            "Bi-annual Exception, traded player exception, two-way or 10-day "
            "contract, rookie scale or designated veteran extension), stated as "
            "facts a scenario can show.",
            side="judge",
        ),
        SchemaField(
            name="constraint",
            description="the limit or requirement the rule imposes, with its "
            "numbers (amounts, percentages, seasons, dates).",
            side="judge",
        ),
        SchemaField(
            name="violation_check",
            description="how to tell from a scenario's facts that the constraint is "
            "broken.",
            side="judge",
        ),
        SchemaField(
            name="does_not_apply_to",
            description="the cases the rule explicitly excludes.",
            side="judge",
            required=False,
        ),
        SchemaField(
            name="action",
            description="what to compute or check for a scenario the rule applies "
            "to, and the conclusion when it is violated.",
            side="executor",
        ),
    ),
)
"""The paper's NBA matcher schema (judged by `matching.NBA_PROFILE`)."""

BUILT_IN_SCHEMAS: dict[str, RuleSchema] = {
    schema.name: schema for schema in (CONDITION_SCHEMA, NBA_SCHEMA)
}
"""The schemas `tag extract --schema` knows by name."""


def rule_schema(spec: RuleSchema | str | os.PathLike[str]) -> RuleSchema:
    """A schema by name (`condition`, `nba`), from a JSON Schema file, or as given.

    Raises:
        RuleSchemaError: An unknown name that is no file, or a file that is not a
            rule schema.
    """
    if isinstance(spec, RuleSchema):
        return spec
    if not str(spec).strip():
        raise _error(repr(str(spec)), "is empty.", _FILE_FIX)
    if str(spec).lower() in BUILT_IN_SCHEMAS and not Path(spec).is_file():
        return BUILT_IN_SCHEMAS[str(spec).lower()]
    if (
        isinstance(spec, str)
        and not spec.lower().endswith(".json")
        and not Path(spec).exists()
    ):
        known = ", ".join(BUILT_IN_SCHEMAS)
        raise _error(
            repr(spec),
            f"no built-in schema has this name ({known}) and no such file.",
            _FILE_FIX,
        )
    return RuleSchema.load(spec)
