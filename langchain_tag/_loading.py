"""Loading Hugging Face models without progress bars in the caller's output."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_model_loading() -> Iterator[None]:
    """Silence loading progress bars for the duration.

    `transformers` draws its own (which its setting turns off) and the GGUF reader
    draws a plain tqdm bar on stderr, which nothing else turns off once imported, so
    stderr is held back; if loading fails, what it said is written out after all.
    """
    from transformers.utils import logging as transformers_logging  # noqa: PLC0415

    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise
    finally:
        if bars:
            transformers_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
