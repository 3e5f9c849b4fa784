"""Upstream vs overlay, side by side in one run: `vllm bench serve` against each server.

Each build serves the same locally built model in turn (never both at once,
so they do not share the 2 cores), and `vllm bench serve` (random dataset,
--ignore-eos) measures output tokens/s, TTFT, TPOT and ITL. Builds alternate
A B A B ... for --rounds rounds; the report gives per-build medians and the
overlay/upstream ratios, since absolute numbers on a shared machine are noisy.
Each run also reports the cores in use while the requests ran (harness/cpu_use.py):
the whole machine, each server process, and the rest (mostly the client); and
the engine's own mean queue time, scheduled-to-first-token time and TTFT
(its /metrics histograms).

Usage (from the repo root, after `python3 apply.py test` created the venvs,
or it creates them):
  .tool-venv/bin/python benchmarks/bench.py serve --model tiny --rounds 3
  .tool-venv/bin/python benchmarks/bench.py serve --model big --rounds 2 --num-prompts 32
Extra server flags for the overlay only: --overlay-args="--no-async-scheduling".
"""

from __future__ import annotations

import json
import shlex
import statistics
import tempfile
from pathlib import Path

from support.engines import Server, run_env

from harness import builds, results
from harness.cpu_use import CpuMonitor

HELP = "through `vllm serve`: `vllm bench serve` against each build's server in turn"
# Engine-side histograms (seconds) read from /metrics after each run: queue time (arrival to
# first schedule), prefill time (first schedule to first token), the engine's TTFT.
SERVER_HISTOGRAMS = ["request_queue_time_seconds", "request_prefill_time_seconds", "time_to_first_token_seconds"]
METRICS = ["output_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms"]
BENCH_TIMEOUT_S = 3600


def server_command(python: Path, upstream: bool, model: Path, max_model_len: int, args=()) -> list:
    """The command serving ``model`` as "m" from ``python``'s venv: upstream's api_server (the
    upstream CPU wheel's `vllm` command cannot start), else `vllm serve` with ``args``."""
    common = [model, "--dtype", "float32", "--max-model-len", str(max_model_len), "--served-model-name", "m",
              "--seed", "0"]  # fmt: skip
    if upstream:
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", *common]
    return [python.parent / "vllm", "serve", *common, *args]


def serve_and_bench(build: str, python: Path, overlay_python: Path, model: Path, args, tmp: Path) -> dict:
    """Start ``build``'s server, run `vllm bench serve` against it once; its result with CPU use and engine means."""
    cmd = server_command(python, build == builds.UPSTREAM, model, 1024, shlex.split(args.overlay_args))
    server = Server(cmd, tmp / f"{build}.log")
    try:
        server.wait_ready()
        result = tmp / f"{build}.json"
        with CpuMonitor(server.proc.pid) as cpu:
            bench = run_env(
                overlay_python.parent / "vllm", "bench", "serve", "--base-url", server.base, "--model", "m",
                "--tokenizer", model, "--dataset-name", "random", "--random-input-len", str(args.input_len),
                "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
                "--max-concurrency", str(args.concurrency), "--request-rate", args.request_rate, "--ignore-eos",
                "--seed", "0", "--save-result", "--result-dir", tmp, "--result-filename", result.name,
                timeout=BENCH_TIMEOUT_S,
            )  # fmt: skip
        if bench.returncode != 0:
            raise RuntimeError(bench.stdout[-3000:] + bench.stderr[-3000:])
        res = json.loads(result.read_text())
        return res | {"cpu": cpu.usage(res["duration"]), "server_ms": server_side_means(server)}  # request phase
    finally:
        server.stop()


def server_side_means(server: Server) -> dict[str, float]:
    """The engine's own per-request histograms (mean ms): where a TTFT went inside the server."""
    means = {}
    for name in SERVER_HISTOGRAMS:
        count = server.metric(f"vllm:{name}_count")
        means[name] = round(1000 * server.metric(f"vllm:{name}_sum") / count, 2) if count else float("nan")
    return means


def summarize(runs: list[dict]) -> dict:
    """Per-build medians of METRICS, and overlay against upstream (ratio and difference) of each."""
    med = {b: {k: statistics.median(r[k] for r in runs if r["build"] == b) for k in METRICS} for b in builds.BUILDS}
    up, ours = med[builds.UPSTREAM], med[builds.OVERLAY]
    return {
        "median": med,
        "overlay_over_upstream": {k: ours[k] / up[k] for k in METRICS},
        "overlay_minus_upstream": {k: ours[k] - up[k] for k in METRICS},
    }


def add_arguments(ap) -> None:
    ap.add_argument("--model", choices=builds.MODEL_ARGS, default="tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--request-rate", default="inf")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--overlay-args", default="", help="extra `vllm serve` flags for the overlay")
    results.add_json_argument(ap)


def main(args) -> int:
    pythons = builds.venvs()
    model = builds.build_model(pythons[builds.UPSTREAM], args.model)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for build in builds.BUILDS if r % 2 == 0 else builds.BUILDS[::-1]:
                res = serve_and_bench(build, pythons[build], pythons[builds.OVERLAY], model, args, Path(tmp))
                runs.append({"round": r + 1, "build": build, **{k: res[k] for k in METRICS}, "cpu": res["cpu"],
                             "server_ms": res["server_ms"]})  # fmt: skip
                print(f"round {r + 1} {build:8}: " + "  ".join(f"{k}={res[k]:.2f}" for k in METRICS), flush=True)
                print(f"    cores used: {json.dumps(res['cpu'])}", flush=True)
                print(f"    server-side means (ms): {json.dumps(res['server_ms'])}", flush=True)
    summary = summarize(runs)
    med = summary["median"]
    print(f"\nmodel={args.model} prompts={args.num_prompts} concurrency={args.concurrency} "
          f"in={args.input_len} out={args.output_len} rate={args.request_rate} rounds={args.rounds}")  # fmt: skip
    print(f"{'metric':18} {'upstream':>10} {'overlay':>10} {'overlay/upstream':>17}")
    for k in METRICS:
        up, ours = med[builds.UPSTREAM][k], med[builds.OVERLAY][k]
        print(f"{k:18} {up:10.2f} {ours:10.2f} {ours / up:17.3f}")
    data = results.make("serve", arguments=results.arguments(args), runs=runs, summary=summary,
                        python=pythons[builds.OVERLAY])  # fmt: skip
    results.write(data, args.json)
    return 0
