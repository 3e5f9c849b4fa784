"""Give the tool its dependencies without a manual set-up step.

Standard library only: this runs before any dependency is importable.
The first call creates ``.tool-venv`` beside ``apply.py``, installs
``requirements/tool.txt`` (and ``requirements/test.txt`` for the commands that run the
tests' support code: ``test``, and ``fuzz``, whose served batches use the ``openai`` client) into it
and re-executes the command there. A marker file holds the hash of the
requirement files, so an edited requirement reinstalls on the next call.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_ENV = "VLLM_OVERLAY_TOOL_VENV"


def _venv_dir() -> Path:
    return Path(os.environ.get(VENV_ENV, ROOT / ".tool-venv"))


# Commands that import tests/support (engines, servers, the openai client) and need test.txt.
TEST_COMMANDS = ("test", "fuzz")


def wants_tests(argv: list[str]) -> bool:
    """Whether ``argv`` runs a command that needs the test requirements.

    Looked for anywhere, not only first: options may stand before the command
    (`apply.py --upstream V test`). A command name that is only an option's value
    installs the test requirements too, which is harmless.
    """
    return any(name in argv for name in TEST_COMMANDS)


def _requirements(with_tests: bool) -> list[Path]:
    names = ["tool.txt", "test.txt"] if with_tests else ["tool.txt"]
    return [ROOT / "requirements" / name for name in names]


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def ensure_tool_env(argv: list[str]) -> None:
    """Re-exec ``argv`` inside the tool venv, creating or updating it first.

    Returns only when the current interpreter already is that venv with
    up-to-date requirements.
    """
    env_dir = _venv_dir()
    python = env_dir / "bin" / "python"
    with_tests = wants_tests(argv)
    reqs = _requirements(with_tests)
    marker = env_dir / ("requirements-test.sha256" if with_tests else "requirements.sha256")
    wanted = _digest(reqs)
    in_env = Path(sys.prefix).resolve() == env_dir.resolve()
    if in_env and marker.is_file() and marker.read_text() == wanted:
        return
    if not python.exists():
        print(f"overlay: creating tool environment {env_dir} (one time)", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    if not marker.is_file() or marker.read_text() != wanted:
        print("overlay: installing tool dependencies", file=sys.stderr)
        cmd = [str(python), "-m", "pip", "install", "--quiet"]
        for req in reqs:
            cmd += ["-r", str(req)]
        subprocess.run(cmd, check=True)
        marker.write_text(wanted)
    os.execv(str(python), [str(python), str(ROOT / "apply.py"), *argv])
