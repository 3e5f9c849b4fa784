"""Runs benchmarks/offline_worker.py inside one build's venv and returns its RESULT line.

offline_worker.py (beside bench.py, run by the venv's own python, as is
benchmarks/worker_forward_timer/) measures `vllm.LLM` decode throughput, or with
forward_only the model's forward alone; see its docstring. The GPU check
(benchmarks/gpu/device_check.py) runs the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.engines import run_env

from harness.paths import BENCHMARKS

WORKER = BENCHMARKS / "offline_worker.py"
TIMEOUT_S = 3600
REPS_HELP = "timed generate() calls per engine start"


def run(
    python: Path,
    model: Path,
    kwargs: dict,
    *,
    batch: int,
    out_len: int,
    reps: int,
    worker_forward: bool = False,
    forward_only: bool = False,
) -> dict:
    """One engine start: ``reps`` timed generate() calls of ``batch`` prompts, ``out_len`` tokens each."""
    cmd = [python, WORKER, model, json.dumps(kwargs), batch, out_len, reps]
    if worker_forward and not forward_only:
        cmd.append("--worker-forward")
    # In-process, as the served worker runs its forward: one thread on one core.
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"} if forward_only else {}
    proc = run_env(*cmd, *(["--forward-only"] if forward_only else []), timeout=TIMEOUT_S, extra_env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-4000:])
    return json.loads(line[len("RESULT ") :])
