"""Run vLLM builds from their venvs, with the environment the tests need."""

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
# Bound CPU KV cache memory; nothing may reach for a model hub. VLLM_USE_AOT_COMPILE=0:
# vLLM's torch.compile cache instead of its AOT one, which never loads on the CPU build
# ("'function' object has no attribute 'finalize_loading'": every engine start compiles
# again); the same compiled model, loaded from the cache by later starts of the same
# config: measured 2026-12-01, 65 s against 85-94 s for one engine run. A worker that has not
# exited 1 s after its engine shut down gets SIGTERM (vLLM's default waits 5 s, and on these
# machines the worker never exits on its own within it: 4 s saved per engine, after its outputs).
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "VLLM_USE_AOT_COMPILE": "0", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "1"}  # fmt: skip


def engine_env(extra_env: dict | None = None) -> dict:
    """The environment an engine process runs with: this one's, VLLM_ENV, then ``extra_env``."""
    return {**os.environ, **VLLM_ENV, **(extra_env or {})}


def run_env(*cmd, timeout: int = 600, extra_env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a venv's python or console script first) with the test env."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env=engine_env(extra_env), **kw)  # fmt: skip


def script_result(python: Path, source: str, *args, tmp_path: Path, timeout: int = 600) -> dict:
    """Run the script ``source`` in ``python``'s venv with ``args``; the JSON it prints after
    "RESULT" on one line (the script must exit 0)."""
    script = tmp_path / "script.py"
    script.write_text(source)
    proc = run_env(python, script, *args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1].splitlines()[0])


def generate(python: Path, spec: dict, tmp_path: Path, tag: str, timeout: int = 600) -> tuple[dict, str]:
    """Run ``spec`` with tests/support/generate.py in ``python``'s venv; (outputs, log)."""
    spec_file, out_file, log_file = (tmp_path / f"{tag}-{part}" for part in ("spec.json", "out.json", "log.txt"))
    spec_file.write_text(json.dumps(spec))
    ok = _generator(python).run({"spec": str(spec_file), "out": str(out_file), "log": str(log_file)}, timeout)
    log = log_file.read_text() if log_file.exists() else ""
    assert ok, f"engine run {tag} failed ({log_file}):\n{log[-8000:]}"
    return json.loads(out_file.read_text()), log


# `LLM` runs keep the engine core in the driver process (vLLM's InprocClient), whose own
# process would import vLLM again for every engine; generate.py asks for the multiprocessing
# executor, so the model still runs in its own worker process behind the same queues and
# patches. Measured 2026-12-01, one run of the Llama parity engine with the fuzzer's slice:
# 86 s with the engine core's process, 73 s without, the same outputs. `vllm serve` (the
# served tests) always runs the engine core as its own process.
LLM_ENV = {**VLLM_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


class _Generator:
    """``generate.py --serve`` in one venv, kept for the test session: vLLM is
    imported once for all of that venv's engine runs, not once per run."""

    def __init__(self, python: Path):
        self.proc = subprocess.Popen(
            [str(python), str(SUPPORT / "generate.py"), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, **LLM_ENV}, cwd=python.parent.parent, start_new_session=True,
        )  # fmt: skip

    def run(self, job: dict, timeout: int) -> bool:
        """One job; False if it failed, timed out or the process died (then it is gone)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._gone()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        reply = self.proc.stdout.readline().strip() if ready else ""
        if reply in ("ok", "error"):
            return reply == "ok"
        return self._gone()

    def _gone(self) -> bool:
        """Timed out or died: end it with the engine processes it started (the next job starts anew)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self._gone()


_generators: dict[Path, _Generator] = {}


def _generator(python: Path) -> _Generator:
    if python not in _generators or _generators[python].proc.poll() is not None:
        _generators[python] = _Generator(python)
    return _generators[python]


@atexit.register
def _close_generators() -> None:
    for generator in _generators.values():
        generator.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An OpenAI-compatible vLLM server on 127.0.0.1, logging to a file."""

    def __init__(self, cmd: list, log: Path, extra_env: dict | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(c) for c in cmd] + ["--host", "127.0.0.1", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=engine_env(extra_env),
            )

    def wait_ready(self, timeout: float = 300) -> None:
        import time
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.base + "/health", timeout=2)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"server did not start:\n{self.log.read_text()[-5000:]}") from None
                time.sleep(1)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus metric's samples from /metrics (those with `labels`, where given)."""
        import urllib.request

        text = urllib.request.urlopen(self.base + "/metrics", timeout=10).read().decode()
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") and all(label in line.split("}", 1)[0] for label in wanted)
        ]
        return sum(values)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
