"""The batch lane: judgments and executions through a provider's batch API.

Offline jobs (a corpus judged against a rulebook, an evaluation) need no answer
within seconds, and OpenAI's Batch API and Anthropic's Message Batches run the
same calls within 24 hours at half the price. This package sends the judge's and
the executor's calls that way:

- `judge_in_batch(judge, pairs, ...)`: every (input, rule) pair not in the judge's
  cache becomes one request, byte for byte the call the judge makes online (on
  Anthropic, its text call: see `_anthropic`), and the answers go into the
  judge's verdict cache and verdict log. A later `MatchEngine` or `TAGRetriever`
  run over the same inputs finds every verdict cached and makes no call.
- `execute_in_batch(executor, items, store=...)`: the executor's calls, the
  outputs parsed by its template, the answers kept in `store`.
- `BatchSettings`: file limits (50,000 requests, 200 MB), polling, `max_wait`;
  `BatchReport`: what a call sent, read, did online, and the tokens it used;
  `cancel_batches`: cancel what is running.

What is sent is only what is not answered yet; a batch is recorded as soon as it
exists, in tables beside the verdict cache (in its SQLite file or PostgreSQL
database), so a killed run, or one that returned at `max_wait`, is resumed by
calling again. A line that failed, expired, was cancelled or gave an
unreadable answer is done online, through the judge's retries and error policy:
never a silent NO. A batch the API refuses at validation raises
`BatchFailedError`.

Data flows down: this package uses `matching`, `execution`, `cache` and `models`,
never the engine. It needs `langchain_openai.ChatOpenAI` models (OpenAI's Files
and Batch APIs) or `langchain_anthropic.ChatAnthropic` ones (Message Batches, the
`anthropic` extra); `BatchLaneError` otherwise. The two providers share everything
but the wire protocol (`_providers`: `BatchProvider`, `ModelCall`).
"""

from langchain_tag.batch._jobs import BatchFile, BatchProgress, BatchSettings
from langchain_tag.batch.lane import (
    BatchExecution,
    BatchFailedError,
    BatchReport,
    cancel_batches,
    execute_in_batch,
    judge_in_batch,
)
from langchain_tag.errors import BatchLaneError

__all__ = [
    "BatchExecution",
    "BatchFailedError",
    "BatchFile",
    "BatchLaneError",
    "BatchProgress",
    "BatchReport",
    "BatchSettings",
    "cancel_batches",
    "execute_in_batch",
    "judge_in_batch",
]
