"""What the executor is asked and how its answer is read: `ExecutionTemplate`.

Four templates are built in:

- `GENERIC_TEMPLATE`: apply the actions to the input, return the result only.
- `NPOV_TEMPLATE`: the paper's neutral-point-of-view rewrite, parsed to `NPOVResult`.
- `CODE_TEMPLATE`: HumanEval + PEP 8, parsed to the code of the complete function.
- `NBA_TEMPLATE`: RuleArena NBA legality, parsed to `NBAVerdict`.

`format_actions` fills the guidance slot: one `[rule_id] action` line per rule, or a
numbered passage, `[P1] passage text`, for a document without `metadata["rule_id"]`
(chunk mode, so the same prompts also run the RAG baselines).
"""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Sequence
from typing import Annotated, Any

from langchain_core.documents import Document
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import BaseOutputParser
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from langchain_tag._text import first_json_object, strip_thinking
from langchain_tag.execution import prompts
from langchain_tag.rules import Rule

_SNIPPET_CHARS = 200


def _snippet(text: str) -> str:
    """The start of a model answer, quoted, for error messages."""
    if len(text) <= _SNIPPET_CHARS:
        return repr(text)
    return f"{text[:_SNIPPET_CHARS]!r}... ({len(text)} characters)"


def _malformed(expected: str, problem: str, text: str) -> OutputParserException:
    """An error naming what was expected, what came, and the start of the answer."""
    return OutputParserException(
        f"Malformed executor output: expected {expected}, but {problem}. "
        f"The answer began: {_snippet(text)}",
        llm_output=text,
    )


# --- Reference material ---------------------------------------------------------------


def format_actions(rules: Sequence[Document | Rule]) -> str:
    """The guidance slot of an execution prompt: one item per rule or passage.

    A `Rule` becomes `[rule_id] action`; a `Document` with `metadata["rule_id"]` (as
    `TAGRetriever` returns) becomes `[rule_id] page_content`, its content being the
    action. Nothing else of a rule is listed: not its name, condition, source text or
    tags. Actions are folded onto one line.

    A `Document` without a `rule_id` is a passage (chunk mode, e.g. from a vector
    store retriever): it is listed as `[P1] text`, `[P2] text`, ... in order, with its
    line breaks kept, and items are then separated by blank lines.

    No rules give `prompts.NO_GUIDANCE` ("(none)"), which the prompts explain.
    Composes after a retriever: `retriever | format_actions`.
    """
    items: list[str] = []
    passages = 0
    given: Sequence[object] = rules  # checked: chains pass whatever came before
    for rule in given:
        if isinstance(rule, Rule):
            items.append(f"[{rule.rule_id}] {_one_line(rule.action)}")
        elif isinstance(rule, Document):
            rule_id = rule.metadata.get("rule_id")
            if rule_id:
                items.append(f"[{rule_id}] {_one_line(rule.page_content)}")
            else:
                passages += 1
                items.append(f"[P{passages}] {rule.page_content.strip()}")
        else:
            msg = (
                "format_actions takes Rules and Documents (as TAGRetriever or any "
                f"retriever returns them), not {type(rule).__name__}."
            )
            raise TypeError(msg)
    if not items:
        return prompts.NO_GUIDANCE
    return ("\n\n" if passages else "\n").join(items)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- Parsers --------------------------------------------------------------------------


class TextResultParser(BaseOutputParser[str]):
    """The generic template's parser: the answer text, stripped; never empty."""

    def parse(self, text: str) -> str:
        """Return the result text without surrounding whitespace.

        Raises:
            OutputParserException: The answer is empty.
        """
        result = strip_thinking(text).strip()
        if not result:
            expected, problem = "the result text", "the answer is empty"
            raise _malformed(expected, problem, text)
        return result

    @property
    def _type(self) -> str:
        return "tag_text_result"


class NPOVResult(BaseModel):
    """A parsed NPOV rewrite: which rules were applied, why, and the sentence."""

    model_config = ConfigDict(frozen=True)

    applied_rules: list[str] = Field(
        description="Ids of the applied rules (or passages); empty for NONE."
    )
    reasoning: str
    rewrite: str


