"""What the deterministic fakes share: call records, latency and injected faults.

`ScriptedFakeChatModel` is the base of the fake chat models. `FaultSchedule` makes
any of them fail by call number or for a while, `TransientFakeError` is the error a
rate-limited or overloaded provider raises, and `FakeClock` lets retries and
backoff run without waiting. With `report_usage` a fake reports its tokens as a
provider does, cached prompt prefixes included (`prompt_caching`).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field, PrivateAttr

from langchain_tag._text import digest
from langchain_tag.usage import PromptCaching, SimulatedPromptCache

Fault = BaseException | str | None
"""An exception to raise, a text to answer instead, or None for a normal answer."""


class FakeClock:
    """Time that passes only when someone sleeps; every sleep is recorded.

    Patch it over what the code under test reads, e.g.
    `monkeypatch.setattr(time, "sleep", clock.sleep)`, so retries and backoff take
    no real time and their waits can be asserted exactly.
    """

    def __init__(self, start: float = 0.0) -> None:
        """Start at `start` seconds, with no sleeps."""
        self.now = start
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def time(self) -> float:
        """The current fake time (for `time.time` and `time.monotonic` alike)."""
        return self.now

    monotonic = time

    def sleep(self, seconds: float) -> None:
        """Record the wait and advance the clock, at once."""
        with self._lock:
            self.sleeps.append(seconds)
            self.now += seconds


class TransientFakeError(Exception):
    """A provider error with an HTTP status, as rate limits and overloads carry."""

    def __init__(
        self,
        message: str = "rate limited",
        status_code: int = 429,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Create an error carrying `status_code`, and `headers` as SDK errors do.

        With `headers` (e.g. `{"retry-after": "5"}`) it has `response.headers`,
        where the OpenAI and Anthropic SDKs' errors keep the provider's.
        """
        super().__init__(message)
        self.status_code = status_code
        if headers is not None:
            self.response = SimpleNamespace(headers=dict(headers))


@dataclass(frozen=True)
class FaultSchedule:
    """When a scripted fake fails, by call number or by time, whatever the prompt.

    Calls are numbered 1, 2, ... across all fault keys, in arrival order. A call
    fails with `fault` when its number is in `calls` or a multiple of `every`, or
    during an outage: from call `start` on, until call `stop` or for `duration`
    seconds after call `start` arrived (both None: for good). Durations are read on
    `clock`; tests pass a fake clock that their patched `sleep` advances, so
    backoff is checked without waiting.

    Example:
        ```python
        # Calls 5, 6 and 7 hit a 503; the provider is back from call 8.
        FaultSchedule(TransientFakeError("overloaded", 503), start=5, stop=8)
        # From call 5 the provider is down for 10 seconds.
        FaultSchedule(TransientFakeError("overloaded", 503), start=5, duration=10)
        ```
    """

    fault: BaseException | str
    """The error raised, or the text answered instead of a normal answer."""
    calls: frozenset[int] = frozenset()
    every: int = 0
    start: int | None = None
    stop: int | None = None
    duration: float | None = None
    clock: Callable[[], float] = time.monotonic

    def hits(self, number: int, outage_age: float | None) -> bool:
        """Whether call `number` fails; `outage_age`: seconds since call `start`."""
        in_outage = (
            outage_age is not None
            and (self.stop is None or number < self.stop)
            and (self.duration is None or outage_age < self.duration)
        )
        return (
            number in self.calls
            or (self.every > 0 and number % self.every == 0)
            or in_outage
        )


