"""`tag verdicts stats|export [LOG]`: what the verdict log holds; all of it as JSONL.

LOG is an SQLite file or a `postgresql://` URI (default
`.langchain-tag/verdicts.sqlite`). The log is imported when the command runs, so
`tag --help` loads neither it nor the judge.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from langchain_tag._text import describe_error
from langchain_tag.cli.errors import CommandError

if TYPE_CHECKING:
    from langchain_tag.learning.verdict_log import VerdictLog, VerdictLogStats

DEFAULT_LOG = Path(".langchain-tag") / "verdicts.sqlite"


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
    log = open_log(args.log, args.table)
    try:
        if args.action == "stats":
            stats = log.stats()
            print(  # noqa: T201
                stats.model_dump_json(indent=2)
                if args.json
                else _format_stats(args.log, stats, rules=args.rules)
            )
            return 0
        if args.output is None:
            log.export(sys.stdout, rule_ids=args.rules)
            return 0
        with Path(args.output).open("w", encoding="utf-8") as out:
            written = log.export(out, rule_ids=args.rules)
        print(f"wrote {written} records to {args.output}", file=sys.stderr)  # noqa: T201
        return 0
    finally:
        log.close()


def open_log(location: str, table: str | None) -> VerdictLog:
    """The verdict log at `location`, or a one-line error naming what is wrong."""
    from langchain_tag.learning.verdict_log import open_verdict_log  # noqa: PLC0415

    postgres = location.startswith(("postgresql://", "postgres://"))
    if not postgres and not Path(location).is_file():
        msg = (
            f"no verdict log at {location}: give the SQLite file (or a "
            "postgresql:// URI) the judge logs to."
        )
        raise CommandError(msg)
    try:
        return open_verdict_log(location, **({"table": table} if table else {}))
    except Exception as error:
        msg = (
            f"cannot open the verdict log {_redacted(location)}: "
            f"{describe_error(error)}"
        )
        raise CommandError(msg) from error


def _redacted(location: str) -> str:
    """`location` without a password a URI may carry."""
    return re.sub(r"://([^:/@]*):.*@", r"://\1:***@", location)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def _counts(counts: dict[str, int]) -> str:
    return "; ".join(f"{name or '(none)'} {n:,}" for name, n in counts.items()) or "-"


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
        f"  oldest     {_when(stats.oldest)}",
        f"  newest     {_when(stats.newest)}",
        f"  by source  {_counts(stats.by_source)}",
        f"  by model   {_counts(stats.by_model)}",
    ]
    if rules:
        width = max((len(rule_id) for rule_id in stats.per_rule), default=4)
        lines += ["", f"  {'rule':<{width}}  judged     YES"]
        lines += [
            f"  {rule_id:<{width}}  {c.judged:>6,}  {c.applies:>6,}"
            for rule_id, c in stats.per_rule.items()
        ]
    return "\n".join(lines)
