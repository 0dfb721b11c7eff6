"""The price options of `--estimate` (`tag eval`, `tag run --inputs`), in one place.

Public: the experiments' `tag eval` adds and reads the same options.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from langchain_tag.errors import CommandError

if TYPE_CHECKING:
    from langchain_tag.usage import PromptCaching, TokenPrices

__all__ = ["add_arguments", "check", "from_args"]


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add the price options: input, output and cached input, the batch discount.

    And `--cache-min-tokens`, the prompt-caching model's minimum prefix.
    """
    parser.add_argument(
        "--price-in",
        type=float,
        help="--estimate: USD per million input tokens",
    )
    parser.add_argument(
        "--price-out",
        type=float,
        help="--estimate: USD per million output tokens",
    )
    parser.add_argument(
        "--price-cached-input",
        type=float,
        help="--estimate: USD per million cached input tokens (default: the "
        "--price-in price, no caching discount)",
    )
    parser.add_argument(
        "--batch-discount",
        type=float,
        help="--estimate: the share taken off every price in batch, for the batch "
        "price column (default 0.5: OpenAI's Batch API and flex processing)",
    )
    parser.add_argument(
        "--cache-min-tokens",
        type=int,
        help="--estimate: the shortest prompt prefix the provider caches (default "
        "1024, OpenAI's; cached prefixes grow in 128-token steps)",
    )


def check(args: argparse.Namespace) -> None:
    """Refuse prices that do not go together, without `--estimate`, or negative."""
    prices = (args.price_in, args.price_out)
    if prices != (None, None) and (
        not args.estimate
        or None in prices
        or any(p is not None and p < 0 for p in prices)
    ):
        msg = (
            "--price-in and --price-out go together, with --estimate: USD per "
            f"million input and output tokens, each >= 0 (got {prices[0]} and "
            f"{prices[1]}" + ("" if args.estimate else ", without --estimate") + ")."
        )
        raise CommandError(msg)
    cached = args.price_cached_input
    if cached is not None and (None in prices or cached < 0):
        msg = (
            "--price-cached-input prices cached input tokens beside --price-in and "
            f"--price-out, with --estimate: USD per million, >= 0 (got {cached})."
        )
        raise CommandError(msg)
    given = [
        f"--{option.replace('_', '-')}"
        for option in ("batch_discount", "cache_min_tokens")
        if getattr(args, option) is not None
    ]
    if given and not args.estimate:
        msg = f"{', '.join(given)}: options of --estimate; add it, or drop them."
        raise CommandError(msg)
    if args.batch_discount is not None and not 0 <= args.batch_discount < 1:
        msg = (
            "--batch-discount is the share taken off every price in batch, from 0 "
            f"to below 1 (0.5: half price), got {args.batch_discount}."
        )
        raise CommandError(msg)
    if args.cache_min_tokens is not None and args.cache_min_tokens < 1:
        msg = f"--cache-min-tokens must be at least 1, got {args.cache_min_tokens}."
        raise CommandError(msg)


def from_args(args: argparse.Namespace) -> tuple[TokenPrices | None, PromptCaching]:
    """The prices given (None without `--price-in`) and the prompt-caching model."""
    from langchain_tag.usage import (  # noqa: PLC0415 - loads pydantic models
        PromptCaching,
        TokenPrices,
    )

    prices = (
        None
        if args.price_in is None
        else TokenPrices(
            input=args.price_in,
            output=args.price_out,
            cached_input=args.price_cached_input,
            **_given(batch_discount=args.batch_discount),
        )
    )
    return prices, PromptCaching(**_given(min_tokens=args.cache_min_tokens))


def _given(**options: object) -> dict[str, object]:
    """The options given (not None): the others keep their model's default."""
    return {name: value for name, value in options.items() if value is not None}
