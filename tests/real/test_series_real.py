"""The real series on the real pin (vLLM 0.32.0): zero fuzz, vLLM's own style."""

import json
import subprocess
import sys

from support.cli import ROOT

from overlay import series as seriesmod


def test_series_applies_to_pin_with_zero_fuzz_and_no_drift():
    proc = subprocess.run([sys.executable, str(ROOT / "apply.py"), "check", "--json", "-q"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    names = [p.name for p in seriesmod.load(ROOT / "series").patches]
    assert [p["patch"] for p in report["patches"]] == names and names
    for p in report["patches"]:
        assert p["status"] == "applied" and p["offsets"] == [], p


def test_patched_python_passes_vllm_ruff(tmp_path):
    """Patches follow vLLM's ruff config (pyproject.toml of the pin), so they could go upstream."""
    tree = tmp_path / "tree"
    proc = subprocess.run([sys.executable, str(ROOT / "apply.py"), "apply", "-q", "--tree", str(tree)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    changed = subprocess.run(["git", "diff", "--name-only", "--diff-filter=AM", "upstream..patched"],
                             cwd=tree, capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    py = [f for f in changed if f.endswith(".py")]
    assert py
    ruff = [sys.executable, "-m", "ruff"]
    check = subprocess.run([*ruff, "check", *py], cwd=tree, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    fmt = subprocess.run([*ruff, "format", "--check", *py], cwd=tree, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout
