"""Speculative decoding inside multi-step windows, offline: upstream, spec alone, spec + N.

Configurations (each `vllm.LLM` in its own process, never two at once, order
alternating per round), on the tiny model, BATCH prompts decoding OUT_LEN
greedy tokens: upstream without drafts; upstream with drafts (spec alone);
the overlay with drafts and --num-scheduler-steps N. Reports median output
tokens/s, ratios to upstream and to spec alone, and the acceptance length
(tokens per verified step: 1 + accepted drafts / drafting steps).
Drafters: the target as its own draft model ("self", every draft accepted), a
noisy copy of it ("noisy", weights perturbed by 5% of their init std), ngram,
an EAGLE head built from the target (tests/support/tiny_eagle.py), and "mtp":
a one-layer target with its own MTP layer (tests/support/tiny_mtp.py), which
then replaces the tiny model as the target of all configurations.

  .tool-venv/bin/python benchmarks/spec_multi_step_ab.py --drafter self --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from multi_step_ab import _run
from serve_ab import ROOT, build_model, venvs


def _built(python: Path, script: str, *args: object) -> None:
    cmd = [python, ROOT / "tests/support" / script, *args]
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True)


def _drafter(name: str, python: Path, model: Path, k: int) -> tuple[dict, Path]:
    """The speculative config for a drafter, and the target model to run it with."""
    models = ROOT / "build" / "models"
    if name == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}, model
    if name == "eagle":
        _built(python, "tiny_eagle.py", model, models / "bench-tiny-eagle")
        return {"method": "eagle", "model": str(models / "bench-tiny-eagle"), "num_speculative_tokens": k}, model
    if name == "mtp":
        _built(python, "tiny_mtp.py", models / "bench-tiny-mtp")
        return {"method": "mtp", "num_speculative_tokens": k}, models / "bench-tiny-mtp"
    draft = model
    if name == "noisy":
        draft = models / "bench-tiny-noisy"
        _built(python, "tiny_model.py", draft, "--perturb", "0.05")
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", choices=["self", "noisy", "ngram", "eagle", "mtp"], default="self")
    ap.add_argument("--k", type=int, default=3, help="drafts per step")
    ap.add_argument("--steps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2, help="timed generate() calls per engine start")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()

    pythons = venvs()
    model = build_model(pythons["upstream"], "tiny")
    spec_config, model = _drafter(args.drafter, pythons["upstream"], model, args.k)
    spec = {"speculative_config": spec_config}
    configs = {"upstream": (pythons["upstream"], {}), "upstream spec": (pythons["upstream"], spec)}
    for n in args.steps:
        configs[f"overlay spec N={n}"] = (pythons["overlay"], {**spec, "num_scheduler_steps": n})
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for name in list(configs) if r % 2 == 0 else list(configs)[::-1]:
            python, kwargs = configs[name]
            runs[name].append(_run(python, model, kwargs, args))
            print(f"round {r + 1} {name:18} {runs[name][-1]['median']:9.0f} tok/s", flush=True)
    med = {name: statistics.median(x["median"] for x in v) for name, v in runs.items()}
    print(f"\ndrafter={args.drafter} k={args.k} batch={args.batch} out_len={args.out_len} rounds={args.rounds}")
    print(f"{'config':18} {'tok/s':>9} {'vs upstream':>12} {'vs spec alone':>14} {'accept len':>11}")
    for name, value in med.items():
        lengths = [x.get("acceptance_length") for x in runs[name] if x.get("acceptance_length")]
        accept = f"{statistics.median(lengths):.2f}" if lengths else "-"
        print(f"{name:18} {value:9.0f} {value / med['upstream']:11.2f}x "
              f"{value / med['upstream spec']:13.2f}x {accept:>11}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
