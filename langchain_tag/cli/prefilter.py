"""`tag prefilter train RULEBOOK [LOG] -o MODEL`: learn which rules to skip.

Trains a `LearnedPrefilter` on the verdicts the judge logged (see `tag verdicts`),
and on the skip records a learned prefilter left there (the pairs it skipped and
nobody judged count as fractional YES in the thresholds), and saves it; load it
with `LearnedPrefilter.load(MODEL, rulebook)` and pass it as
`TAGRetriever(prefilter=...)`. The thresholds aim at `--target-recall` itself: a
one-off training has no stream to keep a promise over (a retriever's
`retrain_every` does that). The model path is checked before anything is read,
and the log is read only (see `tag verdicts`). Imports the learner only when the
command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from langchain_tag.cli.errors import check_writable, number_in
from langchain_tag.cli.verdicts import DEFAULT_LOG, reading
from langchain_tag.errors import CommandError

target_recall = number_in(0.0, 1.0, low_open=True)
"""An argparse type: a number in (0, 1], what `LearnedPrefilter.target_recall`
accepts (gt=0, le=1)."""


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tag prefilter` on the `tag` command's subparsers."""
    parser = commands.add_parser(
        "prefilter",
        help="train the learned prefilter from the verdict log",
        description="Learn, from the judge's own logged verdicts, which rules will "
        "come back NO for an input, so that they need not be judged.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    train = actions.add_parser("train", help="train and save a LearnedPrefilter")
    train.add_argument("rulebook", help="the rulebook JSON the verdicts are about")
    train.add_argument(
        "log",
        nargs="?",
        default=str(DEFAULT_LOG),
        help=f"an SQLite file or a postgresql:// URI (default {DEFAULT_LOG})",
    )
    train.add_argument("-o", "--output", required=True, help="the model file (.npz)")
    train.add_argument(
        "--target-recall",
        type=target_recall,
        default=0.95,
        help="share of the judge's YES verdicts to keep, in (0, 1] (default 0.95)",
    )
    train.add_argument("--table", help="the verdicts table, if not the default")
    parser.set_defaults(handler=prefilter_command)


def prefilter_command(args: argparse.Namespace) -> int:
    """Run `tag prefilter train`."""
    from langchain_tag.learning.learned_prefilter import LearnedPrefilter  # noqa: PLC0415
    from langchain_tag.rules import Rulebook  # noqa: PLC0415

    output = Path(args.output)
    check_writable(output, example="prefilter.npz", not_done="trained")
    rulebook = Rulebook.load(args.rulebook)
    with reading(args.log, args.table) as log:
        prefilter = LearnedPrefilter(rulebook, target_recall=args.target_recall)
        report = prefilter.fit(log.examples(rulebook, skipped=True))
    if not report.count("learned") + report.count("skipped"):
        msg = (
            f"no rule of {args.rulebook} has enough logged verdicts to learn from "
            f"({report.examples} examples over {report.inputs} inputs); judge more "
            "inputs with a verdict_log first."
        )
        raise CommandError(msg)
    try:
        path = prefilter.save(output)
    except OSError as error:
        msg = (
            f"-o {output}: cannot be written ({error.strerror or error}); the "
            "training is lost, run again with another -o."
        )
        raise CommandError(msg) from error
    counted = (
        f" (and {report.skipped:,} skipped pair(s) nobody judged)"
        if report.skipped
        else ""
    )
    print(  # noqa: T201
        f"trained on {report.examples:,} verdicts{counted} over {report.inputs:,} "
        f"inputs in {report.seconds:.2f} s: {report.count('learned')} rules learned, "
        f"{report.count('skipped')} always skipped, "
        f"{len(rulebook) - report.count('learned') - report.count('skipped')} always "
        f"judged; expected {report.expected_judged:.1f} of {len(rulebook)} rules "
        f"judged per input at {report.expected_recall:.1%} recall of YES verdicts "
        f"(target {report.target_recall:.0%}).\nwrote {path}"
    )
    return 0
