"""Where the worker's (or engine core's) wall time goes during offline decode: a sampling profile.

Runs benchmarks/offline_worker.py (tiny model, batch 32, 256 greedy tokens,
many timed runs) in one build's venv, attaches py-spy to the worker process
(--process engine-core: the engine core) once the engine is up, samples its
main thread for --seconds (idle samples included, so the shares are of wall
time; helper threads left out), and sorts every sample into one bucket by the
frames on its stack (BUCKETS or ENGINE_CORE_BUCKETS, first match wins).
Shares are ratios within one run, so they move far less between runs than
tokens/s on this machine (docs/benchmarks.md gives the spread measured).

  .tool-venv/bin/python benchmarks/bench.py profile --build overlay --kwargs '{"num_scheduler_steps": 8}'
  .tool-venv/bin/python benchmarks/bench.py profile --build upstream --kwargs '{}'
  .tool-venv/bin/python benchmarks/bench.py profile --process engine-core --build overlay --kwargs '{}'

Needs py-spy (PyPI, a sampling profiler for Python processes): installed into
the venv running bench.py (the tool venv, as above) on first use.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from support.engines import engine_env

from harness import builds, results, worker

HELP = "where a process's wall time goes during offline decode: a py-spy sampling profile"

# (bucket, frame markers): a sample goes to the first bucket one of whose
# markers appears in one of its frames.
BUCKETS = [
    # Model Runner V1 names, then Model Runner V2's (vLLM 0.34.0: the standalone CPU runner, whose forward
    # is a call of the model inside execute_model, so its model's own forward frame marks it).
    ("model forward", ["GPUModelRunner._model_forward ", ".forward (vllm/model_executor/models/"]),
    ("logits", [".compute_logits "]),
    ("sampling (Sampler)", ["GPUModelRunner._sample ", "CPUSampler.__call__ ", "postprocess_sampled "]),
    ("runner: sample_tokens bookkeeping", ["GPUModelRunner._bookkeeping_sync "]),
    ("runner: attention metadata", ["GPUModelRunner._build_attention_metadata ", "ModelState.prepare_attn ",
                                    "ModelRunner.prepare_attn "]),
    ("runner: rest of a full step (input preparation)", ["GPUModelRunner.execute_model ",
                                                         "StandaloneCPUModelRunner.execute_model "]),
    ("runner: rest of sample_tokens", ["GPUModelRunner.sample_tokens ", "StandaloneCPUModelRunner.sample_tokens "]),
    ("overlay: window and lean-step code", ["window.py:", "lean_step.py:", "device_window.py:", "spec_window.py:",
                                            "inner_steps.py:", "window_requests.py:", "kept_batch.py:"]),
    ("sending the output to the engine core", ["WorkerProc.handle_output ", "WorkerProc.enqueue_output "]),
    ("other work in an RPC", ["WorkerProc._execute_worker_rpc "]),
    ("waiting for the next step (queue read)", ["MessageQueue.dequeue ", "WorkerProc.worker_busy_loop "]),
]  # fmt: skip
# The engine core's main thread (--process engine-core): schedule, hand the step
# to the worker, wait for its output, update the scheduler, move requests in and
# outputs out.
ENGINE_CORE_BUCKETS = [
    ("scheduler: schedule()", ["Scheduler.schedule "]),
    ("scheduler: update_from_output()", ["Scheduler.update_from_output "]),
    ("waiting for the worker's output", ["Future.result ", "MessageQueue.dequeue "]),
    (
        "sending the step to the worker",
        ["MultiprocExecutor.execute_model ", "MultiprocExecutor.sample_tokens ", "MultiprocExecutor.collective_rpc "],
    ),
    ("input queue (requests in, idle wait)", ["._process_input_queue "]),
    ("rest of an engine step", ["._process_engine_step "]),
]
# pgrep -x matches the kernel's process name, cut at 15 characters ("VLLM::EngineCore" reads "VLLM::EngineCor").
PROCESSES = {"worker": ("VLLM::Worker", BUCKETS), "engine-core": ("VLLM::EngineCor", ENGINE_CORE_BUCKETS)}


def _py_spy() -> str:
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=True)
        found = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    assert found, "py-spy did not install"
    return found


def _process_pid(log: Path, session: int, deadline: float, name: str) -> int:
    while time.monotonic() < deadline:
        if "init engine" in log.read_text(errors="replace"):
            found = subprocess.run(["pgrep", "-s", str(session), "-x", name], capture_output=True,
                                   text=True).stdout.split()  # fmt: skip
            if found:
                return int(found[0])
        time.sleep(0.5)
    raise RuntimeError("the engine did not start:\n" + log.read_text(errors="replace")[-3000:])


def classify(raw: Path, buckets_by_marker: list = BUCKETS) -> tuple[Counter, int]:
    buckets: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "spawn_main" not in stack:
            continue  # not the main thread (ZMQ, gloo and other helper threads)
        n = int(count)
        total += n
        name = next((b for b, marks in buckets_by_marker if any(m in stack for m in marks)), "unclassified")
        buckets[name] += n
    return buckets, total


def summarize(runs: list[dict]) -> dict:
    """The share of each bucket: of the one run, or the mean over the runs of each variant."""
    variants = list(dict.fromkeys(r.get("variant") for r in runs))
    means = {}
    for variant in variants:
        shares = [r["share"] for r in runs if r.get("variant") == variant]
        buckets = list(dict.fromkeys(b for s in shares for b in s))
        means[variant] = {b: round(sum(s.get(b, 0.0) for s in shares) / len(shares), 4) for b in buckets}
    if variants == [None]:
        return {"share": means[None], "samples": sum(r["samples"] for r in runs)}
    return {"mean_share": means}


def add_arguments(ap) -> None:
    ap.add_argument("--build", choices=builds.BUILDS, default=builds.OVERLAY)
    ap.add_argument("--kwargs", default='{"num_scheduler_steps": 8}', help="LLM(...) keyword arguments, JSON")
    ap.add_argument("--process", choices=PROCESSES, default="worker", help="which process's main thread to sample")
    ap.add_argument("--seconds", type=int, default=12)
    ap.add_argument("--rate", type=int, default=250, help="samples per second")
    results.add_json_argument(ap)
    ap.add_argument("--raw", type=Path, help="also keep py-spy's raw stacks here (for line-level reading)")
    ap.add_argument("--from-raw", type=Path,
                    help="sort the stacks of an earlier run's --raw file instead of running (--build, --kwargs and "
                         "--process should say what that run was)")  # fmt: skip


def main(args) -> int:
    pythons = builds.venvs()
    process_name, buckets_by_marker = PROCESSES[args.process]
    if args.from_raw:
        buckets, total = classify(args.from_raw, buckets_by_marker)
    else:
        buckets, total = _record(args, pythons, process_name, buckets_by_marker)
    print(f"{args.build} {args.kwargs}: {total} samples of the {args.process}'s main thread")
    for name, n in buckets.most_common():
        print(f"  {100 * n / total:5.1f}%  {name}")
    share = {k: round(v / total, 4) for k, v in buckets.most_common()}
    runs = [{"build": args.build, "kwargs": json.loads(args.kwargs), "process": args.process, "samples": total,
             "share": share}]  # fmt: skip
    data = results.make("profile", arguments=results.arguments(args), runs=runs, summary=summarize(runs),
                        python=pythons[builds.OVERLAY])  # fmt: skip
    results.write(data, args.json)
    return 0


def _record(args, pythons: dict, process_name: str, buckets_by_marker: list) -> tuple[Counter, int]:
    """Run the offline decode in one build and sample one of its processes with py-spy."""
    python, model = pythons[args.build], builds.build_model(pythons[builds.UPSTREAM], "tiny")
    spy = _py_spy()
    with tempfile.TemporaryDirectory() as tmp:
        log, raw = Path(tmp) / "run.log", Path(tmp) / "main-thread.raw"
        cmd = [python, worker.WORKER, model, args.kwargs, "32", "256", "200"]
        with log.open("w") as out:
            run = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                                   env=engine_env(), start_new_session=True)  # fmt: skip
        try:
            pid = _process_pid(log, run.pid, time.monotonic() + 300, process_name)
            time.sleep(3)  # past the warm-up generate()
            subprocess.run([spy, "record", "--pid", str(pid), "--rate", str(args.rate), "--duration",
                            str(args.seconds), "--idle", "--nonblocking", "--format", "raw", "--output", raw],
                           check=True, capture_output=True)  # fmt: skip
        finally:
            os.killpg(run.pid, signal.SIGKILL)  # the engine core and worker too
            run.wait()
        if args.raw:
            shutil.copyfile(raw, args.raw)
        return classify(raw, buckets_by_marker)
