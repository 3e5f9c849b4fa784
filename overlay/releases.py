"""Supported upstream releases: one series, one pin per release, per-release hunks only where needed.

Layout, beside ``series``:

- ``upstream.lock`` and ``patches/``: the primary release (the newest supported
  one). Every patch file in ``patches/`` is written against it.
- ``releases/<version>/upstream.lock``: each other supported release.
- ``releases/<version>/patches/<name>``: that release's own text of a patch,
  only for a patch whose change differs there (its ``git patch-id --stable``
  differs from the shared file's). A patch without its own text there applies
  to that release as the shared file, at whatever line offsets the release
  needs, with every context line matching (git never fuzzes).

- ``releases/<version>/series``: only where a release does not take the
  shared series as is (a patch the primary dropped when its file left
  upstream, kept for the older release): its own list, in apply order. A patch
  it names that the shared series lacks has its own text there.

Our modules (``src/``) are shared by every release; each tree takes the
families of them whose runner it has (overlay/families.py). See
docs/releases.md for why the layout is this one.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from overlay import lock as lockmod
from overlay.errors import InputError
from overlay.series import SERIES_FILE

RELEASES_DIR = "releases"
LOCK_NAME = "upstream.lock"
RELEASE_SERIES_HEADER = (
    "# This release's patches, in apply order: it does not take the shared series as is\n"
    "# (overlay/releases.py). Written by `apply.py rebase`; one file name per line.\n"
)


@dataclass(frozen=True)
class Release:
    version: str
    lock_path: Path
    # releases/<version>/patches for a release other than the primary; None for the primary.
    own_patches: Path | None

    @property
    def primary(self) -> bool:
        return self.own_patches is None

    def lock(self) -> lockmod.Lock:
        return lockmod.load(self.lock_path)


def supported(project: Path) -> list[Release]:
    """Every supported release of the project at ``project``: the primary first, then newest first."""
    primary_lock = project / LOCK_NAME
    primary = Release(lockmod.load(primary_lock).version, primary_lock, None)
    others = []
    root = project / RELEASES_DIR
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        lock_path = folder / LOCK_NAME
        if not lock_path.exists():
            raise InputError(f"{folder}: a supported release's folder needs its {LOCK_NAME}")
        version = lockmod.load(lock_path).version
        if version != folder.name:
            raise InputError(f"{lock_path} pins vLLM {version}, but its folder is named {folder.name}")
        if version == primary.version:
            raise InputError(f"{folder}: {version} is the primary release ({primary_lock}); remove the folder")
        others.append(Release(version, lock_path, folder / "patches"))
    return [primary, *sorted(others, key=lambda r: _version_key(r), reverse=True)]


def select(project: Path, version: str | None = None, *, target: str | None = None) -> Release:
    """The release a command works on.

    ``version`` names one; without it, with ``target`` (build, fetch): the
    newest release with a binary wheel for that target; otherwise the primary.
    """
    releases = supported(project)
    if version is not None:
        for release in releases:
            if release.version == version:
                return release
        names = ", ".join(r.version for r in releases)
        raise InputError(f"vLLM {version} is not a supported release (supported: {names}; `apply.py releases`)")
    if target is None:
        return releases[0]
    with_wheel = [r for r in releases if target in r.lock().wheels]
    # None has one: the primary, whose lock then says why (missing, or never pinned).
    return max(with_wheel, key=_version_key) if with_wheel else releases[0]


def _version_key(release: Release) -> Version:
    try:
        return Version(release.version)
    except InvalidVersion:
        raise InputError(f"{release.lock_path}: {release.version!r} is not a version number") from None


def patch_id(data: bytes) -> str:
    """``git patch-id --stable`` of a patch: its change, not its line numbers or blob ids."""
    proc = subprocess.run(["git", "patch-id", "--stable"], input=data, capture_output=True, check=True)
    return proc.stdout.split(maxsplit=1)[0].decode() if proc.stdout else ""


def same_change(a: bytes, b: bytes) -> bool:
    return patch_id(a) == patch_id(b)


def write_series(folder: Path, names: list[str], shared: list[str]) -> list[tuple[str, str]]:
    """A release's own series file (``folder``/series) where its patches are not the shared
    series' ``shared``; none where they are. (path, change) for a file written or removed."""
    path = folder / SERIES_FILE
    label = f"{RELEASES_DIR}/{folder.name}/{SERIES_FILE}"
    if names == shared:
        if path.exists():
            path.unlink()
            return [(label, "shared")]
        return []
    text = RELEASE_SERIES_HEADER + "".join(f"{n}\n" for n in names)
    if path.exists() and path.read_text() == text:
        return []
    change = "changed" if path.exists() else "added"
    path.write_text(text)
    return [(label, change)]


def drop(project: Path, version: str) -> Release:
    """Remove a supported release other than the primary (its lock and its own patches)."""
    release = select(project, version)
    if release.primary:
        raise InputError(
            f"vLLM {version} is the primary release: the shared patches are written against it. "
            "Rebase the primary onto a newer release first (`apply.py rebase --to VERSION`)"
        )
    shutil.rmtree(release.lock_path.parent)
    return release
