"""Speculative decoding inside multi-step windows, offline: upstream, spec alone, spec + N.

Configurations (each `vllm.LLM` in its own process, never two at once, order
alternating per round), on the tiny model, BATCH prompts decoding OUT_LEN
greedy tokens: upstream without drafts; upstream with drafts (spec alone);
the overlay with drafts and --num-scheduler-steps N (async scheduling on, where vLLM
allows it; --sync N also runs it off). Reports median output
tokens/s, ratios to upstream and to spec alone, and the acceptance length
(tokens per verified step: 1 + accepted drafts / drafting steps).
Drafters: the target as its own draft model ("self", every draft accepted), a
noisy copy of it ("noisy", weights perturbed by 5% of their init std), ngram,
an EAGLE head built from the target (tests/support/tiny_eagle.py), and "mtp":
a one-layer target with its own MTP layer (tests/support/tiny_mtp.py), which
then replaces the tiny model as the target of all configurations.

  .tool-venv/bin/python benchmarks/bench.py spec --drafter self --rounds 2
"""

from __future__ import annotations

import statistics
from pathlib import Path

from harness import builds, results, worker
from harness.paths import MODELS

HELP = "speculative decoding in windows: upstream, upstream with drafts, overlay with drafts and N"
DRAFTERS = ["self", "noisy", "ngram", "eagle", "mtp"]
UPSTREAM, SPEC_ALONE = builds.UPSTREAM, f"{builds.UPSTREAM} spec"


def drafter(name: str, python: Path, model: Path, k: int) -> tuple[dict, Path]:
    """The speculative config for a drafter, and the target model to run it with."""
    if name == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}, model
    if name == "eagle":
        builds.build_support_model(python, "tiny_eagle.py", model, MODELS / "bench-tiny-eagle")
        return {"method": "eagle", "model": str(MODELS / "bench-tiny-eagle"), "num_speculative_tokens": k}, model
    if name == "mtp":
        builds.build_support_model(python, "tiny_mtp.py", MODELS / "bench-tiny-mtp")
        return {"method": "mtp", "num_speculative_tokens": k}, MODELS / "bench-tiny-mtp"
    draft = model
    if name == "noisy":
        draft = MODELS / "bench-tiny-noisy"
        builds.build_support_model(python, "tiny_model.py", draft, "--perturb", "0.05")
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}, model


def summarize(runs: list[dict]) -> dict:
    """Median tok/s per configuration, against upstream and against spec alone, and the acceptance length."""
    configs = list(dict.fromkeys(r["config"] for r in runs))
    med = {c: statistics.median(r["median"] for r in runs if r["config"] == c) for c in configs}
    accept = {}
    for c in configs:
        lengths = [r.get("acceptance_length") for r in runs if r["config"] == c and r.get("acceptance_length")]
        accept[c] = statistics.median(lengths) if lengths else None
    return {
        "median_tok_s": med,
        "vs_upstream": {c: v / med[UPSTREAM] for c, v in med.items()},
        "vs_spec_alone": {c: v / med[SPEC_ALONE] for c, v in med.items()},
        "acceptance_length": accept,
    }


def add_arguments(ap) -> None:
    ap.add_argument("--drafter", choices=DRAFTERS, default="self")
    ap.add_argument("--k", type=int, default=3, help="drafts per step")
    ap.add_argument("--steps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--sync", type=int, nargs="*", default=[], metavar="N",
                    help="also the overlay at these N with async scheduling off")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2, help=worker.REPS_HELP)
    results.add_json_argument(ap)


def main(args) -> int:
    pythons = builds.venvs()
    model = builds.build_model(pythons[builds.UPSTREAM], "tiny")
    spec_config, model = drafter(args.drafter, pythons[builds.UPSTREAM], model, args.k)
    spec = {"speculative_config": spec_config}
    configs = {UPSTREAM: (pythons[builds.UPSTREAM], {}), SPEC_ALONE: (pythons[builds.UPSTREAM], spec)}
    for n in args.steps:
        configs[f"overlay spec N={n}"] = (pythons[builds.OVERLAY], {**spec, "num_scheduler_steps": n})
    for n in args.sync:
        configs[f"overlay spec N={n} sync"] = (
            pythons[builds.OVERLAY], {**spec, "num_scheduler_steps": n, "async_scheduling": False})  # fmt: skip
    runs: list[dict] = []
    for r in range(args.rounds):
        for name in list(configs) if r % 2 == 0 else list(configs)[::-1]:
            python, kwargs = configs[name]
            result = worker.run(python, model, kwargs, batch=args.batch, out_len=args.out_len, reps=args.reps)
            runs.append({"round": r + 1, "config": name, **result})
            print(f"round {r + 1} {name:23} {result['median']:9.0f} tok/s", flush=True)
    summary = summarize(runs)
    print(f"\ndrafter={args.drafter} k={args.k} batch={args.batch} out_len={args.out_len} rounds={args.rounds}")
    print(f"{'config':23} {'tok/s':>9} {'vs upstream':>12} {'vs spec alone':>14} {'accept len':>11}")
    for name, value in summary["median_tok_s"].items():
        length = summary["acceptance_length"][name]
        accept = f"{length:.2f}" if length else "-"
        print(f"{name:23} {value:9.0f} {summary['vs_upstream'][name]:11.2f}x "
              f"{summary['vs_spec_alone'][name]:13.2f}x {accept:>11}")  # fmt: skip
    data = results.make("spec", arguments=results.arguments(args), runs=runs, summary=summary,
                        python=pythons[builds.OVERLAY])  # fmt: skip
    results.write(data, args.json)
    return 0