_NPOV_LABELS = {
    label: re.compile(
        rf"^[ \t>#*_-]*{label}[ \t*_]*:[ \t*_]*", re.IGNORECASE | re.MULTILINE
    )
    for label in ("applied rules", "reasoning", "rewrite")
}
_ID_SEPARATORS = re.compile(r"[,;\s]+")
_ID_TRIM = "[]()<>\"'`*."
_NONE_WORDS = frozenset({"none", "n/a"})


class NPOVOutputParser(BaseOutputParser[NPOVResult]):
    """Parses the three-line NPOV answer into an `NPOVResult`.

    Expected: `Applied rules: <ids|NONE>`, `Reasoning: ...`, `Rewrite: ...`, in that
    order. Tolerated: markdown emphasis around the labels, text before the first label
    (such as a reasoning model's thoughts), ids in brackets or joined by "and", and a
    rewrite over several lines (everything after `Rewrite:`). NONE parses to `[]`;
    whether the rewrite then equals the input is not checked here.
    """

    def parse(self, text: str) -> NPOVResult:
        """Parse one answer.

        Raises:
            OutputParserException: A label is missing or out of order, the ids are
                missing or mix NONE with ids, or the rewrite is empty.
        """
        cleaned = _strip_fences(strip_thinking(text))
        expected = (
            "three lines 'Applied rules: <ids|NONE>', 'Reasoning: ...', 'Rewrite: ...'"
        )
        found: dict[str, re.Match[str]] = {}
        position, where = 0, ""
        for label, pattern in _NPOV_LABELS.items():
            match = pattern.search(cleaned, position)
            if match is None:
                problem = f"no line starts with {label.capitalize() + ':'!r}{where}"
                raise _malformed(expected, problem, text)
            found[label] = match
            position, where = match.end(), f" after the {label.capitalize()!r} line"
        applied = cleaned[found["applied rules"].end() : found["reasoning"].start()]
        reasoning = cleaned[found["reasoning"].end() : found["rewrite"].start()]
        rewrite = cleaned[found["rewrite"].end() :].strip()
        if not rewrite:
            raise _malformed(expected, "the rewrite is empty", text)
        return NPOVResult(
            applied_rules=self._rule_ids(applied, expected, text),
            reasoning=" ".join(reasoning.split()),
            rewrite=rewrite,
        )

    @staticmethod
    def _rule_ids(field: str, expected: str, text: str) -> list[str]:
        tokens = [t.strip(_ID_TRIM) for t in _ID_SEPARATORS.split(field)]
        tokens = [t for t in tokens if t and t.lower() != "and"]
        if not tokens:
            problem = "'Applied rules:' lists no ids and no NONE"
            raise _malformed(expected, problem, text)
        nones = [t for t in tokens if t.lower() in _NONE_WORDS]
        if nones and len(nones) < len(tokens):
            problem = f"'Applied rules:' mixes NONE with rule ids ({field.strip()!r})"
            raise _malformed(expected, problem, text)
        return [] if nones else list(dict.fromkeys(tokens))

    @property
    def _type(self) -> str:
        return "tag_npov"


_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _strip_fences(text: str) -> str:
    """The content of the first ``` block if there is one, else the text itself.

    An opening fence that is never closed (a truncated answer) is dropped and the
    rest kept.
    """
    match = _FENCE.search(text)
    return match.group(2) if match else text


