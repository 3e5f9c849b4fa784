"""Fixtures for tests on the real pin: the built CPU wheel, venvs, a tiny model.

These need the pinned artifacts (fetched once into the tool's cache) and
install vLLM into two venvs under build/venvs: the unpatched upstream wheel
(the oracle) and the overlay wheel.
"""

import os
from pathlib import Path

import pytest
from support.cpu_bases import venv_for
from support.venvs import (
    INTERPRETER,
    RELEASE_ENV,
    release_has_windows,
    release_under_test,
    tiny_model,
    venv_dir,
    vllm_venv,
    windows_runner,
)
from support.venvs import overlay_wheel as build_overlay_wheel
from support.venvs import upstream_wheel as fetch_upstream_wheel

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"


def pytest_collection_modifyitems(config, items):
    """In the suite's run (`apply.py test`, `-m every_release`) on a kept release other than the
    default CPU one, only the tests marked `kept_release` (the CUDA wheel) run.

    Such a release (0.33.0: kept beside the primary 0.34.0, without a CPU wheel) runs the same
    frozen engine modules the default CPU release (0.32.0) runs the whole suite on; its series
    check runs there too (test_series_real.py checks every release). Its CPU tests (wheel, unit
    tests, parity, on the hybrid base) run by hand: `apply.py test --upstream 0.33.0 tests/real`.
    The CI budget is what this buys (docs/testing.md).
    """
    from overlay import releases

    if not os.environ.get(RELEASE_ENV) or config.getoption("-m") != "every_release":
        return
    release = release_under_test()
    if release.primary or release.version == releases.select(ROOT, target="cpu").version:
        return
    left = [item for item in items if not item.get_closest_marker("kept_release")]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if item.get_closest_marker("kept_release")]


@pytest.fixture(scope="session")
def lock():
    return release_under_test().lock()


@pytest.fixture(scope="session")
def windows():
    """Skips a test of multi-step windows on a release that has none (every supported release
    has them today: Model Runner V1 up to 0.33.0, Model Runner V2 from 0.34.0 on)."""
    if not release_has_windows():
        pytest.skip(f"vLLM {release_under_test().version} has no multi-step windows")


@pytest.fixture(scope="session")
def drafts_in_windows(windows):
    """Skips a test of speculative decoding inside windows where they do not run it (on Model
    Runner V2 they refuse drafts at startup: test_multi_step_refused.py checks the refusal)."""
    if windows_runner() != "v1":
        pytest.skip(f"vLLM {release_under_test().version}: windows with drafts run on Model Runner V1 only")


@pytest.fixture(scope="session")
def upstream_wheel() -> Path:
    return fetch_upstream_wheel()


@pytest.fixture(scope="session")
def overlay_wheel() -> Path:
    return build_overlay_wheel()


@pytest.fixture(scope="session")
def interpreter_pythons() -> dict[str, Path]:
    """Both builds on the interpreter base (Model Runner V2's own code, its Triton kernels
    interpreted), for a release whose x86 CPU backend needs triton-cpu; skips elsewhere."""
    from packaging.version import Version
    from support.cpu_bases import TRITON_CPU_FROM

    release = release_under_test()
    if Version(release.version) < Version(TRITON_CPU_FROM):
        pytest.skip(f"vLLM {release.version} runs no Model Runner V2 on CPU without triton-cpu: no interpreter base")
    return {
        "upstream": venv_for(fetch_upstream_wheel(INTERPRETER), venv_dir("upstream", INTERPRETER)),
        "overlay": vllm_venv(venv_dir("overlay", INTERPRETER), build_overlay_wheel(INTERPRETER)),
    }


@pytest.fixture(scope="session")
def upstream_python(upstream_wheel) -> Path:
    # a venv that already holds the wheel serves (tests/real/test_cpu_bases.py may have made it)
    return venv_for(upstream_wheel, venv_dir("upstream"))


@pytest.fixture(scope="session")
def overlay_python(overlay_wheel) -> Path:
    return vllm_venv(venv_dir("overlay"), overlay_wheel)


@pytest.fixture(scope="session")
def tiny_llama(upstream_python) -> Path:
    return tiny_model(upstream_python, "llama")


@pytest.fixture(scope="session")
def tiny_qwen3(upstream_python) -> Path:
    return tiny_model(upstream_python, "qwen3")


@pytest.fixture(scope="session")
def models(tiny_llama, tiny_qwen3):
    return {"llama": tiny_llama, "qwen3": tiny_qwen3}


@pytest.fixture(scope="session")
def parity_run(models, upstream_python, overlay_python, tmp_path_factory):
    """parity_run(build, engine, async_mode="default", steps=1) -> outputs.

    Runs an engine of tests/support/parity.py ENGINES on a build; each
    (build, engine, async mode, scheduler steps) starts once per session, so the
    oracle's outputs are shared by every test that compares against them.
    Where the fuzzer's CI slice has the same engine config, its batches run
    after the cases, in the same engine ("batches"). The overlay also runs
    the engine's OVERLAY_CASES, whose outputs come under "overlay_cases". The
    outputs carry the engine's log under "engine_log".
    """
    from support.engines import generate
    from support.parity import ASYNC_MODES, BASE, ENGINES, OVERLAY_CASES

    from overlay.fuzz.ci_slice import slice_batches

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
            extra_cases = OVERLAY_CASES.get(engine, []) if build == "overlay" else []
            job = {"llm": llm, "cases": cases + extra_cases}
            if batches := slice_batches(key):
                job["batches"] = batches
            done[key], log = generate(python, job, tmp, "-".join(map(str, key)), timeout=600 + 30 * len(batches))
            done[key]["engine_log"] = log
            # The overlay-only cases apart, so that "cases" lines up with the oracle's.
            done[key]["overlay_cases"] = done[key]["cases"][len(cases) :]
            done[key]["cases"] = done[key]["cases"][: len(cases)]
        return done[key]

    return _run


@pytest.fixture(scope="session")
def upstream_server(upstream_python, tiny_llama, tmp_path_factory):
    """Upstream's OpenAI server on the tiny Llama: the oracle of every served test, started once."""
    from support.serve_cases import upstream_server as serving

    with serving(upstream_python, tiny_llama, tmp_path_factory.mktemp("upstream-server") / "up.log") as server:
        yield server


@pytest.fixture(scope="session")
def served(upstream_server, overlay_python, tiny_llama, tmp_path_factory):
    """served(*overlay args) -> {"upstream": server, "overlay": server}: a context manager
    starting the overlay's `vllm serve` beside the session's upstream server."""
    from contextlib import contextmanager

    from support.serve_cases import overlay_server

    @contextmanager
    def _pair(*args):
        log = tmp_path_factory.mktemp("overlay-server") / "overlay.log"
        with overlay_server(overlay_python, tiny_llama, log, args) as ours:
            yield {"upstream": upstream_server, "overlay": ours}

    return _pair
