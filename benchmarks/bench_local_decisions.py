"""Benchmark: a local decision model, every pair its own pass against one shared prefix.

A decision reads P(yes) of each question from one forward pass; when the questions
share their input, the input's keys and values are computed once and every question
runs on them (`InProcessModel.decision_model()`, `local_model._decisions`). This
measures what that saves, in pairs (input, rule) per second:

- Default: SmolLM2-135M (the offline model, real weights, float32) on this CPU.
  `--task demo`: each of `--inputs` demo snippets (short code, ~80 tokens with the
  instructions) against the first `--rules` rules of the curated PEP 8 rulebook;
  `--task nba`: RuleArena-NBA dev problems (~500-token cases) against the NBA
  catalogue's rules (reads the shared data). The questions are exactly those
  `DecisionJudge` asks: every pair its own prompt (one plain forward pass over
  instructions, input and question) against one request (the prefix once). The
  probabilities must agree (max |diff| printed). What is saved grows with the
  input's share of the prompt.
- `--shape llama-8b|qwen-1.5b|tiny`: random weights in the shape of a public
  config (Llama-3.1-8B, Qwen2.5-1.5B; tiny for a smoke run), bfloat16 on CUDA,
  nothing downloaded. Prompts of `--prompt-tokens` tokens of instructions and input
  plus `--rule-tokens` tokens per rule, `--inputs` x `--rules` pairs: every pair
  its own prompt (batched as memory allows) against the input once with each rule
  on its cache. Random weights judge nothing; the time is what is measured.

    python benchmarks/bench_local_decisions.py [--task demo|nba] [--inputs 2 --rules 24]
    python benchmarks/bench_local_decisions.py --device cuda --shape llama-8b

No capable model runs here: SmolLM2 is real but weak; the probabilities it gives are
not verdicts to trust, only the same with and without the shared prefix.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _common
from langchain_tag_experiments.evaluation.datasets import load_nba

from langchain_tag import demo
from langchain_tag.local_model import InProcessModel
from langchain_tag.local_model._decisions import (
    DECISION_INSTRUCTIONS,
    Prepared,
    prepare,
    render_question,
    rows_per_batch,
    score_questions,
)
from langchain_tag.matching import DecisionJudge
from langchain_tag.resources import curated_rulebook
from langchain_tag.rules import Rule

SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3.1-8B's config.json.
    "llama-8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
    },
    # Qwen2.5-1.5B-Instruct's config.json.
    "qwen-1.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    },
    # A smoke run of the same code on any CPU.
    "tiny": {
        "model_type": "llama",
        "vocab_size": 4096,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
    },
}

SPEEDUP_GOAL = 3.0
AGREEMENT_GOAL = 2e-3


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Read the command line: `argv`, or `sys.argv[1:]` when None."""
    parser = _common.make_parser(__doc__, data=True, repeats_help="timed runs")
    parser.add_argument("--task", choices=["demo", "nba"], default="demo")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), help="random weights of a public config"
    )
    parser.add_argument("--inputs", type=int, default=None, help="inputs judged")
    parser.add_argument("--rules", type=int, default=None, help="rules per input")
    parser.add_argument("--prompt-tokens", type=int, default=550)
    parser.add_argument("--rule-tokens", type=int, default=90)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    args = _common.parse_arguments(parser, argv)
    for name in ("inputs", "rules", "prompt_tokens", "rule_tokens", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.shape is None and args.device == "cuda":
        parser.error("--device cuda needs --shape (the GPU figure uses random weights)")
    return args


def best(repeats: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """The shortest of `repeats` runs of `run`, and its result."""
    timings = []
    result = None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        timings.append(time.perf_counter() - started)
    return min(timings), result


def task(args: argparse.Namespace) -> tuple[list[str], list[Rule]]:
    """The inputs and the rules judged (see `--task`)."""
    if args.task == "demo":
        return (
            [s.code for s in demo.DEMO_SNIPPETS][: args.inputs or 2],
            curated_rulebook("pep8").rules[: args.rules or 24],
        )
    data_dir = _common.require_data_dir(
        args.data_dir, [Path("rulearena_nba/problems_dev.jsonl")]
    )
    dataset = load_nba(data_dir)
    return (
        [p.text for p in dataset.problems][: args.inputs or 2],
        dataset.catalogue.rules[: args.rules or 24],
    )


def smollm2(args: argparse.Namespace) -> dict[str, Any]:
    """One by one against one request, SmolLM2 on this CPU."""
    inputs, rules = task(args)
    model = InProcessModel(device="cpu", n_threads=args.threads).load()
    judge = DecisionJudge(model=model.decision_model(), cache=None)
    questions = [render_question(r.rule_id, judge.question(r)) for r in rules]
    loaded = model._ensure_loaded()  # noqa: SLF001 - the weights, for the baseline
    yes, no = loaded.answer_ids()
    prompts = [
        [
            [*prepared.prefix, *criteria, *question]
            for criteria, question in prepared.questions
        ]
        for prepared in (
            prepare(loaded.tokenizer, DECISION_INSTRUCTIONS, text, questions)
            for text in inputs
        )
    ]
    model.decide(inputs[0], questions[:2])  # warm-up

    def alone() -> list[list[float]]:
        # Every pair its own prompt, one pass over all of it.
        return [
            [own_prompt(loaded.model, ids, yes, no) for ids in rows] for rows in prompts
        ]

    def shared() -> list[list[float]]:
        return [model.decide(text, questions)[0] for text in inputs]

    alone_s, alone_p = best(args.repeats, alone)
    shared_s, shared_p = best(args.repeats, shared)
    pairs = len(inputs) * len(questions)
    return {
        "model": f"SmolLM2-135M-Instruct (real weights, float32), {args.task} task",
        "device": "cpu",
        "inputs": len(inputs),
        "rules": len(questions),
        "pairs": pairs,
        "alone_s": alone_s,
        "shared_s": shared_s,
        "max_abs_diff": max(
            abs(a - b)
            for row_a, row_b in zip(alone_p, shared_p, strict=True)
            for a, b in zip(row_a, row_b, strict=True)
        ),
    }


def own_prompt(model: Any, ids: list[int], yes: list[int], no: list[int]) -> float:
    """P(yes) of one whole prompt, one pass: the baseline, computed the plain way."""
    import torch  # noqa: PLC0415

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
        p = torch.softmax(logits.float(), dim=-1)
        return float(p[yes].sum() / (p[yes].sum() + p[no].sum()))


def shaped(args: argparse.Namespace) -> dict[str, Any]:
    """Every pair its own prompt against the input once, random weights."""
    import torch  # noqa: PLC0415
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    if args.device == "cuda" and not torch.cuda.is_available():
        msg = "--device cuda: torch sees no CUDA GPU here"
        raise SystemExit(msg)
    settings = dict(SHAPES[args.shape])
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    model.eval()
    if args.threads:
        torch.set_num_threads(args.threads)
    draw = random.Random(0)
    vocab = int(config.vocab_size)
    n_inputs, n_rules = args.inputs or 8, args.rules or 55
    prefixes = [
        [draw.randrange(vocab) for _ in range(args.prompt_tokens)]
        for _ in range(n_inputs)
    ]
    rules = [
        [draw.randrange(vocab) for _ in range(args.rule_tokens)] for _ in range(n_rules)
    ]
    element = 2 if dtype == torch.bfloat16 else 4
    budget = torch.cuda.mem_get_info()[0] // 2 if args.device == "cuda" else 1 << 30
    own_rows = rows_per_batch(
        config,
        0,
        args.prompt_tokens + args.rule_tokens,
        element_bytes=element,
        budget=budget,
    )
    shared_rows = rows_per_batch(
        config,
        args.prompt_tokens,
        args.rule_tokens,
        element_bytes=element,
        budget=budget,
    )
    yes, no = [1], [2]

    def synced() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    def own() -> None:
        prompts = [p + r for p in prefixes for r in rules]
        with torch.inference_mode():
            for start in range(0, len(prompts), own_rows):
                batch = torch.tensor(
                    prompts[start : start + own_rows], device=args.device
                )
                model(input_ids=batch, logits_to_keep=1)
        synced()

    def shared() -> None:
        with torch.inference_mode():
            for prefix in prefixes:
                score_questions(
                    model,
                    Prepared(prefix, [([], rule) for rule in rules]),
                    yes,
                    no,
                    rows=shared_rows,
                )
        synced()

    own()  # warm-up (kernels, allocator)
    own_s, _ = best(args.repeats, own)
    shared_s, _ = best(args.repeats, shared)
    return {
        "model": f"{args.shape} shape, random weights, "
        f"{'bfloat16' if element == 2 else 'float32'}",
        "device": args.device
        + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""),
        "inputs": n_inputs,
        "rules": n_rules,
        "pairs": n_inputs * n_rules,
        "alone_s": own_s,
        "shared_s": shared_s,
        "rows_per_pass": {"own": own_rows, "shared": shared_rows},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures (and write them with `--json`)."""
    args = parse_args(argv)
    figures = shaped(args) if args.shape else smollm2(args)
    pairs = figures["pairs"]
    speedup = figures["alone_s"] / figures["shared_s"]
    figures["alone_pairs_per_s"] = pairs / figures["alone_s"]
    figures["shared_pairs_per_s"] = pairs / figures["shared_s"]
    figures["speedup"] = speedup
    alone_label = "every pair its own prompt"
    print(
        f"Local decisions: {figures['model']} on {figures['device']}; "
        f"{figures['inputs']} input(s) x {figures['rules']} rule(s) = {pairs} pairs"
    )
    print(
        f"  {alone_label:<26} {figures['alone_s']:8.2f} s "
        f"{figures['alone_pairs_per_s']:9.1f} pairs/s"
    )
    print(
        f"  {'input once, rules on it':<26} {figures['shared_s']:8.2f} s "
        f"{figures['shared_pairs_per_s']:9.1f} pairs/s   x{speedup:.1f}"
    )
    targets: dict[str, dict[str, Any]] = {
        "shared-prefix speedup": {
            "value": speedup,
            "unit": "x",
            "goal": f">= {SPEEDUP_GOAL:g}",
            "pass": speedup >= SPEEDUP_GOAL,
        }
    }
    if "max_abs_diff" in figures:
        print(f"  max |P(yes) own prompt - shared| = {figures['max_abs_diff']:.1e}")
        targets["agreement"] = {
            "value": figures["max_abs_diff"],
            "unit": "",
            "goal": f"<= {AGREEMENT_GOAL:g}",
            "pass": figures["max_abs_diff"] <= AGREEMENT_GOAL,
        }
    print()
    _common.print_targets(targets, digits=6 if "max_abs_diff" in figures else 3)
    if args.json:
        _common.write_json(args.json, {"figures": figures, "targets": targets})
    return 0


if __name__ == "__main__":
    sys.exit(main())
