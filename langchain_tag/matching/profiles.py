"""Rule-schema profiles: what the judge sees of a rule and how it must answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from langchain_tag.matching import prompts
from langchain_tag.rule_schemas import CONDITION_SCHEMA, NBA_SCHEMA, RuleSchema
from langchain_tag.rules import Rule, Rulebook


class YesNoOutput(BaseModel):
    """Structured output of the condition profile."""

    verdict: Literal["YES", "NO"]


class ApplicableOutput(BaseModel):
    """Structured output of the constraint profile."""

    applicable: bool
    reason: str


class RuleYesNo(YesNoOutput):
    """One rule's verdict in a condition-profile answer judging several rules."""

    rule_id: str


class BatchYesNoOutput(BaseModel):
    """Structured output of the condition profile judging several rules."""

    verdicts: list[RuleYesNo]


class RuleApplicable(ApplicableOutput):
    """One rule's verdict in a constraint-profile answer judging several rules."""

    rule_id: str


class BatchApplicableOutput(BaseModel):
    """Structured output of the constraint profile judging several rules."""

    verdicts: list[RuleApplicable]


# With a rationale (`ApplicabilityJudge(rationale=True)`) the reason comes first, so
# that the model states the decisive fact before it decides; the defaults above stay
# as they were, byte for byte, so that their prompts and verdicts do not change.
_REASON = "One short sentence citing the decisive fact."


class ReasonedYesNoOutput(BaseModel):
    """Structured output of the condition profile with a rationale: reason first."""

    reason: str = Field(description=_REASON)
    verdict: Literal["YES", "NO"]


class ReasonedApplicableOutput(BaseModel):
    """Structured output of the constraint profile with a rationale: reason first."""

    reason: str = Field(description=_REASON)
    applicable: bool


class ReasonedRuleYesNo(BaseModel):
    """One rule's reasoned verdict in a condition-profile answer on several rules."""

    rule_id: str
    reason: str = Field(description=_REASON)
    verdict: Literal["YES", "NO"]


class BatchReasonedYesNoOutput(BaseModel):
    """Reasoned structured output of the condition profile judging several rules."""

    verdicts: list[ReasonedRuleYesNo]


class ReasonedRuleApplicable(BaseModel):
    """One rule's reasoned verdict in a constraint-profile answer on several rules."""

    rule_id: str
    reason: str = Field(description=_REASON)
    applicable: bool


class BatchReasonedApplicableOutput(BaseModel):
    """Reasoned structured output of the constraint profile judging several rules."""

    verdicts: list[ReasonedRuleApplicable]


_OutputSchema = type[
    YesNoOutput | ApplicableOutput | ReasonedYesNoOutput | ReasonedApplicableOutput
]
"""A profile's answer to one rule."""
_BatchOutputSchema = type[
    BatchYesNoOutput
    | BatchApplicableOutput
    | BatchReasonedYesNoOutput
    | BatchReasonedApplicableOutput
]
"""A profile's answer to several rules."""


