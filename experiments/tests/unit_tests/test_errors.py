"""Every exception the harness defines is a `TAGError`, and keeps its builtin base."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import langchain_tag_experiments
import pytest
from langchain_tag_experiments.evaluation.datasets import (
    DataNotFoundError,
    DatasetError,
)

from langchain_tag import TAGError

PACKAGE = Path(langchain_tag_experiments.__file__).parent


def test_every_exception_of_the_harness_is_a_tag_error() -> None:
    exceptions = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        module = importlib.import_module(".".join(parts))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            cls = (
                getattr(module, node.name, None)
                if isinstance(node, ast.ClassDef)
                else None
            )
            if isinstance(cls, type) and issubclass(cls, Exception):
                if issubclass(cls, Warning):  # warned, never raised
                    continue
                exceptions.append(cls)
    assert len(exceptions) >= 2  # the walk found them
    assert [c.__qualname__ for c in exceptions if not issubclass(c, TAGError)] == []


@pytest.mark.parametrize(
    ("error", "builtin"),
    [(DatasetError, ValueError), (DataNotFoundError, FileNotFoundError)],
)
def test_errors_keep_their_builtin_bases(
    error: type[Exception], builtin: type[Exception]
) -> None:
    assert issubclass(error, TAGError)
    assert issubclass(error, builtin)
