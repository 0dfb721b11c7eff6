"""Loading Hugging Face models without progress bars in the caller's output."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator

_PROGRESS = re.compile(r"\d+%\|")
"""A tqdm bar's line: "Converting ...:  42%|████      | 114/272 [...]"."""


@contextlib.contextmanager
def quiet_model_loading() -> Iterator[None]:
    """Silence loading progress bars for the duration.

    `transformers` draws its own (which its setting turns off) and the GGUF reader
    draws a plain tqdm bar on stderr, which nothing else turns off once imported, so
    stderr is held back meanwhile and written out without the bars' lines: a warning
    (from this or another thread) still shows, after the load.
    """
    from transformers.utils import logging as transformers_logging  # noqa: PLC0415

    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        kept = [
            line
            for line in re.split(r"[\r\n]+", held.getvalue())
            if line.strip() and not _PROGRESS.search(line)
        ]
        if kept:
            sys.stderr.write("\n".join(kept) + "\n")
        if bars:
            transformers_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