class CodeOutputParser(BaseOutputParser[str]):
    """Parses the code template's answer into Python source.

    Takes the first ``` block when the answer has one (```python or bare), else the
    whole answer; then checks that it is not empty, that it parses (`ast.parse`), and
    that it defines at least one function at top level, as the template asks for the
    full function. The source is returned as written, without the fences.
    """

    def parse(self, text: str) -> str:
        """Parse one answer.

        Raises:
            OutputParserException: The answer holds no code, the code does not parse
                (the message gives the line and the error), or it defines no function.
        """
        expected = "only the Python code of the complete function"
        code = _strip_fences(strip_thinking(text)).strip("\n")
        if not code.strip():
            raise _malformed(expected, "the answer contains no code", text)
        try:
            tree = ast.parse(code)
        except SyntaxError as error:
            line = (error.text or "").rstrip("\n")
            problem = f"the code does not parse: line {error.lineno}: {error.msg}" + (
                f" (in {line.strip()!r})" if line.strip() else ""
            )
            raise _malformed(expected, problem, text) from error
        if not any(
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in tree.body
        ):
            problem = "the code defines no function (only a body or other statements)"
            raise _malformed(expected, problem, text)
        return code + "\n"

    @property
    def _type(self) -> str:
        return "tag_code"


_OPERAND = re.compile(
    r"^(?:(?:illegal\s+)?operation|op\.?|(?:problematic\s+)?team)?\s*"
    r"[(\[]?([A-Za-z])[)\]]?\.?$",
    re.IGNORECASE,
)


class NBAVerdict(BaseModel):
    """A parsed RuleArena NBA decision.

    `answer` is True when some operation is illegal; then `illegal_operation` and
    `problematic_team` name it and the team at fault (capital letters). When every
    operation is legal, `answer` is False and both are None.
    """

    model_config = ConfigDict(frozen=True)

    answer: bool = Field(description="True if some operation is illegal.")
    illegal_operation: str | None = Field(
        description="The illegal operation's letter; None when all are legal."
    )
    problematic_team: str | None = Field(
        description="The letter of the team at fault; None when all are legal."
    )
    rationale: str

    @field_validator("illegal_operation", "problematic_team", mode="before")
    @classmethod
    def _letter(cls, value: Any) -> Any:
        """Blank means None; 'Operation B', 'team c', '(B)' mean the letter."""
        if isinstance(value, str):
            value = value.strip()
            if not value or value.lower() in {"null", "none", "n/a"}:
                return None
            found = _OPERAND.match(value)
            return found.group(1).upper() if found else value
        return value

    @model_validator(mode="after")
    def _consistent(self) -> NBAVerdict:
        """An illegal operation names both letters; all legal, neither."""
        named = {"illegal_operation": self.illegal_operation}
        named["problematic_team"] = self.problematic_team
        wrong = [n for n, value in named.items() if (value is None) == self.answer]
        if not wrong:
            return self
        if self.answer:
            state = "true (an operation is illegal)"
            fix = "null; name the operation and the team"
        else:
            state, fix = "false (all operations legal)", "set; both must be null"
        verb = "is" if len(wrong) == 1 else "are"
        msg = f"answer is {state} but {' and '.join(wrong)} {verb} {fix}"
        raise ValueError(msg)

    def answer_line(self) -> str:
        """RuleArena's final answer line, which its accuracy check reads.

        Returns:
            `Answer: False.` or `Answer: True. Illegal Operation: X. Problematic
            Team: Y.`
        """
        if not self.answer:
            return "Answer: False."
        return (
            f"Answer: True. Illegal Operation: {self.illegal_operation}. "
            f"Problematic Team: {self.problematic_team}."
        )


class NBAVerdictOutputParser(BaseOutputParser[NBAVerdict]):
    """Parses the NBA template's JSON answer into an `NBAVerdict`.

    Finds the first JSON object with an "answer" key anywhere in the answer, so code
    fences and prose around it are tolerated; all four fields must be present, and
    they must agree (see `NBAVerdict`).
    """

    def parse(self, text: str) -> NBAVerdict:
        """Parse one answer.

        Raises:
            OutputParserException: No JSON object with an "answer" key, a missing
                field, a wrong type, or an inconsistent verdict.
        """
        expected = (
            'one JSON object {"answer": true|false, "illegal_operation": ..., '
            '"problematic_team": ..., "rationale": ...}'
        )
        data = first_json_object(strip_thinking(text), "answer")
        if data is None:
            problem = 'no JSON object with an "answer" key was found'
            raise _malformed(expected, problem, text)
        missing = [name for name in NBAVerdict.model_fields if name not in data]
        if missing:
            problem = f"the object lacks {', '.join(repr(m) for m in missing)}"
            raise _malformed(expected, problem, text)
        try:
            return NBAVerdict.model_validate(data)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'verdict'}: "
                + e["msg"].removeprefix("Value error, ")
                for e in error.errors()
            )
            raise _malformed(expected, f"it is invalid ({problems})", text) from error

    @property
    def _type(self) -> str:
        return "tag_nba_verdict"


