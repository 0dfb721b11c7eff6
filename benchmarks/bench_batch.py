"""Batch lane vs online: HTTP requests, wall time, tokens and dollars for one job.

The job: `--inputs` inputs x the rules, judged by an `ApplicabilityJudge` on
`ChatOpenAI`. With the shared data, the RuleArena-NBA dev problems cycled to
`--inputs` (each copy made distinct, so nothing is a cache hit) and the 55 catalogue
rules; without it, synthetic inputs and 55 trigger rules. Both lanes talk HTTP to a
loopback `FakeBatchServer`, which answers online and batch requests with the same
deterministic fake and reports usage at about 4 characters a token, cached input
tokens as OpenAI's prompt caching would count them:

1. batch: `judge_in_batch` (a SQLite verdict cache, as a resumable run has):
   files of at most 50,000 requests and 200 MB, uploaded, batched, polled,
   downloaded, read into the cache. Then the same call again: all cached.
2. online: `judge.judge_rules` per input at `max_concurrency=16`, one request per
   pair. The online client costs several ms of CPU a request, so by default it
   runs on a sample of `--online-inputs` inputs spread over the job, and its
   figures are scaled to `--inputs` (`--online-inputs` equal to `--inputs`
   measures it all).

Wall times are on loopback and include the fake's answering; the provider's own
turnaround for a batch (minutes to 24 hours) is not measured, nor is model quality
(a fake answers). Dollars are the tokens at `--price-in`, `--price-cached` and
`--price-out` (USD per million; default gpt-4o-mini's list prices at the time of
writing), the batch lane's at the Batch API's 50% discount
(`langchain_tag.usage.TokenPrices`).

Run from the repository root:

    python benchmarks/bench_batch.py [--inputs 1000] [--online-inputs 100]

The exit status is 1 if the lanes' verdicts differ or a pair went unjudged.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common
from langchain_openai import ChatOpenAI
from langchain_tag_experiments.data import shared_data_dir
from langchain_tag_experiments.evaluation.datasets import load_nba

from langchain_tag import Rule
from langchain_tag.batch import BatchReport, BatchSettings, judge_in_batch
from langchain_tag.cache import SQLiteVerdictCache
from langchain_tag.matching import ApplicabilityJudge, Verdict
from langchain_tag.testing import (
    BatchScript,
    FakeBatchServer,
    RuleAwareFakeChatModel,
    trigger_rulebook,
)
from langchain_tag.usage import TokenPrices, TokenUsage, UsageCounter

NBA_FILES = [Path("rulearena_nba/rule_catalog.json")]
CONCURRENCY = 16


def job(inputs: int, data_dir: Path | None) -> tuple[str, list[str], list[Rule]]:
    """The dataset's name, `inputs` distinct inputs and the rules."""
    root = shared_data_dir(data_dir)
    if root is not None and all((root / f).is_file() for f in NBA_FILES):
        dataset = load_nba(root)
        texts = [problem.text for problem in dataset.problems]
        rules = list(dataset.catalogue.rules)
        name = f"RuleArena-NBA dev ({len(texts)} problems cycled)"
    else:
        rules = list(trigger_rulebook(55).rules)
        texts = [
            f"A synthetic input mentioning trigger-{i % 55:03d} and filler text. " * 20
            for i in range(131)
        ]
        name = "synthetic (no shared data)"
    cycled = [f"{texts[i % len(texts)]}\n\n(copy {i})" for i in range(inputs)]
    return name, cycled, rules


def _judge(server: FakeBatchServer, cache: Any) -> ApplicabilityJudge:
    llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model="gpt-4o-mini")
    return ApplicabilityJudge(llm=llm, cache=cache)


def batch_lane(
    texts: Sequence[str], rules: Sequence[Rule]
) -> tuple[dict[str, Any], BatchReport, dict[tuple[str, str], bool]]:
    """Judge every pair through the batch lane: figures, report, cached verdicts."""
    pairs = [(text, rule) for text in texts for rule in rules]
    with (
        tempfile.TemporaryDirectory() as tmp,
        FakeBatchServer(RuleAwareFakeChatModel(), [BatchScript(polls=2)]) as server,
    ):
        cache = SQLiteVerdictCache(Path(tmp) / "cache.sqlite")
        judge = _judge(server, cache)
        settings = BatchSettings(poll_interval=0.0)
        started = time.perf_counter()
        report = judge_in_batch(judge, pairs, settings=settings)
        seconds = time.perf_counter() - started
        requests = dict(server.hits)
        started = time.perf_counter()
        again = judge_in_batch(judge, pairs, settings=settings)
        rerun = time.perf_counter() - started
        stored = cache.mget([judge.cache_key(text, rule) for text, rule in pairs])
        total = sum(server.hits.values())
    verdicts = {
        (text, rule.rule_id): Verdict.model_validate_json(value).applies
        for (text, rule), value in zip(pairs, stored, strict=True)
        if value is not None
    }
    figures = {
        "seconds": seconds,
        "http_requests": sum(requests.values()),
        "by_route": requests,
        "rerun_seconds": rerun,
        "rerun_sent": again.sent,
        "rerun_http_requests": total - sum(requests.values()),
    }
    return figures, report, verdicts


