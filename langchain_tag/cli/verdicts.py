"""`tag verdicts stats|export [LOG]`: what the verdict log holds; all of it as JSONL.

LOG is an SQLite file or a `postgresql://` URI (default
`.langchain-tag/verdicts.sqlite`). The log is opened read-only: a missing log, or
a database without its tables, is refused rather than created. The log is imported
when the command runs, so `tag --help` loads neither it nor the judge.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from langchain_tag.errors import CommandError, describe_error

if TYPE_CHECKING:
    from langchain_tag.learning.verdict_log import VerdictLog, VerdictLogStats

DEFAULT_LOG = Path(".langchain-tag") / "verdicts.sqlite"

_RULES_SHOWN = 5


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag verdicts` on the `tag` command's subparsers."""
    parser = commands.add_parser(
        "verdicts",
        help="show or export the verdict log (what the learned prefilter learns from)",
        description="The verdict log holds every judgment the judge made: input (or "
        "its hashed features), rule and content hash, verdict, model, prompt version "
        "and profile.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    stats = actions.add_parser("stats", help="counts: verdicts, inputs, rules, YES")
    export = actions.add_parser("export", help="every record as one JSON line")
    for sub in (stats, export):
        sub.add_argument(
            "log",
            nargs="?",
            default=str(DEFAULT_LOG),
            help=f"an SQLite file or a postgresql:// URI (default {DEFAULT_LOG})",
        )
        sub.add_argument(
            "--table",
            help="the verdicts table (default verdict_log in SQLite, "
            "tag_verdict_log in PostgreSQL)",
        )
    stats.add_argument("--json", action="store_true", help="print the stats as JSON")
    stats.add_argument(
        "--rules", action="store_true", help="also list each rule's counts"
    )
    export.add_argument(
        "-o", "--output", help="write to this file (default: standard output)"
    )
    export.add_argument(
        "--rule",
        action="append",
        dest="rules",
        metavar="RULE_ID",
        help="only this rule's records (repeatable)",
    )
    parser.set_defaults(handler=verdicts_command)


def verdicts_command(args: argparse.Namespace) -> int:
    """Run `tag verdicts stats|export`."""
    with reading(args.log, args.table) as log:
        if args.action == "stats":
            stats = log.stats()
            print(  # noqa: T201
                stats.model_dump_json(indent=2)
                if args.json
                else _format_stats(args.log, stats, rules=args.rules)
            )
            return 0
        _check_export(args.log, log, args.rules)
        if args.output is None:
            log.export(sys.stdout, rule_ids=args.rules)
            return 0
        try:
            out = Path(args.output).open("w", encoding="utf-8")  # noqa: SIM115
        except OSError as error:
            msg = f"-o {args.output}: cannot be written ({error.strerror or error})."
            raise CommandError(msg) from None
        with out:
            written = log.export(out, rule_ids=args.rules)
        print(f"wrote {written} records to {args.output}", file=sys.stderr)  # noqa: T201
        return 0


def _check_export(location: str, log: VerdictLog, rule_ids: list[str] | None) -> None:
    """Refuse an export of rules the log has no verdict on; note an empty one.

    Raises:
        CommandError: None of `rule_ids` is in the log (a typo, most likely).
    """
    where = f"the verdict log {_redacted(location)}"
    if not rule_ids:
        if not len(log):
            print(f"{where} holds no verdicts.", file=sys.stderr)  # noqa: T201
        return
    stats = log.stats()
    absent = [
        rule_id for rule_id in dict.fromkeys(rule_ids) if rule_id not in stats.per_rule
    ]
    if len(absent) < len(set(rule_ids)):
        if absent:
            print(  # noqa: T201
                f"{where} holds no verdicts on {', '.join(absent)}; exporting the "
                "other rules'.",
                file=sys.stderr,
            )
        return
    held = list(stats.per_rule)
    sample = ", ".join(held[:_RULES_SHOWN]) + (
        ", ..." if len(held) > _RULES_SHOWN else ""
    )
    msg = (
        f"{where} holds no verdicts on {', '.join(absent)}: it has {stats.verdicts:,} "
        f"verdicts on {stats.rules:,} rules{f' ({sample})' if sample else ''}; "
        "`tag verdicts stats --rules` lists them. Nothing was exported."
    )
    raise CommandError(msg)


def open_log(location: str, table: str | None) -> VerdictLog:
    """The verdict log at `location`, opened read-only, or a one-line error.

    A missing file, or a database without the log's tables (or without `table`),
    is refused: reading never creates a log.
    """
    from langchain_tag.learning.verdict_log import (  # noqa: PLC0415
        MissingVerdictLogError,
        open_verdict_log,
    )

    postgres = location.startswith(("postgresql://", "postgres://"))
    if not postgres and not Path(location).is_file():
        msg = (
            f"no verdict log at {location}: give the SQLite file (or a "
            "postgresql:// URI) the judge logs to."
        )
        raise CommandError(msg)
    options = {"table": table} if table else {}
    try:
        return open_verdict_log(location, read_only=True, **options)
    except MissingVerdictLogError as error:
        hint = f"check --table {table}" if table else "the log's table with --table"
        msg = f"{error}; give the file (or URI) the judge logs to, or {hint}."
        raise CommandError(msg) from error
    except Exception as error:
        msg = (
            f"cannot open the verdict log {_redacted(location)}: "
            f"{describe_error(error)}"
        )
        raise CommandError(msg) from error


@contextmanager
def reading(location: str, table: str | None) -> Iterator[VerdictLog]:
    """The log at `location` (see `open_log`), closed after; its errors in one line.

    Raises:
        CommandError: The log cannot be opened, or the database fails while it is
            read (a lock held too long, a lost connection).
    """
    log = open_log(location, table)
    try:
        yield log
    except Exception as error:
        if not _database_error(error):
            raise
        msg = (
            f"cannot read the verdict log {_redacted(location)}: "
            f"{describe_error(error)}"
        )
        raise CommandError(msg) from error
    finally:
        log.close()


def _database_error(error: BaseException) -> bool:
    """Whether `error` is a DB-API error (SQLite's or psycopg's)."""
    return any(
        kind.__name__ in {"DatabaseError", "InterfaceError"}
        for kind in type(error).__mro__
    )


def _redacted(location: str) -> str:
    """`location` without a password a URI may carry."""
    from langchain_tag.models import without_password  # noqa: PLC0415

    return without_password(location)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def _counts(counts: Mapping[str, int]) -> str:
    return "; ".join(f"{name or '(none)'} {n:,}" for name, n in counts.items()) or "-"


def _by_label(by_model: Mapping[str, int]) -> dict[str, int]:
    """The verdicts per model label; identities that differ only in settings add up."""
    from langchain_tag.models import model_label  # noqa: PLC0415

    labels: dict[str, int] = {}
    for identity, n in by_model.items():
        label = model_label(identity)
        labels[label] = labels.get(label, 0) + n
    return dict(sorted(labels.items()))


def _format_stats(location: str, stats: VerdictLogStats, *, rules: bool) -> str:
    share = f" ({stats.applies / stats.verdicts:.1%})" if stats.verdicts else ""
    lines = [
        f"verdict log {_redacted(location)}",
        f"  verdicts   {stats.verdicts:,} (position {stats.position:,})",
        (
            f"  inputs     {stats.inputs:,} ({stats.inputs_with_text:,} with text, "
            f"{stats.inputs_hashed:,} as hashed features only)"
        ),
        f"  rules      {stats.rules:,}",
        f"  YES        {stats.applies:,}{share}",
        f"  failed     {stats.failed:,}",
        f"  shadow     {stats.shadow:,} (judged while skipped, to measure recall)",
        f"  skipped    {stats.skipped:,} (pairs the prefilter skipped: no verdict)",
        f"  oldest     {_when(stats.oldest)}",
        f"  newest     {_when(stats.newest)}",
        f"  by source  {_counts(stats.by_source)}",
        f"  by model   {_counts(_by_label(stats.by_model))}",
    ]
    if rules:
        width = max((len(rule_id) for rule_id in stats.per_rule), default=4)
        lines += ["", f"  {'rule':<{width}}  judged     YES"]
        lines += [
            f"  {rule_id:<{width}}  {c.judged:>6,}  {c.applies:>6,}"
            for rule_id, c in stats.per_rule.items()
        ]
    return "\n".join(lines)
