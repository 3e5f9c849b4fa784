"""Runs benchmarks/offline_worker.py inside one build's venv and returns its RESULT line.

offline_worker.py (beside bench.py, run by the venv's own python, as is
benchmarks/worker_forward_timer/) measures `vllm.LLM` decode throughput, or with
forward_only the decode steps' forward alone and with upstream's sampling (the
forward-only and forward+sample limits); see its docstring. The GPU check
(benchmarks/gpu/device_check.py) runs the same file.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from support.engines import engine_env, run_env

from harness.paths import BENCHMARKS

WORKER = BENCHMARKS / "offline_worker.py"
TIMEOUT_S = 3600
# In-process, as the served worker runs its forward: one thread on one core.
_FORWARD_ONLY_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
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
    decode_phase: bool = False,
) -> dict:
    """One engine start: ``reps`` timed generate() calls of ``batch`` prompts, ``out_len`` tokens each."""
    cmd = [python, WORKER, model, json.dumps(kwargs), batch, out_len, reps]
    if worker_forward and not forward_only:
        cmd.append("--worker-forward")
    if decode_phase:
        cmd.append("--decode-phase")
    env = _FORWARD_ONLY_ENV if forward_only else {}
    proc = run_env(*cmd, *(["--forward-only"] if forward_only else []), timeout=TIMEOUT_S, extra_env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-4000:])
    return json.loads(line[len("RESULT ") :])


class Served:
    """One engine kept up (offline_worker.py --serve) so that several can take turns:
    `measure()` runs one timed generate() and returns its result's fields.

    Starting one blocks until its engine is up and warm; `close()` (or the `with`
    block's end) stops it. Its log goes to a temporary file, quoted when it fails.
    """

    def __init__(self, python: Path, model: Path, kwargs: dict, *, batch: int, out_len: int,
                 forward_only: bool = False, decode_phase: bool = False) -> None:  # fmt: skip
        cmd = [python, WORKER, model, json.dumps(kwargs), batch, out_len, 1, "--serve"]
        cmd += (["--forward-only"] if forward_only else []) + (["--decode-phase"] if decode_phase else [])
        self._log = tempfile.TemporaryFile(mode="w+")
        env = engine_env(_FORWARD_ONLY_ENV if forward_only else None)
        self._proc = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, text=True, env=env)  # fmt: skip
        self._read("READY")

    def measure(self) -> dict:
        self._proc.stdin.write("run\n")
        self._proc.stdin.flush()
        return json.loads(self._read("RATE "))

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self, prefix: str) -> str:
        """The rest of the next stdout line starting with `prefix` (vLLM logs to stdout too)."""
        for line in self._proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        self._proc.wait()
        self._log.seek(0)
        log = self._log.read()[-4000:]
        self._log.close()
        raise RuntimeError(f"engine exited ({self._proc.returncode}) before {prefix.strip()!r}:\n{log}")
