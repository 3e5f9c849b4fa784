"""The forward-only limit and the forward+sample limit: decode steps' pieces timed in-process.

offline_worker.py --forward-only runs the engine in-process (one torch thread on
one core, as the served worker runs its forward) and times, in full-batch decode
steps, the model's forward passes alone and upstream's sampling of each step
(forward_hooks.py: the logits of the sampled rows and the runner's sampler call,
as the runner makes them). Two limits come of the same steps:

- the forward-only limit, BATCH / the forward's time: the physical limit no
  scheduling can beat;
- the forward+sample limit, BATCH / (the forward's time + that step's logits
  and sampler time), added up per step (forward_hooks.StepTimes): the floor of
  a decode loop that keeps upstream's sampling, as a multi-step window does. It
  leaves out all the rest a step runs (input preparation, the runner's and the
  engine core's bookkeeping, the scheduler), which such a loop could shed.

Each is the median over the full-batch decode steps of one timed generate().
`bench.py offline` measures them once per round beside its configurations; this
subcommand measures only them, --rounds times. Results from before the
forward+sample limit (no "forward_sample_ms" in their runs) give the
forward-only limit alone.

  .tool-venv/bin/python benchmarks/bench.py forward-only --model tiny --rounds 3
"""

from __future__ import annotations

import statistics
from pathlib import Path

from harness import builds, results, worker

HELP = "the forward-only and forward+sample limits: decode steps' forward (and sampling) timed in-process on one core"
CONFIG = "forward-only"  # its configuration name in an offline result's runs (both limits: the same run)
SAMPLE_CONFIG = "forward+sample"  # the forward+sample limit's name in reports
# Each limit's fields in a run and in a summary: (tok/s, ms a step).
LIMITS = {CONFIG: ("forward_limit", "forward_ms"), SAMPLE_CONFIG: ("forward_sample_limit", "forward_sample_ms")}


def measure(python: Path, model: Path, *, batch: int, out_len: int, reps: int) -> dict:
    """One in-process engine start timing its full-batch decode steps (offline_worker.py's RESULT)."""
    return worker.run(python, model, {}, batch=batch, out_len=out_len, reps=reps, forward_only=True)


def describe(limit: dict) -> str:
    """One measurement as the report line shows it (the forward+sample limit where it was measured)."""
    line = (f"{limit['forward_limit']:9.0f} tok/s ({limit['forward_ms']:.3f} ms per forward, "
            f"{limit['forward_threads']} thread(s) on cores {limit['forward_cores']})")  # fmt: skip
    if limit.get("forward_sample_limit") is not None:
        line += (f"; {SAMPLE_CONFIG} {limit['forward_sample_limit']:9.0f} tok/s "
                 f"({limit['forward_sample_ms']:.3f} ms per step)")  # fmt: skip
    return line


def summarize(runs: list[dict]) -> dict:
    """Per limit, the median of the forward-only runs' tok/s and ms, and the ms' range; a limit that
    no run measured (the forward+sample limit in older results) is left out."""
    limits = [r for r in runs if r["config"] == CONFIG]
    summary = {}
    for rate, ms in LIMITS.values():
        rates = [r[rate] for r in limits if r.get(rate) is not None]
        times = [r[ms] for r in limits if r.get(ms) is not None]
        if rates:
            summary[rate] = statistics.median(rates)
        if times:
            summary[ms] = statistics.median(times)
            summary[f"{ms}_range"] = [min(times), max(times)]
    return summary


def median_line(summary: dict) -> str:
    """The medians as the subcommand's last line gives them."""
    line = f"median {summary['forward_limit']:.0f} tok/s, {summary['forward_ms']:.3f} ms per forward"
    if "forward_sample_limit" in summary:
        line += (f"; {SAMPLE_CONFIG} {summary['forward_sample_limit']:.0f} tok/s, "
                 f"{summary['forward_sample_ms']:.3f} ms per step")  # fmt: skip
    return line


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
    print(f"\nmodel={args.model} batch={args.batch} build={args.build}: {median_line(summary)}")
    data = results.make("forward-only", arguments=results.arguments(args), runs=runs, summary=summary,
                        python=pythons[builds.OVERLAY])  # fmt: skip
    results.write(data, args.json)
    return 0
