"""Multi-step decode, offline: upstream vs overlay with N scheduler steps, in one run.

Each configuration runs `vllm.LLM` in its own process (never two at once) on
the same locally built model: BATCH prompts decoding OUT_LEN tokens each
(greedy, ignore_eos). Configurations alternate order every round; the report
gives median output tokens/s per configuration, the ratio to upstream, and the
forward-only limit (the model's decode forward alone on the same batch, timed
in-process), with each configuration's distance from it. --worker-forward also
times the forward inside each configuration's served worker (see
benchmarks/worker_forward_timer) and reports its median beside the in-process
one: the share of a decode step (BATCH tokens / tokens/s) that is the forward.
--plot writes a PNG of tokens/s against N (needs matplotlib in the running Python).

  .tool-venv/bin/python benchmarks/multi_step_ab.py --model tiny --rounds 3
  .tool-venv/bin/python benchmarks/multi_step_ab.py --model big --rounds 2 --out-len 64 --steps 1 8
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from serve_ab import MODELS, ROOT, build_model, venvs
from support.engines import run_env

WORKER = ROOT / "benchmarks" / "offline_worker.py"


def _run(python: Path, model: Path, kwargs: dict, args, forward_only: bool = False) -> dict:
    cmd = [python, WORKER, model, json.dumps(kwargs), args.batch, args.out_len, args.reps]
    if args.worker_forward and not forward_only:
        cmd.append("--worker-forward")
    # In-process, as the served worker runs its forward: one thread on one core.
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"} if forward_only else {}
    proc = run_env(*cmd, *(["--forward-only"] if forward_only else []), timeout=3600, extra_env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-4000:])
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, default="tiny")
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3, help="timed generate() calls per engine start")
    ap.add_argument("--no-async", action="store_true", help="overlay with --no-async-scheduling")
    ap.add_argument("--worker-forward", action="store_true", help="also time the forward inside each served worker")
    ap.add_argument("--plot", type=Path, help="write a PNG of tokens/s against N")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()

    pythons = venvs()
    model = build_model(pythons["upstream"], args.model)
    configs = {"upstream": (pythons["upstream"], {})}
    for n in args.steps:
        kwargs = {"num_scheduler_steps": n} | ({"async_scheduling": False} if args.no_async else {})
        configs[f"overlay N={n}"] = (pythons["overlay"], kwargs)
    runs: dict[str, list[float]] = {name: [] for name in configs}
    worker_forward: dict[str, list[float]] = {name: [] for name in configs}
    limits, limit_forward_ms = [], []
    names = list(configs)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            python, kwargs = configs[name]
            result = _run(python, model, kwargs, args)
            runs[name].append(result["median"])
            forward = ""
            if args.worker_forward:
                worker_forward[name].append(result["worker_forward_ms"])
                forward = f", forward in its worker {result['worker_forward_ms']:.3f} ms"
            print(f"round {r + 1} {name:14} {runs[name][-1]:9.0f} tok/s{forward}", flush=True)
        limit = _run(pythons["upstream"], model, {}, args, forward_only=True)
        limits.append(limit["forward_limit"])
        limit_forward_ms.append(limit["forward_ms"])
        print(f"round {r + 1} forward-only   {limits[-1]:9.0f} tok/s ({limit['forward_ms']:.3f} ms per forward, "
              f"{limit['forward_threads']} thread(s) on cores {limit['forward_cores']})")  # fmt: skip
    med = {name: statistics.median(v) for name, v in runs.items()}
    limit = statistics.median(limits)
    print(f"\nmodel={args.model} batch={args.batch} out_len={args.out_len} rounds={args.rounds} "
          f"async={'off' if args.no_async else 'on'} (overlay)")  # fmt: skip
    print(f"{'config':14} {'tok/s':>9} {'vs upstream':>12} {'limit/this':>11}"
          + (f" {'worker fwd ms':>14} {'fwd share':>10}" if args.worker_forward else ""))  # fmt: skip
    for name, value in med.items():
        row = f"{name:14} {value:9.0f} {value / med['upstream']:11.2f}x {limit / value:10.2f}x"
        if args.worker_forward:
            forward_ms = statistics.median(worker_forward[name])
            # A decode step's wall time at this throughput: BATCH tokens.
            row += f" {forward_ms:14.3f} {forward_ms / (1000 * args.batch / value):9.0%}"
        print(row)
    row = f"{'forward-only':14} {limit:9.0f} {limit / med['upstream']:11.2f}x {1:10.2f}x"
    if args.worker_forward:  # in-process: the physical limit's own forward
        row += f" {statistics.median(limit_forward_ms):14.3f} {1:9.0%}"
    print(row)
    if args.json:
        raw = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "forward_limit": limits}
        if args.worker_forward:
            raw["worker_forward_ms"] = worker_forward
        args.json.write_text(json.dumps(raw, indent=2))
    if args.plot:
        _plot(args, med, limit)


def _plot(args, med: dict[str, float], limit: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(args.steps, [med[f"overlay N={n}"] for n in args.steps], "o-", label="overlay, N scheduler steps")
    ax.axhline(med["upstream"], color="gray", linestyle="--", label="upstream vLLM 0.32.0")
    ax.axhline(limit, color="black", linestyle=":", label="forward-only limit")
    ax.set_xscale("log", base=2)
    ax.set_xticks(args.steps, [str(n) for n in args.steps])
    ax.set_xlabel("--num-scheduler-steps N")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{args.model} model, batch {args.batch} decode (CPU, 2 cores)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=100)


if __name__ == "__main__":
    main()
