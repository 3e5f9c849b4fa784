"""Run apply.py as a user would, from tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_tool(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run apply.py as a user would; output captured as text."""
    return subprocess.run(
        [sys.executable, str(ROOT / "apply.py"), *args],
        capture_output=True, text=True, cwd=cwd or ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip


def run_json(*args: str, **kw) -> tuple[int, dict]:
    proc = run_tool(*args, "--json", **kw)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None
