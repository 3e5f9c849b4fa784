"""The CUDA target builds too (it cannot be installed or run here: no GPU, no CUDA torch)."""

import json
import subprocess
import sys
import zipfile

import pytest
from support.cli import ROOT

from overlay.fetch import Cache, fetch_artifact


@pytest.mark.every_release
@pytest.mark.kept_release
def test_cuda_wheel_builds_over_the_cuda_binary(tmp_path, lock):
    from installer.sources import WheelFile

    proc = subprocess.run(
        [sys.executable, str(ROOT / "apply.py"), "build", "--target", "cuda", "--upstream", lock.version,
         "--dist", str(tmp_path), "--json", "-q"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    wheel = tmp_path / out["wheel"].rsplit("/", 1)[1]
    assert wheel.name.startswith(f"vllm-{lock.version}+ovl.")
    assert out["provenance"]["target"] == "cuda"
    with WheelFile.open(wheel) as w:
        w.validate_record(validate_contents=True)
    cuda = fetch_artifact(lock.wheel("cuda"), Cache.locate(None), quiet=True)
    with zipfile.ZipFile(wheel) as new, zipfile.ZipFile(cuda) as old:
        # build-specific files stay the CUDA wheel's own
        for name in ("vllm/platforms/__init__.py", "vllm/_version.py"):
            assert new.read(name) == old.read(name)
        assert b"vllm_version_matches_substr" in new.read("vllm/platforms/__init__.py")
        assert new.read("vllm/overlay.py")
