"""Where the real data sets are: the shared data directory.

The tests and benchmarks that need real documents (PEP 8, HumanEval, RuleArena-NBA,
ObliQA) read them from a shared data directory outside the package. The data is
never bundled with `langchain_tag`: it has its own licences and sizes, and the
package works without it. Code that needs it finds it with `shared_data_dir` and
skips or stops with a clear message when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "TAG_DATA_DIR"
"""The environment variable that names the shared data directory."""


def shared_data_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """Find the shared data directory holding the real data sets.

    The directory holds one folder per data set (e.g. `pep8/`, `humaneval/`,
    `rulearena_nba/`, `obliqa_sample/`); the data is never bundled with the package.
    It is looked up in this order, and the first rule that applies decides:

    1. `explicit`, if given (e.g. a `--data-dir` option);
    2. the directory named by `$TAG_DATA_DIR`, if that variable is set and not empty;
    3. `../shared/data` beside the working directory, else beside the repository
       this module is in (for an editable install from a checkout).

    Args:
        explicit: A directory chosen by the caller; when given, nothing else is
            tried.

    Returns:
        The directory, or None if the one chosen is not an existing directory (in
        step 3: if neither candidate is).
    """
    configured = os.environ.get(DATA_DIR_ENV)
    if explicit is not None:
        candidates: tuple[Path, ...] = (Path(explicit),)
    elif configured:
        candidates = (Path(configured),)
    else:
        candidates = (
            Path.cwd().parent / "shared" / "data",
            Path(__file__).resolve().parents[3] / "shared" / "data",
        )
    return next((path for path in candidates if path.is_dir()), None)
