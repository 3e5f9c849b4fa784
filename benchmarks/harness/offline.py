"""Multi-step decode, offline: upstream vs overlay with N scheduler steps, in one run.

Each configuration runs `vllm.LLM` in its own process (one measured at a time) on
the same locally built model: BATCH prompts decoding OUT_LEN tokens each
(greedy, ignore_eos). Configurations alternate order every round; the report
gives median output tokens/s per configuration, the ratio to upstream, and the
forward-only limit (the model's decode forward alone on the same batch, timed
in-process, once per round: see `bench.py forward-only`), with each
configuration's distance from it, and beside it the forward+sample limit of the
same in-process steps (the forward plus upstream's logits and sampler: the floor
of a window that keeps upstream's sampling) and the distance from that, and the
decode phase's own ratio (the
tokens each timed call adds to a 16-token call of the same prompts, timed just
before it, over the time it adds: offline_worker.py). --worker-forward also times the forward
inside each configuration's served worker (see benchmarks/worker_forward_timer)
and reports its median beside the in-process one: the share of a decode step
(BATCH tokens / tokens/s) that is the forward. --plot writes a PNG of tokens/s
against N (needs matplotlib in the running Python).

--interleave keeps every configuration's engine up at once (and the
forward-only one), started one after another, and makes each round one timed
generate() per configuration in turn, the order rotating every round: a
configuration and upstream are then measured seconds apart instead of minutes,
so the host's speed, which drifts by up to 2x over minutes here, moves them
together (docs/benchmarks.md). The idle engines wait beside the one measured
(about 1% of a core each, measured). Use more rounds than without it (each is
one generate() per configuration, not an engine start; --reps is not used).

  .tool-venv/bin/python benchmarks/bench.py offline --model tiny --interleave --rounds 30 --steps 1 8 16

  .tool-venv/bin/python benchmarks/bench.py offline --model tiny --rounds 3
  .tool-venv/bin/python benchmarks/bench.py offline --model big --rounds 2 --out-len 64 --steps 1 8
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

from harness import builds, forward_only, results, worker

HELP = "multi-step decode offline (vllm.LLM): upstream against overlay N = 1, 2, 4, 8"
UPSTREAM = builds.UPSTREAM  # upstream's configuration is the build's name
STEPS_PREFIX = "overlay N="  # then the overlay's configurations: overlay N=1, overlay N=8, ...
# The overlay with every window's inner steps run step by step (no device window), for comparison.
STEP_PATH_PREFIX = "step path N="
STEP_PATH = {"additional_config": {"multi_step_device_window": False}}


def config_name(n: int) -> str:
    return f"{STEPS_PREFIX}{n}"


def summarize(runs: list[dict]) -> dict:
    """Medians per configuration, ratios to upstream (of medians and per round), the limits.

    ``runs``: {"round", "config", "median" (tok/s), ...} per engine run; the configuration
    forward_only.CONFIG holds the in-process measurements ("forward_limit", tok/s, and since the
    forward+sample limit "forward_sample_limit": forward_only.summarize). Other forward-only
    configurations (a superseded measurement) are kept in the runs, left out here. "limit_over"
    is each configuration's distance from the forward-only limit, "forward_sample_limit_over" from
    the forward+sample limit (only where the runs measured it).
    """
    configs = list(dict.fromkeys(r["config"] for r in runs if not r["config"].startswith(forward_only.CONFIG)))
    med = {c: statistics.median(r["median"] for r in runs if r["config"] == c) for c in configs}
    by_round = {(r["round"], r["config"]): r["median"] for r in runs if r["config"] in med}
    limits = forward_only.summarize(runs)
    limit = limits.get("forward_limit")
    per_round = {c: [] for c in configs}
    for (rnd, c), v in by_round.items():
        if (rnd, UPSTREAM) in by_round:
            per_round[c].append(v / by_round[(rnd, UPSTREAM)])
    summary = {
        "median_tok_s": med,
        "vs_upstream": {c: v / med[UPSTREAM] for c, v in med.items()},
        "per_round_vs_upstream": per_round,
        "forward_limit": limit,
        "limit_over": {c: limit / v for c, v in med.items()} if limit else {},
    }
    if "forward_sample_limit" in limits:
        sample_limit = summary["forward_sample_limit"] = limits["forward_sample_limit"]
        summary["forward_sample_limit_over"] = {c: sample_limit / v for c, v in med.items()}
    forward = {c: [r["worker_forward_ms"] for r in runs if r["config"] == c and r.get("worker_forward_ms")]
               for c in configs}  # fmt: skip
    if any(forward.values()):
        summary["worker_forward_ms"] = {c: statistics.median(v) for c, v in forward.items() if v}
    decode = {c: [r["decode_median"] for r in runs if r["config"] == c and "decode_median" in r] for c in configs}
    if all(decode.values()):  # results from before the decode phase was timed have none
        decode_med = {c: statistics.median(v) for c, v in decode.items()}
        summary["decode_median_tok_s"] = decode_med
        summary["decode_vs_upstream"] = {c: v / decode_med[UPSTREAM] for c, v in decode_med.items()}
    for ms in ("forward_ms", "forward_sample_ms"):  # in-process, a step's
        if ms in limits:
            summary[ms] = limits[ms]
    return summary


def add_arguments(ap) -> None:
    ap.add_argument("--model", choices=builds.MODEL_ARGS, default="tiny")
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument(
        "--step-path",
        type=int,
        nargs="*",
        default=[],
        metavar="N",
        help="also the overlay at these N with the device window off (inner steps step by step)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3, help=worker.REPS_HELP)
    ap.add_argument("--no-async", action="store_true", help="overlay with --no-async-scheduling")
    ap.add_argument("--worker-forward", action="store_true", help="also time the forward inside each served worker")
    ap.add_argument("--interleave", action="store_true",
                    help="every engine up at once, one generate() each in turn per round (see above)")  # fmt: skip
    ap.add_argument("--plot", type=Path, help="write a PNG of tokens/s against N")
    results.add_json_argument(ap)


def main(args) -> int:
    pythons = builds.venvs()
    model = builds.build_model(pythons[builds.UPSTREAM], args.model)
    configs = {UPSTREAM: (pythons[builds.UPSTREAM], {})}
    overlay = [(config_name(n), n, {}) for n in args.steps]
    overlay += [(f"{STEP_PATH_PREFIX}{n}", n, STEP_PATH) for n in args.step_path]
    for name, n, extra in overlay:
        kwargs = {"num_scheduler_steps": n} | extra | ({"async_scheduling": False} if args.no_async else {})
        configs[name] = (pythons[builds.OVERLAY], kwargs)
    if args.interleave and args.worker_forward:
        raise SystemExit("--interleave does not time the worker's forward (--worker-forward): one or the other")
    measure = _interleaved if args.interleave else _one_engine_each
    runs = measure(configs, pythons[builds.UPSTREAM], model, args)
    summary = summarize(runs)
    print(f"\nmodel={args.model} batch={args.batch} out_len={args.out_len} rounds={args.rounds} "
          f"async={'off' if args.no_async else 'on'} (overlay)")  # fmt: skip
    print("\n".join(report_lines(summary, batch=args.batch, worker_forward=args.worker_forward)))
    data = results.make("offline", arguments=results.arguments(args), runs=runs, summary=summary,
                        python=pythons[builds.OVERLAY])  # fmt: skip
    results.write(data, args.json)
    if args.plot:
        plot(data, args.plot)
    return 0


# Each limit's column in the report: the distance of a row's tok/s from it.
LIMIT_COLUMNS = {forward_only.CONFIG: "limit/this", forward_only.SAMPLE_CONFIG: "fwd+smp limit/this"}


def report_lines(summary: dict, *, batch: int, worker_forward: bool = False) -> list[str]:
    """The report's table: a header, then a row per configuration and per limit, a limit's column
    and row only where the summary has it (the forward+sample limit: not in results from before it)."""
    med = summary["median_tok_s"]
    limits = {name: summary[rate] for name, (rate, _) in forward_only.LIMITS.items() if summary.get(rate)}
    decode = summary.get("decode_vs_upstream", {})
    header = f"{'config':16} {'tok/s':>9} {'vs upstream':>12}"
    header += "".join(f" {LIMIT_COLUMNS[name]:>{max(11, len(LIMIT_COLUMNS[name]) + 1)}}" for name in limits)
    header += f" {'decode phase':>13}" if decode else ""
    header += f" {'worker fwd ms':>14} {'fwd share':>10}" if worker_forward else ""
    lines = [header]
    for name, value in (med | limits).items():
        row = f"{name:16} {value:9.0f} {value / med[UPSTREAM]:11.2f}x"
        row += "".join(f" {limit / value:{max(10, len(LIMIT_COLUMNS[n]))}.2f}x" for n, limit in limits.items())
        if decode:
            row += f" {decode[name]:12.2f}x" if name in decode else f" {'':13}"
        if worker_forward:  # the limits' forward is the in-process one
            in_limit = name in forward_only.LIMITS
            forward_ms = summary.get("forward_ms") if in_limit else summary.get("worker_forward_ms", {}).get(name)
            forward_ms = float("nan") if forward_ms is None else forward_ms
            # A decode step's wall time at this throughput: BATCH tokens.
            row += f" {forward_ms:14.3f} {forward_ms / (1000 * batch / value):9.0%}"
        lines.append(row.rstrip())
    return lines


def _one_engine_each(configs: dict, upstream: Path, model: Path, args) -> list[dict]:
    """Each round, one engine start per configuration (REPS generate() calls), then the forward-only limit."""
    shape = {"batch": args.batch, "out_len": args.out_len, "reps": args.reps}
    runs: list[dict] = []
    names = list(configs)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            python, kwargs = configs[name]
            result = worker.run(python, model, kwargs, **shape, worker_forward=args.worker_forward, decode_phase=True)
            runs.append({"round": r + 1, "config": name, **result})
            forward = ""
            if args.worker_forward:
                forward = f", forward in its worker {result['worker_forward_ms']:.3f} ms"
            print(f"round {r + 1} {name:14} {result['median']:9.0f} tok/s{forward}", flush=True)
        limit = forward_only.measure(upstream, model, **shape)
        runs.append({"round": r + 1, "config": forward_only.CONFIG, **limit})
        print(f"round {r + 1} forward-only   {forward_only.describe(limit)}")
    return runs


def _interleaved(configs: dict, upstream: Path, model: Path, args) -> list[dict]:
    """Every engine up at once; each round one generate() per configuration and one forward-only
    measurement, in an order that rotates every round (see the docstring)."""
    shape = {"batch": args.batch, "out_len": args.out_len}
    runs: list[dict] = []
    with contextlib.ExitStack() as stack:
        engines = {}
        for name, (python, kwargs) in configs.items():
            engines[name] = stack.enter_context(worker.Served(python, model, kwargs, **shape, decode_phase=True))
            print(f"{name} up", flush=True)
        engines[forward_only.CONFIG] = stack.enter_context(
            worker.Served(upstream, model, {}, **shape, forward_only=True)
        )
        names = list(engines)
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                result = engines[name].measure()
                runs.append({"round": r + 1, "config": name, **result})
                limit = name == forward_only.CONFIG
                shown = forward_only.describe(result) if limit else f"{result['median']:9.0f} tok/s"
                print(f"round {r + 1} {name:14} {shown}", flush=True)
    return runs


def plot(result: dict, out: Path) -> None:
    """PNG of an offline result: tokens/s of each overlay N, upstream's and the limits as lines (the
    forward+sample limit where the result has it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, arguments = result["summary"], result["arguments"]
    med, limit = summary["median_tok_s"], summary["forward_limit"]
    steps = sorted(int(name.removeprefix(STEPS_PREFIX)) for name in med if name.startswith(STEPS_PREFIX))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(steps, [med[config_name(n)] for n in steps], "o-", label="overlay, N scheduler steps")
    version = result["upstream"]["version"] or ""
    ax.axhline(med[UPSTREAM], color="gray", linestyle="--", label=f"upstream vLLM {version}".strip())
    ax.axhline(limit, color="black", linestyle=":", label="forward-only limit")
    if summary.get("forward_sample_limit"):
        ax.axhline(summary["forward_sample_limit"], color="black", linestyle="-.", label="forward+sample limit")
    ax.set_xscale("log", base=2)
    ax.set_xticks(steps, [str(n) for n in steps])
    ax.set_xlabel("--num-scheduler-steps N")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{arguments['model']} model, batch {arguments['batch']} decode (CPU, 2 cores)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