class RuleSchemaProfile(BaseModel):
    """What the judge sees of a rule, what it is told, and what it must answer.

    The default profile shows `rule_id, name, condition, tags` and asks for YES/NO.
    Domain profiles (like the paper's NBA matcher) show other rule fields and ask for
    a boolean with a one-sentence reason. No profile may show the action.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    system_prompt: str
    output_instruction: str
    rule_fields: tuple[str, ...]
    output_schema: _OutputSchema
    batch_output_instruction: str | None = None
    """The closing line when several rules share a call; None: one rule per call."""
    batch_output_schema: _BatchOutputSchema | None = None
    schema_fields: tuple[str, ...] = ()
    """Names in `rule_fields` read from `Rule.fields` (a user-defined schema's)."""

    @property
    def batch_system_prompt(self) -> str:
        """The system prompt when several rules share a call."""
        return self.system_prompt + prompts.BATCH_NOTE

    @model_validator(mode="after")
    def _never_the_action(self) -> RuleSchemaProfile:
        if "action" in self.rule_fields:
            msg = "a rule-schema profile must not show the rule's action to the judge"
            raise ValueError(msg)
        unknown = (
            set(self.rule_fields) - set(Rule.model_fields) - set(self.schema_fields)
        )
        if unknown:
            msg = f"unknown rule fields in profile {self.name!r}: {sorted(unknown)}"
            raise ValueError(msg)
        return self

    def with_rationale(self) -> RuleSchemaProfile:
        """This profile asking for a one-sentence reason before each verdict.

        Same name and rule fields; the system prompt ends with the reasoned format
        (in place of its closing `Output only ...` paragraph), and the answers and
        their schemas put `reason` first and require it. The format follows the
        output schema: a YES/NO `verdict`, or an `applicable` boolean.
        """
        if issubclass(
            self.output_schema, ReasonedYesNoOutput | ReasonedApplicableOutput
        ):
            return self
        applicable = issubclass(self.output_schema, ApplicableOutput)
        texts = prompts.CONSTRAINT_RATIONALE if applicable else prompts.JUDGE_RATIONALE
        batched = self.batch_output_schema is not None
        return self.model_copy(
            update={
                "system_prompt": prompts.rationale_system_prompt(
                    self.system_prompt, texts.system_format
                ),
                "output_instruction": texts.output_instruction,
                "output_schema": (
                    ReasonedApplicableOutput if applicable else ReasonedYesNoOutput
                ),
                "batch_output_instruction": (
                    texts.batch_output_instruction if batched else None
                ),
                "batch_output_schema": (
                    None
                    if not batched
                    else BatchReasonedApplicableOutput
                    if applicable
                    else BatchReasonedYesNoOutput
                ),
            }
        )

    def judged_fields(self, rule: Rule) -> list[tuple[str, str]]:
        """The (label, value) pairs the judge sees for `rule`, empty ones left out."""
        pairs = []
        for name in self.rule_fields:
            value = (
                rule.fields.get(name)
                if name in self.schema_fields
                else getattr(rule, name)
            )
            if name == "applies_when" and not value:
                value = rule.condition  # rules without profile fields still judge
            if isinstance(value, tuple):
                value = ", ".join(value)
            if value:
                pairs.append((name, str(value)))
        return pairs


CONDITION_PROFILE = RuleSchemaProfile(
    name="condition",
    system_prompt=prompts.JUDGE_SYSTEM,
    output_instruction=prompts.JUDGE_OUTPUT_INSTRUCTION,
    rule_fields=("rule_id", "name", "condition", "tags"),
    output_schema=YesNoOutput,
    batch_output_instruction=prompts.JUDGE_BATCH_OUTPUT_INSTRUCTION,
    batch_output_schema=BatchYesNoOutput,
)
"""The method's default matcher: YES/NO on the rule's observable condition."""


def constraint_profile(
    name: str = "constraint", domain_criteria: Sequence[str] = ()
) -> RuleSchemaProfile:
    """A profile that judges rules by their constraint-schema fields.

    The judge sees `applies_when` (or `condition` when a rule has none), `constraint`,
    `violation_check` and `does_not_apply_to`, and answers `applicable` with a reason.

    Args:
        name: The profile's name (part of the verdict cache key).
        domain_criteria: Extra decision criteria for the domain, one sentence each.
    """
    return RuleSchemaProfile(
        name=name,
        system_prompt=prompts.CONSTRAINT_JUDGE_SYSTEM.format(
            domain_criteria=prompts.render_criteria(domain_criteria)
        ),
        output_instruction=prompts.CONSTRAINT_OUTPUT_INSTRUCTION,
        rule_fields=(
            "rule_id",
            "name",
            "applies_when",
            "constraint",
            "violation_check",
            "does_not_apply_to",
            "tags",
        ),
        output_schema=ApplicableOutput,
        batch_output_instruction=prompts.CONSTRAINT_BATCH_OUTPUT_INSTRUCTION,
        batch_output_schema=BatchApplicableOutput,
    )


NBA_PROFILE = constraint_profile("nba", prompts.NBA_CRITERIA)
"""The paper's NBA salary-cap matcher, as a constraint profile."""

PROFILES: dict[str, RuleSchemaProfile] = {
    "condition": CONDITION_PROFILE,
    "nba": NBA_PROFILE,
}
"""The profiles selectable by name (`QueryContext.profile`, `tag run --profile`)."""


def schema_profile(schema: RuleSchema) -> RuleSchemaProfile:
    """The profile that judges rules extracted in `schema`.

    The built-in schemas get their own profiles (`CONDITION_PROFILE`,
    `NBA_PROFILE`). A user-defined schema is judged YES/NO, as the condition
    profile is, on the rule's name, its judge-side fields (described in the system
    prompt) and its tags; never its executor-side fields, which are only in the
    action.
    """
    built_in = schema.built_in()
    if built_in is CONDITION_SCHEMA:
        return CONDITION_PROFILE
    if built_in is NBA_SCHEMA:
        return NBA_PROFILE
    judged = tuple(f.name for f in schema.judge_fields)
    own = tuple(name for name in judged if name not in Rule.model_fields)
    return RuleSchemaProfile(
        # The digest keeps verdicts of two schemas that share a name apart.
        name=f"schema:{schema.name}:{schema.digest()[:12]}",
        system_prompt=prompts.SCHEMA_JUDGE_SYSTEM.format(
            field_descriptions="".join(
                f"- {f.name}: {f.description}\n" for f in schema.judge_fields
            ),
            domain_criteria=prompts.render_criteria(schema.judge_criteria),
        ),
        output_instruction=prompts.JUDGE_OUTPUT_INSTRUCTION,
        rule_fields=("rule_id", "name", *judged, "tags"),
        output_schema=YesNoOutput,
        batch_output_instruction=prompts.JUDGE_BATCH_OUTPUT_INSTRUCTION,
        batch_output_schema=BatchYesNoOutput,
        schema_fields=own,
    )


def profile_for(rulebook: Rulebook) -> RuleSchemaProfile:
    """The profile a rulebook's rules are judged with by default.

    Its schema's (`schema_profile`) when it records one; else the condition
    profile.
    """
    if rulebook.rule_schema is None:
        return CONDITION_PROFILE
    return schema_profile(rulebook.rule_schema)
