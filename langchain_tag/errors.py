"""Every exception and warning langchain-tag raises: `except TAGError` catches them.

Each error keeps the builtin base it always had (`RulebookError` is still a
`ValueError`, `JudgmentError` a `RuntimeError`), so existing handlers keep working.
The modules that raise them import them from here; this module imports nothing of
the package, so any module may.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "BatchFailedError",
    "BatchLaneError",
    "BulkInputError",
    "BulkJobMismatchError",
    "BulkOutputBusyError",
    "BulkPendingError",
    "BulkRunError",
    "CheckpointError",
    "CommandError",
    "DocumentError",
    "FailureKind",
    "JudgmentError",
    "LocalModelStoppedError",
    "LocalServerError",
    "MissingVerdictLogError",
    "ModelNotConfiguredError",
    "RayMissingError",
    "ReviewNeedsCheckpointerError",
    "RuleSchemaError",
    "RulebookError",
    "RulebookPathError",
    "StoreLocationError",
    "TAGError",
    "TextEncodingError",
    "UnreliableMatchWarning",
    "UnsupportedQuestionError",
    "VerdictLogWarning",
    "advice",
    "describe_error",
]


class TAGError(Exception):
    """Base class of the exceptions defined by langchain-tag."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by state: an input's failure travels back from a Ray worker.

        The default would call the class with the message alone, which most of
        these `__init__`s do not take.
        """
        return (_restored, (type(self), self.args, self.__dict__))


def _restored(
    kind: type[TAGError], args: tuple[Any, ...], state: dict[str, Any]
) -> TAGError:
    error = kind.__new__(kind, *args)
    error.args = args
    error.__dict__.update(state)
    return error


# --- The errors and warnings, by name ---------------------------------------------
# `Abandoned`, `GaveUp` (the judges' fan-out) and `Terminated` (the command line)
# never reach a caller, so they are not in `__all__`.


class Abandoned(TAGError):  # noqa: N818 - never raised to callers
    """A judgment given up because another one of its fan-out failed for good."""


class BulkInputError(TAGError, ValueError):
    """An input file a bulk job cannot read; the message names file and line."""


class BulkJobMismatchError(TAGError, ValueError):
    """The output file was written by a job with other settings."""


class BulkOutputBusyError(BulkJobMismatchError):
    """Another run is writing the same output."""


class BulkPendingError(TAGError, RuntimeError):
    """Batches are still running at `max_wait`: run again later to collect them."""

    def __init__(self, batch_ids: Sequence[str], pending: int) -> None:
        """Name the running batches."""
        self.batch_ids = list(batch_ids)
        super().__init__(
            f"{pending} request(s) are still in running batches "
            f"({', '.join(self.batch_ids)}); nothing is lost: run the same command "
            "again later to collect them (batches finish within 24 hours)."
        )


class BulkRunError(TAGError, RuntimeError):
    """An input failed for good: the job stopped, every finished input is kept.

    Attributes:
        input_id: The input that failed.
        cause: Its error (a `JudgmentError`, the executor's error, ...).
    """

    def __init__(self, input_id: str | int, cause: BaseException, done: int) -> None:
        """Say which input failed, what was kept and how to resume."""
        self.input_id = input_id
        self.cause = cause
        # A JudgmentError's own message advises in the Python API's options; the
        # caller advises in its own (`tag run`'s), so only the cause is said here.
        said = (
            cause.cause if isinstance(cause, JudgmentError) else describe_error(cause)
        )
        super().__init__(
            f"input {input_id!r} failed ({said}); the job stopped with {done} "
            "input(s) written. Its verdicts so far are cached: run the same command "
            "again to resume (inputs already written are skipped)."
        )


class CheckpointError(TAGError, ValueError):
    """The checkpoint path cannot hold a checkpoint (a directory, not writable)."""


class CommandError(TAGError):
    """A problem the user can fix; printed without a traceback."""


class DocumentError(TAGError, ValueError):
    """A file that cannot be loaded as a document: `what`, `problem`, `fix`.

    The message is `"{what}: {problem} {fix}"`: the file, what is wrong with it and
    what to do. Raised for files that are empty or have no text (a scanned PDF),
    encrypted, damaged or not what their suffix says, and when the library that
    reads their format is not installed (the fix names the `documents` extra).
    """

    def __init__(self, what: str, problem: str, fix: str = "") -> None:
        """Build the error from the file's name, what is wrong and what to do."""
        self.what = what
        self.problem = problem
        self.fix = fix
        super().__init__(f"{what}: {problem} {fix}".rstrip())


class GaveUp(TAGError):  # noqa: N818 - a state, read by the judges
    """A call failed for good: `error`, after `attempts` attempt(s)."""

    def __init__(self, error: Exception, attempts: int) -> None:
        """Record the call's last error and how many attempts it made."""
        super().__init__(str(error))
        self.error = error
        self.attempts = attempts


class JudgmentError(TAGError, RuntimeError):
    """A judgment failed after its retries under `on_error="raise"`.

    `kind` tells why (`FailureKind`), which decides what helps: `transient` (a
    rate limit, a timeout) and `capacity` (the provider short of capacity, as the
    flex tier can be) are worth retrying later, so an outer retry, such as a
    LangGraph node's, may try again; `unreadable` (the judge's answer gave no
    verdict) comes again at temperature 0, so only another model helps;
    `permanent` fails the same way again. The message advises accordingly.
    """

    def __init__(
        self,
        rule_id: str,
        error: str,
        *,
        kind: FailureKind = "permanent",
        reason: str | None = None,
    ) -> None:
        """Record which rule's judgment failed, why, and the kind of failure.

        `reason`: what a transient failure was (`failure_reason`), if known.
        """
        self.rule_id = rule_id
        self.error = error
        self.kind: FailureKind = kind
        self.reason = reason
        what = advice(
            kind,
            stronger_model="a stronger model",
            retry_hint="retry later",
            on_error="set on_error='not_applicable'",
            reason=reason,
        )
        cause = self.cause
        super().__init__(
            f"{cause[:1].upper()}{cause[1:]}. Nothing was assumed about it; {what}."
        )

    @property
    def cause(self) -> str:
        """Which rule's judgment failed and why, without the advice.

        What a command shows in place of the message, whose advice names the
        Python API's options (`on_error=`).
        """
        return f"judging rule {self.rule_id!r} failed: {self.error}"

    @property
    def transient(self) -> bool:
        """Whether the failure is worth retrying later (`transient`, `capacity`).

        `models.CallRetry.is_transient` reads it, so that an outer retry may try a
        transient failure again.
        """
        return self.kind in ("transient", "capacity")

    @property
    def unreadable(self) -> bool:
        """Whether the judge answered but no verdict could be read from the answer."""
        return self.kind == "unreadable"


class LocalModelStoppedError(TAGError, RuntimeError):
    """The in-process model was closed while a call was waiting or generating."""


class LocalServerError(TAGError, RuntimeError):
    """The local model server did not start or stopped answering."""

    def __init__(self, message: str, *, returncode: int | None = None) -> None:
        """Say what happened; `returncode` is the server's exit status, if it died.

        A negative `returncode` is the signal that killed it (-4: SIGILL).
        """
        super().__init__(message)
        self.returncode = returncode


class RayMissingError(TAGError, ImportError):
    """A bulk run on Ray (`--engine ray`, backend="ray") without Ray installed."""


class ModelNotConfiguredError(TAGError, RuntimeError):
    """No chat model was passed and the environment configures none."""


class ReviewNeedsCheckpointerError(TAGError, ValueError):
    """A review is asked for on a run without a checkpointer to pause with.

    Raised by `TAGMiddleware(review_band=...)` and by the query graph with
    `QueryContext(review=True)`, before any model call.
    """


class RuleSchemaError(TAGError, ValueError):
    """A rule schema is invalid: the message names the schema, the field and the fix."""


class RulebookError(TAGError, ValueError):
    """A rulebook file is missing, unreadable or invalid.

    The message names the file, the offending field when there is one, and what to
    do about it.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, problem: str, fix: str
    ) -> None:
        """Build the error from where, what and how to fix it.

        Args:
            path: The rulebook file, or None for an in-memory rulebook.
            problem: What is wrong, naming the field when there is one.
            fix: What the user should do about it.
        """
        self.path = None if path is None else Path(path)
        self.problem = problem
        self.fix = fix
        where = f"Rulebook {str(self.path)!r}" if self.path else "Rulebook"
        super().__init__(f"{where}: {problem} {fix}")


class RulebookPathError(TAGError, PermissionError):
    """A rulebook path in a run's input that the query graph does not open.

    One message whatever the path is (missing, outside the allowed folder, not a
    regular file, too large), so that a client learns nothing of the server's files.
    """

    def __init__(self, *, folder_env: str, max_bytes: int) -> None:
        """The one message: the variable naming the allowed folder, the size limit."""
        super().__init__(
            "The run's input names its rulebook by a file path, and this graph opens "
            "no such path: pass the rulebook as JSON (Rulebook.model_dump(mode="
            f"'json')), or name a file inside the folder its operator set in "
            f"${folder_env} (a file of at most {max_bytes >> 20} MiB)."
        )


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is: it ends as an interrupt does.

    A `KeyboardInterrupt`, so that everything that keeps outputs whole on Ctrl-C
    (bulk runs, checkpoints, local models) does the same on a `kill`.
    """


class TextEncodingError(TAGError, ValueError):
    """A user's text is not UTF-8 (or marked UTF-16): `what`, `problem`, `fix`.

    The message is `"{what}: {problem} {fix}"`; callers with their own error type
    (a rulebook's, a data set's) reuse `problem` and `fix`, so every reader says the
    same thing.
    """

    def __init__(self, what: str, problem: str, fix: str) -> None:
        """Build the error from the file's name, what is wrong and what to do."""
        self.what = what
        self.problem = problem
        self.fix = fix
        super().__init__(f"{what}: {problem} {fix}")


class UnreliableMatchWarning(UserWarning):
    """Some judgments failed and were treated as not applicable by policy.

    Besides its message it says which: `rule_ids`, the rules whose judgments
    failed (every one, in order, a rule once per failed judgment), of `total`
    judgments made. A warning raised with a message only names none.
    """

    def __init__(
        self, message: str, *, rule_ids: Sequence[str] = (), total: int = 0
    ) -> None:
        """The warning's `message`, and the failed judgments' rules of `total`."""
        super().__init__(message)
        self.rule_ids: tuple[str, ...] = tuple(rule_ids)
        self.total = total


class UnsupportedQuestionError(TAGError, ValueError):
    """A question type the local decision model does not answer (only `Noul`)."""


# --- What the errors say -------------------------------------------------------------

FailureKind = Literal["transient", "capacity", "unreadable", "permanent"]
"""Why a judgment failed, which decides what helps: `transient` (a rate limit, a
timeout: try again later), `capacity` (the provider was short of capacity, as
OpenAI's flex tier answers with a 429 "resource unavailable": try again later, or
on the standard tier), `unreadable` (the judge answered, but no verdict could be
read from the answer: at temperature 0 asking again gives the same answer, so only
another model helps), `permanent` (anything else: asking again fails the same way)."""


def advice(
    kind: FailureKind,
    *,
    stronger_model: str,
    retry_hint: str,
    on_error: str | None = None,
    reason: str | None = None,
) -> str:
    """What to do about a failure of `kind`, in the caller's own options.

    The one wording of the advice: `JudgmentError`'s message (the Python API),
    `tag run` and `tag eval` each pass their own names for the options.

    Args:
        kind: The failure's kind (`matching.verdicts.failure_kind`).
        stronger_model: What to use against an unreadable answer, after "use"
            (e.g. "a stronger --model").
        retry_hint: What to do against a transient failure (e.g. "retry later").
        on_error: How to go on with such rules flagged as unjudged (e.g. "set
            on_error='not_applicable'"); None when the caller has no such option.
        reason: What the transient failure was (`failure_reason`), if known.
    """
    if kind == "transient":
        said = (
            f"the failure is transient ({reason or 'a rate limit or a timeout'}): "
            f"{retry_hint}"
        )
    elif kind == "capacity":
        said = (
            "the provider was short of capacity (a 429 'resource unavailable', as "
            "OpenAI's flex tier answers; not a rate limit, and not billed): "
            f"{retry_hint}, or use the standard tier"
        )
    elif kind == "unreadable":
        said = (
            "the answer could not be read, and at temperature 0 asking again gives "
            f"the same answer: use {stronger_model}"
        )
    else:
        said = (
            "the error is not transient, so asking again fails the same way: fix "
            "its cause"
        )
    if on_error is not None:
        said += f", or {on_error} to go on with such rules flagged as unjudged"
    return said


def describe_error(error: BaseException) -> str:
    """`Type: message`, or the type alone when the message is empty."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class StoreLocationError(TAGError, ValueError):
    """A store cannot be opened where it was asked for.

    A path that is a directory or cannot be written, a file that is not a database,
    a server that cannot be reached, or (read-only) a table that is not there.
    """


class MissingVerdictLogError(TAGError, LookupError):
    """A log opened read-only is not there: no such file, or not the log's tables."""


class VerdictLogWarning(UserWarning):
    """The verdict log could not be written; its records are kept in memory."""


class BatchFailedError(TAGError, RuntimeError):
    """A batch failed the provider's validation: none of its requests was run.

    The other batches' answers were stored first (a later call reads them);
    `errors` holds the provider's reasons, `report` what this call did (a
    `langchain_tag.batch.BatchReport`).
    """

    def __init__(self, errors: Sequence[str], report: Any) -> None:
        """Name the reasons the provider gave."""
        self.errors = list(errors)
        self.report = report
        shown = "; ".join(self.errors[:5]) + (" ..." if len(self.errors) > 5 else "")  # noqa: PLR2004
        super().__init__(
            f"The Batch API refused {len(report.failed_batch_ids)} batch(es) "
            f"({', '.join(report.failed_batch_ids)}): {shown}. Nothing in them was "
            "run or paid for; fix the cause (model name, endpoint, limits) and run "
            "again: answers already in are kept."
        )


class BatchLaneError(TAGError, TypeError):
    """What was given cannot be sent through OpenAI's Batch API."""
