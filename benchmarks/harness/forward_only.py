"""The forward-only limit: the model's decode forward alone, timed in-process.

offline_worker.py --forward-only runs the engine in-process (one torch thread on
one core, as the served worker runs its forward) and times the model's forward
passes of full-batch decode steps alone: BATCH / that time is the physical
limit no scheduling can beat. `bench.py offline` measures it once per round
beside its configurations; this subcommand measures only it, --rounds times.

  .tool-venv/bin/python benchmarks/bench.py forward-only --model tiny --rounds 3
"""

from __future__ import annotations

import statistics
from pathlib import Path

from harness import builds, results, worker

HELP = "the forward-only limit alone: the decode forward timed in-process on one core"
CONFIG = "forward-only"  # its configuration name in an offline result's runs


def measure(python: Path, model: Path, *, batch: int, out_len: int, reps: int) -> dict:
    """One in-process engine start timing its full-batch decode forwards (offline_worker.py's RESULT)."""
    return worker.run(python, model, {}, batch=batch, out_len=out_len, reps=reps, forward_only=True)


def describe(limit: dict) -> str:
    """One measurement as the report line shows it."""
    return (f"{limit['forward_limit']:9.0f} tok/s ({limit['forward_ms']:.3f} ms per forward, "
            f"{limit['forward_threads']} thread(s) on cores {limit['forward_cores']})")  # fmt: skip


def summarize(runs: list[dict]) -> dict:
    limits = [r for r in runs if r["config"] == CONFIG]
    return {
        "forward_limit": statistics.median(r["forward_limit"] for r in limits),
        "forward_ms": statistics.median(r["forward_ms"] for r in limits),
        "forward_ms_range": [min(r["forward_ms"] for r in limits), max(r["forward_ms"] for r in limits)],
    }


def add_arguments(ap) -> None:
    ap.add_argument("--model", choices=builds.MODEL_ARGS, default="tiny")
    ap.add_argument("--build", choices=builds.BUILDS, default=builds.UPSTREAM, help="whose venv runs it")
    ap.add_argument("--rounds", type=int, default=3, help="engine starts, one measurement each")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3, help=worker.REPS_HELP)
    results.add_json_argument(ap)


def main(args) -> int:
    pythons = builds.venvs()
    model = builds.build_model(pythons[builds.UPSTREAM], args.model)
    runs = []
    for r in range(args.rounds):
        limit = measure(pythons[args.build], model, batch=args.batch, out_len=args.out_len, reps=args.reps)
        runs.append({"round": r + 1, "config": CONFIG, **limit})
        print(f"round {r + 1} forward-only   {describe(limit)}", flush=True)
    summary = summarize(runs)
    print(f"\nmodel={args.model} batch={args.batch} build={args.build}: median {summary['forward_limit']:.0f} tok/s, "
          f"{summary['forward_ms']:.3f} ms per forward")  # fmt: skip
    data = results.make("forward-only", arguments=results.arguments(args), runs=runs, summary=summary,
                        python=pythons[builds.OVERLAY])  # fmt: skip
    results.write(data, args.json)
    return 0