class ScriptedFakeChatModel(BaseChatModel):
    """What the deterministic fakes share: latency, fault injection, call records.

    Subclasses answer a prompt in `_answer` and name the key its faults are listed
    under in `_fault_key`; `_llm_name` and `_identifying_fields` name the fake and
    the fields that tell its configurations apart. Safe under concurrency: counters
    are locked, and nothing else is shared between calls.
    """

    latency: float = 0.0
    """Seconds each call takes (sleeps; async calls do not block the loop)."""
    faults: Mapping[str, Sequence[Fault]] = Field(default_factory=dict)
    """Per fault key: what its 1st, 2nd, ... call does instead of answering."""
    schedule: Sequence[FaultSchedule] = ()
    """Faults by call number or time, across keys; the first that hits a call wins
    over `faults`."""
    call_log: Path | None = None
    """If set, one line per finished call (prompt digest, time, first prompt line)
    is appended and flushed to this file, so a test can count calls across a
    process that was killed."""
    report_usage: bool = False
    """Report `usage_metadata` and the model name as providers do: a token per 4
    characters (rounded up) of the prompt and of the answer."""
    prompt_caching: PromptCaching | None = None
    """With `report_usage`: also report `input_token_details.cache_read`, the
    prefix each prompt shares with an earlier one, as this provider model caches
    it (`SimulatedPromptCache`, one call at a time)."""

    _llm_name: ClassVar[str] = "scripted-fake"
    """The fake's `_llm_type`, e.g. `rule-aware-fake`."""
    _identifying_fields: ClassVar[tuple[str, ...]] = ()
    """The fields `_identifying_params` names (and so the model's cache identity)."""

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _in_flight: int = PrivateAttr(default=0)
    _peak: int = PrivateAttr(default=0)
    _prompts: list[str] = PrivateAttr(default_factory=list)
    _call_times: list[float] = PrivateAttr(default_factory=list)
    _calls_per_key: defaultdict[str, int] = PrivateAttr(
        default_factory=lambda: defaultdict(int)
    )
    _outage_began: dict[int, float] = PrivateAttr(default_factory=dict)
    _prompt_cache: SimulatedPromptCache | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        """Start the prompt cache: the provider's, shared by copies, kept by `reset`."""
        super().model_post_init(context)
        if self.prompt_caching is not None:
            self._prompt_cache = SimulatedPromptCache(self.prompt_caching, _tokens)

    @property
    def _llm_type(self) -> str:
        return self._llm_name

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._identifying_fields}

    @property
    def peak_in_flight(self) -> int:
        """The most calls that were ever running at once."""
        return self._peak

    @property
    def prompts(self) -> list[str]:
        """Every prompt received (all messages' text joined), in arrival order."""
        with self._lock:
            return list(self._prompts)

    @property
    def calls(self) -> int:
        """Number of calls received."""
        return len(self.prompts)

    @property
    def call_times(self) -> list[float]:
        """When each call reached the model (`time.monotonic()`), in arrival order.

        After the model's `rate_limiter`, if it has one: the times show the pace
        the provider would see.
        """
        with self._lock:
            return list(self._call_times)

    def reset(self) -> None:
        """Forget recorded prompts, counters and the fault positions."""
        with self._lock:
            self._prompts.clear()
            self._call_times.clear()
            self._calls_per_key.clear()
            self._outage_began.clear()
            self._peak = 0

    def _fault_key(self, prompt: str) -> str:
        raise NotImplementedError

    def _answer(self, prompt: str) -> AIMessage:
        raise NotImplementedError

    def _reply(self, messages: Sequence[BaseMessage], prompt: str) -> AIMessage:
        """The answer to a call; a fake that reads the messages' roles overrides it."""
        return self._answer(prompt)

    def _enter(self, messages: Sequence[BaseMessage]) -> tuple[str, Fault]:
        prompt = "\n".join(str(m.content) for m in messages)
        key = self._fault_key(prompt)
        with self._lock:
            self._prompts.append(prompt)
            self._call_times.append(time.monotonic())
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
            position = self._calls_per_key[key]
            self._calls_per_key[key] += 1
            scheduled = self._scheduled(len(self._prompts))
        if scheduled is not None:
            return prompt, scheduled
        planned = self.faults.get(key, ())
        return prompt, planned[position] if position < len(planned) else None

    def _scheduled(self, number: int) -> Fault:
        """The fault `schedule` plans for call `number` (the lock is held)."""
        for index, planned in enumerate(self.schedule):
            age = None
            if planned.start is not None and number >= planned.start:
                now = planned.clock()
                age = now - self._outage_began.setdefault(index, now)
            if planned.hits(number, age):
                return planned.fault
        return None

    def _respond(
        self, messages: Sequence[BaseMessage], prompt: str, fault: Fault
    ) -> ChatResult:
        if isinstance(fault, BaseException):
            raise fault
        message = (
            AIMessage(fault)
            if isinstance(fault, str)
            else self._reply(messages, prompt)
        )
        if self.report_usage:
            message = self._metered(message, prompt)
        if self.call_log is not None:
            first_line = prompt.splitlines()[0][:60]
            with self._lock, self.call_log.open("a", encoding="utf-8") as log:
                log.write(f"{digest(prompt)[:16]}\t{time.time():.6f}\t{first_line}\n")
                log.flush()
                os.fsync(log.fileno())
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _metered(self, message: AIMessage, prompt: str) -> AIMessage:
        """`message` with the usage a provider would report for `prompt`."""
        input_tokens, output_tokens = _tokens(prompt), _tokens(message.text)
        usage: dict[str, Any] = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        if self._prompt_cache is not None:
            with self._lock:
                cached = self._prompt_cache.send(prompt)
            usage["input_token_details"] = {"cache_read": min(cached, input_tokens)}
        metadata = {**message.response_metadata, "model_name": self._llm_name}
        return message.model_copy(
            update={"usage_metadata": usage, "response_metadata": metadata}
        )

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _during_call(self) -> None:
        """What a call does while in flight: wait `latency` (a test may gate it)."""
        if self.latency:
            time.sleep(self.latency)

    async def _aduring_call(self) -> None:
        """Async `_during_call`: the loop is not blocked."""
        if self.latency:
            await asyncio.sleep(self.latency)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt, fault = self._enter(messages)
        try:
            self._during_call()
            return self._respond(messages, prompt, fault)
        finally:
            self._leave()

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt, fault = self._enter(messages)
        try:
            await self._aduring_call()
            return self._respond(messages, prompt, fault)
        finally:
            self._leave()


def _tokens(text: str) -> int:
    """A fake provider's token count: 4 characters a token, rounded up."""
    return math.ceil(len(text) / 4)
