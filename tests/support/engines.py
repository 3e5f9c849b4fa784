"""Run vLLM builds from their venvs, with the environment the tests need."""

import json
import os
import subprocess
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
# Bound CPU KV cache memory; nothing may reach for a model hub.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def run_env(*cmd, timeout: int = 600, extra_env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a venv's python or console script first) with the test env."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **VLLM_ENV, **(extra_env or {})}, **kw)  # fmt: skip


def generate(python: Path, spec: dict, tmp_path: Path, tag: str) -> tuple[dict, str]:
    """Run tests/support/generate.py in ``python``'s venv; (outputs, log)."""
    spec_file, out_file = tmp_path / f"{tag}-spec.json", tmp_path / f"{tag}-out.json"
    spec_file.write_text(json.dumps(spec))
    proc = run_env(python, SUPPORT / "generate.py", spec_file, out_file, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out_file.read_text()), proc.stdout + proc.stderr


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An OpenAI-compatible vLLM server on 127.0.0.1, logging to a file."""

    def __init__(self, cmd: list, log: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(c) for c in cmd] + ["--host", "127.0.0.1", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **VLLM_ENV},
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

    def metric(self, name: str) -> float:
        """Sum of a Prometheus metric's samples from /metrics."""
        import urllib.request

        text = urllib.request.urlopen(self.base + "/metrics", timeout=10).read().decode()
        values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
        return sum(values)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
