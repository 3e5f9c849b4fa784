"""Upstream vs overlay, side by side in one run: `vllm bench serve` against each server.

Each build serves the same locally built model in turn (never both at once,
so they do not share the 2 cores), and `vllm bench serve` (random dataset,
--ignore-eos) measures output tokens/s, TTFT, TPOT and ITL. Builds alternate
A B A B ... for --rounds rounds; the report gives per-build medians and the
overlay/upstream ratios, since absolute numbers on a shared machine are noisy.
Each run also reports the cores in use while the requests ran (cpu_use.py):
the whole machine, each server process, and the rest (mostly the client); and
the engine's own mean queue time, scheduled-to-first-token time and TTFT
(its /metrics histograms).

Usage (from the repo root, after `python3 apply.py test` created the venvs,
or it creates them):
  .tool-venv/bin/python benchmarks/serve_ab.py --model tiny --rounds 3
  .tool-venv/bin/python benchmarks/serve_ab.py --model big --rounds 2 --num-prompts 32
Extra server flags for the overlay only: --overlay-args="--no-async-scheduling".
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from cpu_use import CpuMonitor  # noqa: E402
from support.engines import Server, run_env  # noqa: E402
from support.venvs import vllm_venv  # noqa: E402

from overlay import lock as lockmod  # noqa: E402
from overlay.fetch import Cache, fetch_artifact  # noqa: E402

MODELS = {
    # overhead-bound: 2 layers, hidden 128 (~0.4 M parameters)
    "tiny": ["--arch", "llama"],
    # forward-bound: 16 layers, hidden 1024 (~270 M parameters, float32)
    "big": ["--arch", "llama", "--hidden-size", "1024", "--layers", "16", "--heads", "16", "--kv-heads", "4",
            "--intermediate", "4096", "--init-std", "0.05"],
}  # fmt: skip
# Engine-side histograms (seconds) read from /metrics after each run: queue time (arrival to
# first schedule), prefill time (first schedule to first token), the engine's TTFT.
SERVER_HISTOGRAMS = ["request_queue_time_seconds", "request_prefill_time_seconds", "time_to_first_token_seconds"]
METRICS = ["output_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms"]


def venvs() -> dict[str, Path]:
    dist = ROOT / "build" / "test-dist"
    cmd = [sys.executable, ROOT / "apply.py", "build", "--target", "cpu", "-q", "--json", "--dist", dist]
    build = subprocess.run(cmd, capture_output=True, text=True, check=True)
    overlay_wheel = Path(json.loads(build.stdout)["wheel"])
    upstream_wheel = fetch_artifact(lockmod.load(ROOT / "upstream.lock").wheel("cpu"), Cache.locate(None), quiet=True)
    return {
        "upstream": vllm_venv(ROOT / "build" / "venvs" / "upstream", upstream_wheel),
        "overlay": vllm_venv(ROOT / "build" / "venvs" / "overlay", overlay_wheel),
    }


def build_model(python: Path, name: str) -> Path:
    out = ROOT / "build" / "models" / f"bench-{name}"
    subprocess.run([python, str(ROOT / "tests/support/tiny_model.py"), str(out), *MODELS[name]], check=True)
    return out


def _serve_and_bench(build: str, python: Path, overlay_python: Path, model: Path, args, tmp: Path) -> dict:
    common = [model, "--dtype", "float32", "--max-model-len", "1024", "--served-model-name", "m", "--seed", "0"]
    if build == "upstream":  # the upstream CPU wheel's `vllm` command cannot start
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", *common]
    else:
        cmd = [python.parent / "vllm", "serve", *common, *shlex.split(args.overlay_args)]
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
                "--seed", "0", "--save-result", "--result-dir", tmp, "--result-filename", result.name, timeout=3600,
            )  # fmt: skip
        if bench.returncode != 0:
            raise RuntimeError(bench.stdout[-3000:] + bench.stderr[-3000:])
        res = json.loads(result.read_text())
        return res | {"cpu": cpu.usage(res["duration"]), "server_ms": _server_side_means(server)}  # request phase
    finally:
        server.stop()


def _server_side_means(server: Server) -> dict[str, float]:
    """The engine's own per-request histograms (mean ms): where a TTFT went inside the server."""
    means = {}
    for name in SERVER_HISTOGRAMS:
        count = server.metric(f"vllm:{name}_count")
        means[name] = round(1000 * server.metric(f"vllm:{name}_sum") / count, 2) if count else float("nan")
    return means


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, default="tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--request-rate", default="inf")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--overlay-args", default="", help="extra `vllm serve` flags for the overlay")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()

    pythons = venvs()
    model = build_model(pythons["upstream"], args.model)
    runs: dict[str, list[dict]] = {"upstream": [], "overlay": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for build in ("upstream", "overlay") if r % 2 == 0 else ("overlay", "upstream"):
                res = _serve_and_bench(build, pythons[build], pythons["overlay"], model, args, Path(tmp))
                runs[build].append({k: res[k] for k in METRICS} | {"cpu": res["cpu"], "server_ms": res["server_ms"]})
                print(f"round {r + 1} {build:8}: " + "  ".join(f"{k}={res[k]:.2f}" for k in METRICS), flush=True)
                print(f"    cores used: {json.dumps(res['cpu'])}", flush=True)
                print(f"    server-side means (ms): {json.dumps(res['server_ms'])}", flush=True)
    med = {b: {k: statistics.median(run[k] for run in rs) for k in METRICS} for b, rs in runs.items()}
    print(f"\nmodel={args.model} prompts={args.num_prompts} concurrency={args.concurrency} "
          f"in={args.input_len} out={args.output_len} rate={args.request_rate} rounds={args.rounds}")  # fmt: skip
    print(f"{'metric':18} {'upstream':>10} {'overlay':>10} {'overlay/upstream':>17}")
    for k in METRICS:
        up, ours = med["upstream"][k], med["overlay"][k]
        print(f"{k:18} {up:10.2f} {ours:10.2f} {ours / up:17.3f}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
