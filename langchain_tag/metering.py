"""Stand-in models for dry runs: they answer from a policy and bill what they are sent.

The estimates (`tag run --inputs --estimate`, `tag extract --estimate`, `tag eval
--estimate`) run the real code with these in place of the real models, so what is
counted is what the code sends, whatever judge, retriever or phase sends it;
nothing goes over the network.

- `MeteringChatModel`: a chat model answering from `answer(messages)`; each answer
  reports the usage a provider would bill (`usage_metadata`): the input tokens of
  the messages as sent (`TokenCounter.request`: the estimate's tokenizer), the part
  a provider's prompt cache would serve (`SimulatedPromptCache`, one per model,
  shared by its copies), and the answer's tokens. `UsageCounter` reads it as it
  reads a provider's.
- `MeteringDecisionModel`: a decision model whose requests report their input
  tokens as `OpenAIClassifier` sends them (`decision_request_tokens`), no output
  tokens and none cached, answering each question from `decide`.
- The policies: `judge_answers` (a verdict per rule in the format the judge's
  prompt asks for, YES where `decide` says so), `executor_answers` (a typical
  answer per execution template) and `stand_in_judge` (a judge's copy on stand-ins,
  writing to no cache or log of the run's).
"""

from __future__ import annotations

import asyncio
import json
import re
import string
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.decisions import (
    BaseDecisionModel,
    ClassifierResponse,
    Noul,
    Question,
    State,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.stores import BaseStore
from pydantic import ConfigDict, Field, PrivateAttr

from langchain_tag.cache import InMemoryVerdictCache
from langchain_tag.execution.templates import ExecutionTemplate
from langchain_tag.matching.decision import noul_response
from langchain_tag.matching.judge import BaseJudge
from langchain_tag.matching.prompts import read_decision_question, read_judge_batch
from langchain_tag.usage import (
    PromptCaching,
    SimulatedPromptCache,
    TokenCounter,
    decision_request_tokens,
)

__all__ = [
    "EXECUTOR_ANSWERS",
    "JUDGE_NO_REASON",
    "Answer",
    "Decide",
    "MeteringChatModel",
    "MeteringDecisionModel",
    "executor_answers",
    "judge_answers",
    "run_to_end",
    "stand_in_judge",
]


Answer = Callable[[Sequence[BaseMessage]], str]
"""A chat stand-in's policy: the answer to the messages of one call."""

Decide = Callable[[str, str], bool]
"""A judge's policy: whether the rule (its id) applies to the input (as judged)."""


class MeteringChatModel(BaseChatModel):
    """A chat model answering from `answer`, reporting the usage a provider would bill.

    Copies (`answering`, and those the judges make to set their options) share
    one prompt cache: they are one model at the provider. Thread-safe.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    answer: Answer = Field(exclude=True)
    """The policy: the answer to one call's messages."""
    counter: TokenCounter = Field(exclude=True)
    """How tokens are counted (`usage.token_counter()`)."""
    caching: PromptCaching | None = None
    """What the provider's prompt cache serves; None: nothing cached."""
    in_flight: int = 1
    """Calls in flight at once: a prompt cannot read those sent just before it."""
    keep: int | None = None
    """Prompts the simulated cache remembers (the most recent); None for all."""
    model_name: str = "tag-metering"
    # The options judges and executors set on their copy of a model.
    temperature: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    max_retries: int | None = None

    _cache: SimulatedPromptCache | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def model_post_init(self, context: Any, /) -> None:  # noqa: D102 - pydantic hook
        super().model_post_init(context)
        if self.caching is not None:
            self._cache = SimulatedPromptCache(
                self.caching,
                self.counter.count,
                in_flight=self.in_flight,
                keep=self.keep,
            )

    @property
    def _llm_type(self) -> str:
        return "tag-metering"

    def answering(self, answer: Answer) -> MeteringChatModel:
        """This model answering by another policy, its prompt cache shared."""
        return self.model_copy(update={"answer": answer})

    def _result(self, messages: Sequence[BaseMessage]) -> ChatResult:
        text = self.answer(messages)
        with self._lock:  # the simulated cache's order is the order of sending
            usage = self.counter.request(messages, text, self._cache)
        message = AIMessage(
            text,
            usage_metadata={
                "input_tokens": usage.input_tokens or 0,
                "output_tokens": usage.output_tokens or 0,
                "total_tokens": (usage.input_tokens or 0) + (usage.output_tokens or 0),
                "input_token_details": {"cache_read": usage.cached_input_tokens or 0},
            },
            response_metadata={"model_name": self.model_name},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._result(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._result(messages)


class MeteringDecisionModel(BaseDecisionModel):
    """A decision model answering from `decide`, billed for its requests' input tokens.

    Each request reports the input once and each question as `OpenAIClassifier`
    sends it (`decision_request_tokens`), no output tokens and none cached; a
    question is answered P(yes) 1 where `decide` says the rule applies, else 0.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = "tag-metering"
    decide: Decide = Field(exclude=True)
    counter: TokenCounter = Field(exclude=True)

    @property
    def _provider(self) -> str:
        return "tag-metering"

    def _classify(
        self, state: State, questions: dict[str, Question]
    ) -> ClassifierResponse:
        text = state if isinstance(state, str) else json.dumps(state)
        nouls = [q for q in questions.values() if isinstance(q, Noul)]
        answers = {
            name: float(self.decide(text, _decision_rule_id(question)))
            for name, question in questions.items()
        }
        tokens = decision_request_tokens(self.counter.count, text, nouls)
        return noul_response(self.model, answers, tokens, "req_metering")

    async def _aclassify(
        self, state: State, questions: dict[str, Question]
    ) -> ClassifierResponse:
        return self._classify(state, questions)  # no I/O: no thread needed


def _decision_rule_id(question: Question) -> str:
    instructions = getattr(question, "instructions", "")
    fields = read_decision_question(
        instructions if isinstance(instructions, str) else ""
    )
    return (fields or {}).get("rule_id", "")


# --- Policies -------------------------------------------------------------------------

JUDGE_NO_REASON = "The scenario states no fact that meets the rule's condition."
"""The one-sentence reason of a stand-in judge's NO, for profiles that ask for one."""
JUDGE_YES_REASON = "The scenario states the fact that meets the rule's condition."
"""The one-sentence reason of a stand-in judge's YES."""

_DECISION_KEYS = ('"reason"', '"verdict"', '"applicable"')


def judge_answers(decide: Decide, *, otherwise: str = "YES") -> Answer:
    """A judge's answers: a verdict per rule, in the format its prompt asks for.

    The prompt's closing line names the keys (`verdict`, `applicable`, `reason`)
    in their order; several rule blocks get `{"verdicts": [...]}`. A prompt that is
    no judge prompt (LangChain's LLMChainFilter, say) is answered `otherwise`.
    """

    def answer(messages: Sequence[BaseMessage]) -> str:
        prompt = messages[-1].text if messages else ""
        read = read_judge_batch(prompt)
        if read is None:
            return otherwise
        text, rules = read
        closing = prompt[prompt.rfind("\n") + 1 :]
        keys = sorted(
            (key for key in _DECISION_KEYS if key in closing), key=closing.find
        )
        verdicts = []
        for fields in rules:
            holds = decide(text, fields.get("rule_id", ""))
            values = {
                '"verdict"': "YES" if holds else "NO",
                '"applicable"': holds,
                '"reason"': JUDGE_YES_REASON if holds else JUDGE_NO_REASON,
            }
            verdicts.append({key.strip('"'): values[key] for key in keys})
        if '"verdicts"' in closing:
            return json.dumps(
                {
                    "verdicts": [
                        {"rule_id": fields.get("rule_id", ""), **verdict}
                        for fields, verdict in zip(rules, verdicts, strict=True)
                    ]
                }
            )
        return json.dumps(verdicts[0])

    return answer


_NBA_RATIONALE = (
    "Team A's payroll after the trade is $182,400,000, above the first apron of "
    "$178,132,000, so it may not take back more than 100% of the outgoing salary; "
    "Operation B brings in $14,200,000 for $11,000,000 out, which breaks that limit."
)
_NPOV_REASONING = (
    "Removed the loaded adjective and attributed the opinion to the source the "
    "sentence already names."
)
_CODE_BODY = """\
    result = []
    for index, value in enumerate(values):
        if value is not None and value > threshold:
            result.append(index)
    return result
"""

EXECUTOR_ANSWERS: dict[str, str] = {
    "nba": json.dumps(
        {
            "answer": True,
            "illegal_operation": "B",
            "problematic_team": "A",
            "rationale": _NBA_RATIONALE,
        }
    ),
    "npov": f"Applied rules: NPOV-001, NPOV-002\nReasoning: {_NPOV_REASONING}\n"
    "Rewrite: {input}",
    "code": "{input}\n" + _CODE_BODY,
    "generic": "{input}",
}
"""A typical answer per execution template (by `ExecutionTemplate.name`), its
`{input}` replaced by the executor's input: the executor's output tokens are this
answer's. NBA: the verdict with a two-sentence rationale; NPOV: two rules, a
sentence of reasoning and the sentence rewritten; code: the prompt's function
with a five-line body; other templates: the input returned as long as it came."""


def executor_answers(template: ExecutionTemplate) -> Answer:
    """The executor's answers: `EXECUTOR_ANSWERS` for the template, with its input.

    The input is read back from the user message by the template's own layout.
    """
    pattern = _slot_pattern(template.user_template)
    answer = EXECUTOR_ANSWERS.get(template.name, EXECUTOR_ANSWERS["generic"])

    def respond(messages: Sequence[BaseMessage]) -> str:
        found = pattern.fullmatch(messages[-1].text) if messages else None
        return answer.replace("{input}", found.group("input") if found else "")

    return respond


def _slot_pattern(template: str) -> re.Pattern[str]:
    """A pattern matching `template` rendered, its `{input}` slot captured."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name == "input":
            parts.append("(?P<input>.*)")
        elif name is not None:
            parts.append(".*")
    return re.compile("".join(parts), re.DOTALL)


# --- Judges on stand-ins --------------------------------------------------------------

J = TypeVar("J", bound=BaseJudge)


def stand_in_judge(
    judge: J,
    chat: Callable[[], BaseChatModel],
    decisions: Callable[[], BaseDecisionModel],
) -> J:
    """A copy of `judge` (its stages too) on stand-ins, keeping nothing of the run's.

    Every chat model field gets `chat()` (one each: a model each at the provider),
    every decision model `decisions()`; a verdict cache becomes a fresh in-memory one
    (repeated pairs cost nothing, as in the run) and the verdict log none, so a dry
    run writes nothing of the run's.
    """

    def swap(value: object) -> object:
        if isinstance(value, BaseChatModel):
            return chat()
        if isinstance(value, BaseDecisionModel):
            return decisions()
        if isinstance(value, BaseStore):
            return InMemoryVerdictCache()
        if isinstance(value, BaseJudge):  # a cascade's stage
            return stand_in_judge(value, chat, decisions)
        return value

    fields = {name: swap(getattr(judge, name)) for name in type(judge).model_fields}
    if "verdict_log" in fields:
        fields["verdict_log"] = None
    return type(judge)(**fields)


T = TypeVar("T")


def run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end from sync code, inside a running loop or not.

    Dry runs take the async path (one thread, so the simulated prompt cache sees
    the calls in a reproducible order); a caller already in an event loop gets
    one of its own on a worker thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
