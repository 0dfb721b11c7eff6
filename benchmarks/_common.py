"""What the benchmark scripts share: common options, the data directory, JSON output.

The scripts run as `python benchmarks/bench_<name>.py`, so this directory is
`sys.path[0]` and they `import _common`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_tag_experiments.data import DATA_DIR_ENV, shared_data_dir

MISSING_DATA_STATUS = 2
"""The exit status of a script whose data is missing."""


def make_parser(
    doc: str | None,
    *,
    data: bool,
    repeats_default: int | None = 3,
    repeats_help: str = "timed runs",
) -> argparse.ArgumentParser:
    """A parser with `--data-dir` (if `data`), `--json` and `--repeats` (if wanted).

    Add the script's own options to it, then read the command line with
    `parse_arguments`, which checks the common ones.

    Args:
        doc: The script's docstring; its first line describes the script.
        data: Whether the script reads the shared data directory.
        repeats_default: The default of `--repeats`; None for no such option.
        repeats_help: What `--repeats` counts; the help adds that the best is
            reported, and the default.

    Returns:
        The parser.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    if data:
        parser.add_argument(
            "--data-dir",
            type=Path,
            metavar="DIR",
            help=f"the shared data directory (default: ${DATA_DIR_ENV}, else "
            "../shared/data beside the repository)",
        )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the figures as JSON"
    )
    if repeats_default is not None:
        parser.add_argument(
            "--repeats",
            type=int,
            default=repeats_default,
            help=f"{repeats_help}; the best is reported (default {repeats_default})",
        )
    return parser


def parse_arguments(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """Parse the command line and check the options `make_parser` added.

    Args:
        parser: The script's parser.
        argv: Arguments; `sys.argv[1:]` when None.

    Returns:
        The parsed options (argparse exits with status 2 on a bad one).
    """
    args = parser.parse_args(argv)
    if getattr(args, "repeats", 1) < 1:
        parser.error("--repeats must be at least 1")
    return args


def require_data_dir(option: Path | None, required: Sequence[Path]) -> Path:
    """The shared data directory, with every file in `required`; else exit 2.

    The directory is `--data-dir`, else `$TAG_DATA_DIR`, else `../shared/data`
    beside the repository (see `langchain_tag_experiments.data.shared_data_dir`).

    Args:
        option: The `--data-dir` value, if given.
        required: Files the script cannot run without, relative to the directory.

    Returns:
        The directory.

    Raises:
        SystemExit: With status 2, after a message on stderr naming what is
            missing, if the directory or one of the files is absent.
    """
    data_dir = shared_data_dir(option)
    if data_dir is None:
        where = option or os.environ.get(DATA_DIR_ENV) or "../shared/data"
        problem = f"no shared data directory at {where}"
    else:
        missing = [data_dir / rel for rel in required if not (data_dir / rel).is_file()]
        if not missing:
            return data_dir
        problem = f"{', '.join(map(str, missing))} not found"
    folders = " and ".join(sorted({f"{rel.parent}/" for rel in required}))
    print(
        f"error: {problem}. Pass --data-dir DIR or set {DATA_DIR_ENV} to the shared "
        f"data directory (the one holding {folders}).",
        file=sys.stderr,
    )
    raise SystemExit(MISSING_DATA_STATUS)


def write_json(path: Path, figures: dict[str, Any]) -> None:
    """Write the figures as indented JSON, creating the parent directory.

    Args:
        path: The `--json` value.
        figures: What to write; it must be JSON-serialisable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def print_targets(targets: dict[str, dict[str, Any]], digits: int = 3) -> None:
    """Print the "Targets" block: name, value, unit, goal, PASS or FAIL.

    Args:
        targets: Target name -> `value`, `unit`, `goal` and `pass`.
        digits: Decimals of the values.
    """
    width = max((len(name) for name in targets), default=0)
    print("Targets")
    for name, target in targets.items():
        print(
            f"  {name:<{width}} {target['value']:>{digits + 4}.{digits}f} "
            f"{target['unit']:<3} {target['goal']:<7} "
            f"{'PASS' if target['pass'] else 'FAIL'}"
        )
