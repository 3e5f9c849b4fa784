"""vLLM's own CPU-runnable unit tests, from the patched tree, against the overlay build.

tests/upstream_suite/run.sh runs the upstream test files of the code our patches
hook into (scheduler, async scheduler, prefix caching, multiproc executor, shm
broadcast; on 0.32.0 also the V1 input batch and ngram) with the installed vLLM, in
two pytest processes (the distributed tests apart), and with STRICT_COUNTS=1 fails
unless each file passes exactly as many tests as it does on the unpatched release
(per release, in tests/upstream_suite/<version>/expect.txt; the tests that cannot
run here on either build are in deselect.txt beside it). It runs on every supported
release, from that release's patched tree, with upstream's per-test cleanup but not
its whole-heap gc.collect() (tests/upstream_suite/cleanup_without_gc.py: 4-5 min a
release became ~1 min, and the prefix-caching tests, left out for time on
2026-12-02, came back). It also runs our own tests in upstream's style, from
src/tests/ (the files run.sh lists beside upstream's).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import ROOT


@pytest.fixture(scope="module")
def unit_test_python(request, lock) -> Path:
    """The overlay build the unit tests import: from the first release that needs triton-cpu on
    x86 (0.34.0), the one on the interpreter base, where Model Runner V2's config checks pass as
    on a GPU (on the standalone base 53 more of upstream's scheduler tests stop at "The CPU model
    runner without Triton does not yet support: speculative decoding / diffusion models")."""
    from packaging.version import Version
    from support.cpu_bases import TRITON_CPU_FROM

    if Version(lock.version) >= Version(TRITON_CPU_FROM):
        return request.getfixturevalue("interpreter_pythons")["overlay"]
    return request.getfixturevalue("overlay_python")


@pytest.mark.every_release
def test_upstream_unit_tests_pass_on_overlay(unit_test_python, lock, tmp_path):
    overlay_python = unit_test_python
    tree = tmp_path / "tree"
    applied = subprocess.run([sys.executable, str(ROOT / "apply.py"), "apply", "-q", "--upstream", lock.version,
                              "--tree", str(tree)], capture_output=True, text=True)  # fmt: skip
    assert applied.returncode == 0, applied.stdout + applied.stderr
    pip = [str(overlay_python), "-m", "pip", "install", "--quiet", "pytest==9.1.0", "tblib==3.1.0",
           "multiprocess==0.70.16", "dill==0.3.8"]  # fmt: skip
    subprocess.run(pip, check=True)
    proc = subprocess.run(
        ["bash", str(ROOT / "tests" / "upstream_suite" / "run.sh"), str(overlay_python), str(tree)],
        capture_output=True, text=True, timeout=3600,
        env={**os.environ, "STRICT_COUNTS": "1", "UPSTREAM_RELEASE": lock.version},
    )  # fmt: skip
    summary = proc.stdout[proc.stdout.find("=== summary") - 20 :]
    print(summary)  # per-file counts and seconds, in pytest's report of the test (-rP)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "result: PASS" in summary
