"""Deterministic test doubles for testing langchain-tag code; none is a language model.

- `scripted`: `ScriptedFakeChatModel`, the fakes' base (latency, call records,
  faults), with `FaultSchedule`, `TransientFakeError` and `FakeClock`.
- `judges`: fake judges answering from the prompt text (`RuleAwareFakeChatModel`,
  `NoisyJudgeFakeChatModel`, `InjectionObeyingFakeChatModel`), their ground truth
  `condition_holds` and `trigger_rulebook`.
- `extraction`: `ExtractionFakeChatModel`, and `JudgeAndExtractorFakeChatModel` for
  every role at once.
- `agents`: `ToolLoopFakeChatModel`, an agent's model that calls a tool, then answers.
- `embeddings`: `HashingFakeEmbeddings`.
- `npov`: `NPOVFakeChatModel`, judge, NPOV executor and VFR judge from known pairs.
- `decisions`: `RuleAwareFakeDecisionModel`, a fake decision model, and
  `FakeDecisionsServer`, OpenAI's Decisions API (and chat completions) on loopback.
- `stores`: `CountingStore`, which counts a store's round trips.
- `server`: `FakeOpenAIServer`, an OpenAI-compatible HTTP endpoint on loopback.
- `batch_server`: `FakeBatchServer`, OpenAI's Files and Batch APIs (and chat
  completions) on loopback, batches run by `BatchScript`.
- `anthropic_batch_server`: `FakeAnthropicBatchServer`, Anthropic's Messages and
  Message Batches APIs on loopback, batches run by `BatchScript`.
- `notebook`: `notebook_model()`, the notebooks' real-or-fake model.
"""

from langchain_tag.testing.agents import ToolLoopFakeChatModel
from langchain_tag.testing.anthropic_batch_server import FakeAnthropicBatchServer
from langchain_tag.testing.batch_server import BatchScript, FakeBatchServer
from langchain_tag.testing.embeddings import HashingFakeEmbeddings
from langchain_tag.testing.extraction import (
    ExtractionFakeChatModel,
    JudgeAndExtractorFakeChatModel,
)
from langchain_tag.testing.judges import (
    InjectionObeyingFakeChatModel,
    NoisyJudgeFakeChatModel,
    RuleAwareFakeChatModel,
    condition_holds,
    trigger_rulebook,
)
from langchain_tag.testing.notebook import OFFLINE_NOTE, NotebookModel, notebook_model
from langchain_tag.testing.npov import NPOVFakeChatModel
from langchain_tag.testing.scripted import (
    FakeClock,
    Fault,
    FaultSchedule,
    ScriptedFakeChatModel,
    TransientFakeError,
)
from langchain_tag.testing.server import FakeOpenAIServer, Refusal
from langchain_tag.testing.stores import CountingStore

__all__ = [
    "OFFLINE_NOTE",
    "BatchScript",
    "CountingStore",
    "ExtractionFakeChatModel",
    "FakeAnthropicBatchServer",
    "FakeBatchServer",
    "FakeClock",
    "FakeOpenAIServer",
    "Fault",
    "FaultSchedule",
    "HashingFakeEmbeddings",
    "InjectionObeyingFakeChatModel",
    "JudgeAndExtractorFakeChatModel",
    "NPOVFakeChatModel",
    "NoisyJudgeFakeChatModel",
    "NotebookModel",
    "Refusal",
    "RuleAwareFakeChatModel",
    "ScriptedFakeChatModel",
    "ToolLoopFakeChatModel",
    "TransientFakeError",
    "condition_holds",
    "notebook_model",
    "trigger_rulebook",
]