# --- Templates ------------------------------------------------------------------------


def _parser(value: Any) -> BaseOutputParser[Any]:
    # Checked by class only: pydantic would otherwise rebuild a parametrized generic.
    if not isinstance(value, BaseOutputParser):
        msg = f"output_parser must be a BaseOutputParser, not {type(value).__name__}"
        raise ValueError(msg)  # noqa: TRY004 - pydantic reports ValueErrors
    return value


class ExecutionTemplate(BaseModel):
    """What the executor asks of the model and how its answer is read.

    The user template has two slots, `{input}` and `{actions}` (the guidance, as
    `format_actions` renders it); other literal braces must be doubled. The system
    prompt is sent as it is. Make a variant with `model_copy(update={...})`.
    """

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1)
    system_prompt: str = Field(min_length=1)
    user_template: str = prompts.EXECUTION_USER
    output_parser: Annotated[BaseOutputParser[Any], PlainValidator(_parser)]
    """Reads the model's answer; raises `OutputParserException` when malformed."""

    @field_validator("user_template")
    @classmethod
    def _two_slots(cls, value: str) -> str:
        try:
            slots = {name for _, name, _, _ in string.Formatter().parse(value) if name}
        except ValueError as error:
            msg = f"user_template is not a valid format string: {error}"
            raise ValueError(msg) from error
        if slots != {"input", "actions"}:
            msg = (
                "user_template must have exactly the slots {input} and {actions} "
                f"(double other braces); it has {sorted(map(str, slots))}"
            )
            raise ValueError(msg)
        return value

    def messages(self, text: str, actions: str) -> list[BaseMessage]:
        """The system and user messages for `text` and a rendered guidance slot.

        Delimiter tags inside either are escaped, so neither can close its block.
        """
        return [
            SystemMessage(self.system_prompt),
            HumanMessage(
                self.user_template.format(
                    input=prompts.escape_execution_delimiters(text),
                    actions=prompts.escape_execution_delimiters(actions),
                )
            ),
        ]

    def parse(self, text: str) -> Any:
        """Parse a model answer with this template's parser."""
        return self.output_parser.parse(text)


GENERIC_TEMPLATE = ExecutionTemplate(
    name="generic",
    system_prompt=prompts.GENERIC_EXECUTION_SYSTEM,
    output_parser=TextResultParser(),
)
"""Apply the actions to the input; the result text only (a `str`)."""

NPOV_TEMPLATE = ExecutionTemplate(
    name="npov",
    system_prompt=prompts.NPOV_EXECUTION_SYSTEM,
    output_parser=NPOVOutputParser(),
)
"""The paper's NPOV sentence rewrite; parses to `NPOVResult`."""

CODE_TEMPLATE = ExecutionTemplate(
    name="code",
    system_prompt=prompts.CODE_EXECUTION_SYSTEM,
    output_parser=CodeOutputParser(),
)
"""HumanEval + PEP 8: complete the function; parses to its source code (a `str`)."""

NBA_TEMPLATE = ExecutionTemplate(
    name="nba",
    system_prompt=prompts.NBA_EXECUTION_SYSTEM,
    output_parser=NBAVerdictOutputParser(),
)
"""RuleArena NBA legality; parses to `NBAVerdict` (see `NBAVerdict.answer_line`)."""

TEMPLATES: dict[str, ExecutionTemplate] = {
    "generic": GENERIC_TEMPLATE,
    "npov": NPOV_TEMPLATE,
    "code": CODE_TEMPLATE,
    "nba": NBA_TEMPLATE,
}
"""The templates selectable by name (`QueryContext.template`, `tag run --template`)."""
