"""The upstream base tree as a git repository, and scratch applications on it.

The base repo (one commit, tagged ``upstream``) is built once per pin and
kept in the cache. Checking and building apply patches to a temporary git
index of that repo (``git apply --cached``), so they need no checkout of the
7,700-file tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from overlay.errors import InputError
from overlay.fetch import Cache, fetch_artifact, fetch_git
from overlay.gitcmd import git, git_env
from overlay.lock import GitSource, Lock

UPSTREAM_TAG = "upstream"
READY = "overlay-base-ready"


def base_repo(lock: Lock, cache: Cache, *, quiet: bool = False) -> Path:
    """Path of the cached base repo for ``lock``, creating it if needed."""
    path = cache.dir("base") / f"{lock.version}-{lock.source_id[:16]}"
    if (path / ".git" / READY).exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    try:
        if not quiet:
            print(f"preparing upstream tree vLLM {lock.version} ({lock.commit})", file=sys.stderr)
        tree = _unpack_source(lock, cache, tmp, quiet=quiet)
        env = git_env(fixed_date=True)
        git(tree, "init", "--quiet", "--initial-branch=base", env=env)
        git(tree, "add", "--all", "--force", env=env)
        git(tree, "commit", "--quiet", "--no-verify", "-m",
            f"upstream vLLM {lock.version} ({lock.commit})", env=env)  # fmt: skip
        git(tree, "tag", UPSTREAM_TAG, env=env)
        (tree / ".git" / READY).write_text(lock.source_id + "\n")
        os.replace(tree, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _unpack_source(lock: Lock, cache: Cache, tmp: Path, *, quiet: bool) -> Path:
    """Lay the upstream source tree out in ``tmp``; return the tree's root."""
    extract = tmp / "extract"
    if isinstance(lock.source, GitSource):
        repo, commit = fetch_git(lock.source, cache, quiet=quiet)
        archive = tmp / "source.tar"
        git(repo, "archive", "--format=tar", "--prefix=tree/", f"--output={archive}", commit)
    else:
        archive = fetch_artifact(lock.source, cache, quiet=quiet)
    with tarfile.open(archive) as tar:
        tar.extractall(extract, filter="data")
    tops = list(extract.iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        raise InputError(f"{archive.name}: expected one top-level folder, found {len(tops)}")
    return tops[0]


class Scratch:
    """A temporary git index holding the upstream tree, to apply patches to."""

    def __init__(self, repo: Path, index: Path, base: str = UPSTREAM_TAG):
        self.repo = repo
        self.env = git_env(extra={"GIT_INDEX_FILE": str(index)})
        git(repo, "read-tree", base, env=self.env)

    def apply(self, patch: bytes, *, check: bool, reverse: bool = False) -> subprocess.CompletedProcess:
        """``git apply --cached`` of the patch text ``patch`` (given on stdin)."""
        args = ["apply", "--cached", "--verbose"]
        args += ["--check"] if check else []
        args += ["--reverse"] if reverse else []
        return git(self.repo, *args, "-", env=self.env, check=False, input=patch)

    def write_tree(self) -> str:
        return git(self.repo, "write-tree", env=self.env).stdout.strip()


@contextmanager
def scratch(repo: Path, base: str = UPSTREAM_TAG) -> Iterator[Scratch]:
    """A scratch index of ``base`` (any tree-ish of ``repo``)."""
    with tempfile.TemporaryDirectory(prefix="overlay-index-") as tmp:
        yield Scratch(repo, Path(tmp) / "index", base)


def changed_files(repo: Path, tree: str) -> list[tuple[str, str]]:
    """(status letter, path) for each file that differs from upstream in ``tree``."""
    out = git(repo, "diff-tree", "-r", "--no-renames", "--name-status", "-z",
              UPSTREAM_TAG, tree).stdout  # fmt: skip
    fields = out.split("\0")
    return [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2)]


def read_blob(repo: Path, tree: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "cat-file", "blob", f"{tree}:{path}"], cwd=repo, check=True, capture_output=True
    ).stdout


def file_mode(repo: Path, tree: str, path: str) -> int:
    out = git(repo, "ls-tree", tree, "--", path).stdout.split()
    return int(out[0], 8) if out else 0o100644
