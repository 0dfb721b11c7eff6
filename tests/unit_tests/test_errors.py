"""Every exception langchain-tag defines is a `TAGError`, and keeps its builtin base."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import langchain_tag
from langchain_tag import TAGError, cli
from langchain_tag.errors import (
    CommandError,
    FailureKind,
    JudgmentError,
    ModelNotConfiguredError,
    RulebookError,
    advice,
)
from langchain_tag.matching.verdicts import failure_kind
from langchain_tag.models import CallRetry
from langchain_tag.testing import RuleAwareFakeChatModel, TransientFakeError

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
            if issubclass(cls, (Warning, KeyboardInterrupt)):
                # Warnings are not raised; an interrupt (SIGTERM's) is no error,
                # and must not be caught by `except Exception` (or TAGError).
                continue
            exceptions.append(cls)
    assert len(exceptions) >= 10  # the walk found them
    assert [c.__qualname__ for c in exceptions if not issubclass(c, TAGError)] == []


def _subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def test_every_exception_and_warning_is_defined_in_the_errors_module() -> None:
    # One place to read what the package raises; any module may import it.
    for module_name, _ in _defined_classes():
        importlib.import_module(module_name)
    defined = {
        f"{cls.__module__}.{cls.__qualname__}"
        for base in (TAGError, Warning, KeyboardInterrupt)
        for cls in _subclasses(base)
        if cls.__module__.partition(".")[0] == "langchain_tag"
        and not cls.__module__.startswith("langchain_tag.testing")
    }
    assert "langchain_tag.errors.JudgmentError" in defined  # the walk found them
    elsewhere = sorted(
        name for name in defined if not name.startswith("langchain_tag.errors.")
    )
    assert elsewhere == []


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (JudgmentError, RuntimeError),
        (RulebookError, ValueError),
        (ModelNotConfiguredError, RuntimeError),
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


# --- Advice that fits the failure (issue 21) ----------------------------------------

UNREADABLE = "unparseable judge output 'Perhaps.'"


@pytest.mark.parametrize(
    ("error", "kind", "says", "never"),
    [
        # Before: every kind said "retry later", though at temperature 0 an
        # unreadable answer comes again.
        (UNREADABLE, "unreadable", "temperature 0", "retry later"),
        (
            "TransientFakeError: rate limited",
            "transient",
            "retry later",
            "temperature 0",
        ),
        ("ValueError: bad request", "permanent", "not transient", "retry later"),
        # A shortage of capacity (the flex tier) is no rate limit to slow down for.
        (
            "RateLimitError: Error code: 429 - Resource unavailable",
            "capacity",
            "short of capacity",
            "a rate limit or a timeout",
        ),
    ],
)
def test_judgment_error_advice_fits_the_failure(
    error: str, kind: FailureKind, says: str, never: str
) -> None:
    failed = JudgmentError("R-1", error, kind=kind)
    message = str(failed)
    assert says in message
    assert never not in message
    assert "temperature 0" not in message or "stronger model" in message
    # The Python API has the option: the message may name it.
    assert "on_error='not_applicable'" in message
    assert failed.kind == kind
    # An outer retry may try a transient failure, or one for capacity, again.
    assert (failed.transient, failed.unreadable) == (
        kind in ("transient", "capacity"),
        kind == "unreadable",
    )
    assert message.startswith(f"Judging rule 'R-1' failed: {error}. ")
    assert failed.cause == f"judging rule 'R-1' failed: {error}"


def test_the_kind_is_the_judges_word_not_read_from_the_error() -> None:
    # Before: `unreadable` was inferred from how the error text began.
    failed = JudgmentError("R-1", UNREADABLE)
    assert failed.kind == "permanent"
    assert not failed.unreadable
    assert "temperature 0" not in str(failed)


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("transient", "(a rate limit or a timeout): wait"),
        ("unreadable", "at temperature 0 asking again gives the same answer: use B"),
        ("permanent", "asking again fails the same way: fix its cause"),
        ("capacity", "not a rate limit, and not billed): wait, or use the standard"),
    ],
)
def test_advice_is_one_wording_in_the_callers_options(
    kind: FailureKind, says: str
) -> None:
    # The Python API and both commands word it here, with their own options.
    told = advice(kind, stronger_model="B", retry_hint="wait", on_error="--skip")
    assert says in told
    assert told.endswith(", or --skip to go on with such rules flagged as unjudged")
    alone = advice(kind, stronger_model="B", retry_hint="wait")
    assert alone == told.removesuffix(
        ", or --skip to go on with such rules flagged as unjudged"
    )


def test_failure_kind_of_other_errors() -> None:
    assert failure_kind(JudgmentError("R-1", "x", kind="unreadable")) == "unreadable"
    assert failure_kind(TransientFakeError("HTTP 429", 429)) == "transient"
    assert failure_kind(ValueError("bad request")) == "permanent"
    flex = TransientFakeError("Error code: 429 - Resource unavailable", 429)
    assert failure_kind(flex) == "capacity"
    # The policy that gave up says what else it retried.
    assert failure_kind(KeyError("x")) == "permanent"
    assert failure_kind(KeyError("x"), CallRetry(retry_on=(KeyError,))) == "transient"


RULEBOOK = str(Path(__file__).parent.parent / "fixtures" / "pep8_rulebook.json")
FIRST_RULE = "PEP8-IMPORT-SEPARATE"


@pytest.mark.parametrize(
    ("fault", "says", "never"),
    [
        # Before: the same line said "retry later" (JudgmentError's) and "at
        # temperature 0 asking again gives the same answer" (the command's).
        ("Perhaps.", ("temperature 0", "--model", "--on-error"), ("retry later",)),
        (
            TransientFakeError(headers={"retry-after": "0"}),
            ("try again later",),
            ("temperature 0", "cannot be read"),
        ),
        # Before: "its answer cannot be read" for an error that has no answer.
        (ValueError("bad request"), ("not transient",), ("cannot be read",)),
    ],
)
def test_tag_run_advice_fits_the_failure_and_names_its_options(
    fault: Exception | str,
    says: tuple[str, ...],
    never: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(
        "langchain_tag.models.default_chat_model",
        lambda **_: RuleAwareFakeChatModel(faults={FIRST_RULE: [fault] * 4}),
    )
    assert cli.main(["run", RULEBOOK, "import os, sys\n"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    [line] = lines
    assert line.startswith("tag run: error: no answer:")
    assert FIRST_RULE in line
    assert all(text in line for text in says), line
    assert not any(text in line for text in never), line
    # The Python API's spelling of the option is not the command's.
    assert "on_error=" not in line
