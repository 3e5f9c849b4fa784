"""Run git with a fixed identity and no user configuration.

Commits the tool makes (the upstream base, applied patches) and the patches it
exports must not depend on who runs it or on their ~/.gitconfig
(diff.noprefix, format.signature, ...), or export would not be deterministic.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IDENTITY = {
    "GIT_AUTHOR_NAME": "vllm-overlay",
    "GIT_AUTHOR_EMAIL": "vllm-overlay@localhost",
    "GIT_COMMITTER_NAME": "vllm-overlay",
    "GIT_COMMITTER_EMAIL": "vllm-overlay@localhost",
}
FIXED_DATE = "2000-01-01T00:00:00+0000"


def git_env(*, fixed_date: bool = False, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    for key, value in IDENTITY.items():
        env.setdefault(key, value)
    if fixed_date:
        env.update(GIT_AUTHOR_DATE=FIXED_DATE, GIT_COMMITTER_DATE=FIXED_DATE)
    env.update(extra or {})
    return env


class GitError(subprocess.CalledProcessError):
    """A git command failed; ``cwd`` says in which repository (the CLI reports it)."""

    def __init__(self, proc: subprocess.CompletedProcess, cwd: Path):
        super().__init__(proc.returncode, proc.args, proc.stdout, proc.stderr)
        self.cwd = cwd


def git(
    cwd: Path,
    *args: str,
    env: dict[str, str] | None = None,
    check: bool = True,
    input: bytes | None = None,
) -> subprocess.CompletedProcess:
    """Run ``git args`` in ``cwd``; output is captured as text."""
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=env or git_env(),
        input=input,
        capture_output=True,
    )
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    if check and proc.returncode != 0:
        raise GitError(proc, cwd)
    return proc
