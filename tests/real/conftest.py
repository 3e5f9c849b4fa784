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


@pytest.fixture(scope="session")
def models(tiny_llama, tiny_qwen3):
    return {"llama": tiny_llama, "qwen3": tiny_qwen3}


@pytest.fixture(scope="session")
def parity_run(models, upstream_python, overlay_python, tmp_path_factory):
    """parity_run(build, engine, async_mode="default", steps=1) -> outputs.

    Runs an engine of tests/support/parity.py ENGINES on a build; each
    (build, engine, async mode, scheduler steps) starts once per session, so the
    oracle's outputs are shared by every test that compares against them.
    The outputs carry the engine's log under "engine_log".
    """
    from support.engines import generate
    from support.parity import ASYNC_MODES, BASE, ENGINES

    done: dict[tuple, dict] = {}
    tmp = tmp_path_factory.mktemp("parity")

    def _run(build: str, engine: str, async_mode: str = "default", steps: int = 1) -> dict:
        key = (build, engine, async_mode, steps)
        if key not in done:
            model, extra, cases = ENGINES[engine]
            llm = {**BASE, **extra, "model": str(models[model])}
            if ASYNC_MODES[async_mode] is not None:
                llm["async_scheduling"] = ASYNC_MODES[async_mode]
            if steps != 1:
                assert build == "overlay", "upstream has no multi-step decode"
                llm["num_scheduler_steps"] = steps
            python = upstream_python if build == "upstream" else overlay_python
            done[key], log = generate(python, {"llm": llm, "cases": cases}, tmp, "-".join(map(str, key)))
            done[key]["engine_log"] = log
        return done[key]

    return _run
