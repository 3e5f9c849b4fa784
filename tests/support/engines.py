"""Run vLLM builds from their venvs, with the environment the tests need."""

import json
import os
import subprocess
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
# Bound CPU KV cache memory; nothing may reach for a model hub.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def run_env(*cmd, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a venv's python or console script first) with the test env."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **VLLM_ENV}, **kw)  # fmt: skip


def generate(python: Path, spec: dict, tmp_path: Path, tag: str) -> tuple[dict, str]:
    """Run tests/support/generate.py in ``python``'s venv; (outputs, log)."""
    spec_file, out_file = tmp_path / f"{tag}-spec.json", tmp_path / f"{tag}-out.json"
    spec_file.write_text(json.dumps(spec))
    proc = run_env(python, SUPPORT / "generate.py", spec_file, out_file, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out_file.read_text()), proc.stdout + proc.stderr
