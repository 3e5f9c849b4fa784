"""Fixtures for tests on the real pin: the built CPU wheel, venvs, a tiny model.

These need the pinned artifacts (fetched once into the tool's cache) and
install vLLM into two venvs under build/venvs: the unpatched upstream wheel
(the oracle) and the overlay wheel.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SUPPORT = ROOT / "tests" / "support"

from support.venvs import vllm_venv  # noqa: E402

from overlay import lock as lockmod  # noqa: E402
from overlay.fetch import Cache, fetch_artifact  # noqa: E402


@pytest.fixture(scope="session")
def lock():
    return lockmod.load(ROOT / "upstream.lock")


@pytest.fixture(scope="session")
def upstream_wheel(lock) -> Path:
    return fetch_artifact(lock.wheel("cpu"), Cache.locate(None), quiet=True)


@pytest.fixture(scope="session")
def overlay_wheel() -> Path:
    dist = BUILD / "test-dist"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "apply.py"), "build", "--target", "cpu", "--dist", str(dist), "--json", "-q"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(json.loads(proc.stdout)["wheel"])


@pytest.fixture(scope="session")
def upstream_python(upstream_wheel) -> Path:
    return vllm_venv(BUILD / "venvs" / "upstream", upstream_wheel)


@pytest.fixture(scope="session")
def overlay_python(overlay_wheel) -> Path:
    return vllm_venv(BUILD / "venvs" / "overlay", overlay_wheel)


def _tiny_model(python: Path, arch: str) -> Path:
    out = BUILD / "models" / f"tiny-{arch}"
    subprocess.run([python, str(SUPPORT / "tiny_model.py"), str(out), "--arch", arch], check=True)
    return out


@pytest.fixture(scope="session")
def tiny_llama(upstream_python) -> Path:
    return _tiny_model(upstream_python, "llama")


@pytest.fixture(scope="session")
def tiny_qwen3(upstream_python) -> Path:
    return _tiny_model(upstream_python, "qwen3")