def online_lane(
    texts: Sequence[str], rules: Sequence[Rule]
) -> tuple[dict[str, Any], TokenUsage, list[list[Verdict]]]:
    """Judge every pair online: figures, usage and the verdicts per input."""
    counter = UsageCounter()
    with FakeBatchServer(RuleAwareFakeChatModel()) as server:
        judge = _judge(server, None)
        config = counter.watch({"max_concurrency": CONCURRENCY})
        started = time.perf_counter()
        verdicts = [judge.judge_rules(text, rules, config) for text in texts]
        seconds = time.perf_counter() - started
        requests = sum(dict(server.hits).values())
    return {"seconds": seconds, "http_requests": requests}, counter.usage, verdicts


def _scaled(usage: TokenUsage, factor: float) -> TokenUsage:
    return TokenUsage(
        calls=round(usage.calls * factor),
        input_tokens=round((usage.input_tokens or 0) * factor),
        cached_input_tokens=round((usage.cached_input_tokens or 0) * factor),
        output_tokens=round((usage.output_tokens or 0) * factor),
    )


def _row(
    label: str, requests: float, seconds: float, usage: TokenUsage, usd: float | None
) -> None:
    tokens = f"{usage.input_tokens or 0:,} ({usage.cached_input_tokens or 0:,})"
    dollars = "n/a" if usd is None else f"{usd:.2f}"
    print(
        f"  {label:<28}{requests:>10,.0f}{seconds:>9.1f} s"
        f"{tokens:>24}{usage.output_tokens or 0:>12,}{dollars:>8}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run both lanes and print the comparison."""
    parser = _common.make_parser(__doc__, data=True, repeats_default=None)
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument(
        "--online-inputs",
        type=int,
        default=100,
        help="inputs judged online; the figures are scaled to --inputs",
    )
    parser.add_argument("--price-in", type=float, default=0.15)
    parser.add_argument("--price-cached", type=float, default=0.075)
    parser.add_argument("--price-out", type=float, default=0.60)
    args = _common.parse_arguments(parser, argv)
    name, texts, rules = job(args.inputs, args.data_dir)
    # Spread over the job, so that the sample's prompts are as long as the job's.
    size = min(args.online_inputs, len(texts))
    sample = [texts[i * len(texts) // size] for i in range(size)]
    scale = len(texts) / size
    prices = TokenPrices(
        input=args.price_in, cached_input=args.price_cached, output=args.price_out
    )
    pairs = len(texts) * len(rules)
    print(f"Job: {len(texts):,} inputs x {len(rules)} rules = {pairs:,} judgments")
    print(f"     inputs: {name}; loopback FakeBatchServer, ~4 characters a token")

    batch, report, batch_verdicts = batch_lane(texts, rules)
    online, online_usage, online_verdicts = online_lane(sample, rules)
    unjudged = report.requests - report.from_batch - report.online
    same = all(
        batch_verdicts.get((text, verdict.rule_id)) is verdict.applies
        for text, verdicts in zip(sample, online_verdicts, strict=True)
        for verdict in verdicts
    )
    online_full = _scaled(online_usage, scale)
    online_usd = prices.cost(online_full)
    batch_usd = prices.cost(report.usage, batch=True)
    measured = "measured" if scale == 1 else f"x{scale:g} of {size} inputs"

    print()
    print(
        f"  {'':<28}{'requests':>10}{'wall':>11}{'input tokens (cached)':>24}"
        f"{'output':>12}{'USD':>8}"
    )
    _row(
        f"online ({measured})",
        online["http_requests"] * scale,
        online["seconds"] * scale,
        online_full,
        online_usd,
    )
    _row(
        "batch lane", batch["http_requests"], batch["seconds"], report.usage, batch_usd
    )
    print(f"  batch lane's requests by route: {batch['by_route']}")
    files = ", ".join(
        f"{f.requests:,} requests / {f.bytes / 1e6:.1f} MB" for f in report.files
    )
    print(f"  batch files: {files}")
    print(
        f"  the same call again (all cached): {batch['rerun_sent']} sent, "
        f"{batch['rerun_http_requests']} HTTP requests, {batch['rerun_seconds']:.1f} s"
    )
    if online_usd and batch_usd is not None:
        print(f"  batch / online dollars: {batch_usd / online_usd:.2f}")
    print(
        f"  verdicts: batch = online on the {len(sample) * len(rules):,} sampled "
        f"pairs: {same}; pairs left unjudged: {unjudged}"
    )
    print(
        f"  prices (USD per million tokens): input {prices.input}, cached "
        f"{prices.cached_input}, output {prices.output}; batch at "
        f"{1 - prices.batch_discount:.0%} of them"
    )
    if args.json:
        _common.write_json(
            args.json,
            {
                "inputs": len(texts),
                "rules": len(rules),
                "pairs": pairs,
                "dataset": name,
                "online": {
                    **online,
                    "sample_inputs": size,
                    "scale": scale,
                    "usage_scaled": online_full.model_dump(),
                    "usd": online_usd,
                },
                "batch": {**batch, "report": report.model_dump(), "usd": batch_usd},
                "same_verdicts": same,
                "unjudged": unjudged,
                "prices": prices.model_dump(),
            },
        )
    return 0 if same and unjudged == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
