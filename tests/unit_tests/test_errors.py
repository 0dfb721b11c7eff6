"""Every exception langchain-tag defines is a `TAGError`, and keeps its builtin base."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import langchain_tag
from langchain_tag import TAGError
from langchain_tag.cli.errors import CommandError
from langchain_tag.evaluation.datasets import DataNotFoundError, DatasetError
from langchain_tag.matching import JudgmentError
from langchain_tag.models import ModelNotConfiguredError
from langchain_tag.rules import RulebookError

PACKAGE = Path(langchain_tag.__file__).parent


def _defined_classes() -> list[tuple[str, str]]:
    """(module, class name) of every class defined at a module's top level."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(relative.parts)
        if "testing" in parts or parts[-1] == "__main__":
            continue  # the test doubles raise what the fakes they stand for raise
        if parts[-1] == "__init__":
            parts.pop()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [
            (".".join(parts), node.name)
            for node in tree.body
            if isinstance(node, ast.ClassDef)
        ]
    return found


def test_every_exception_of_the_package_is_a_tag_error() -> None:
    exceptions = []
    for module_name, class_name in _defined_classes():
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            if issubclass(cls, Warning):
                continue  # warnings are not raised
            exceptions.append(cls)
    assert len(exceptions) >= 10  # the walk found them
    assert [c.__qualname__ for c in exceptions if not issubclass(c, TAGError)] == []


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (JudgmentError, RuntimeError),
        (RulebookError, ValueError),
        (ModelNotConfiguredError, RuntimeError),
        (DatasetError, ValueError),
        (DataNotFoundError, FileNotFoundError),
        (CommandError, Exception),
    ],
)
def test_errors_keep_their_builtin_bases(
    error: type[Exception], builtin: type[Exception]
) -> None:
    assert issubclass(error, TAGError)
    assert issubclass(error, builtin)


def test_one_except_catches_a_judgment_error() -> None:
    error = JudgmentError("R-1", "boom")
    with pytest.raises(TAGError, match="R-1"):
        raise error
