"""build: the patched tree's files over the pinned binary wheel, with provenance."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from overlay import __version__ as OVERLAY_VERSION
from overlay.errors import PatchError
from overlay.families import fit
from overlay.fetch import Cache, fetch_artifact
from overlay.lock import GitSource, Lock
from overlay.modules import SRC_DIR
from overlay.patching import SeriesResult, run_series
from overlay.series import Series
from overlay.tree import UPSTREAM_TAG, base_repo, changed_files, file_mode, read_blob
from overlay.wheel import Change, build_wheel, local_version


def default_target() -> str:
    """CUDA where an NVIDIA GPU is present, CPU otherwise."""
    has_gpu = Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None
    return "cuda" if has_gpu else "cpu"


@dataclass
class BuildResult:
    wheel: Path
    version: str
    series: SeriesResult
    provenance: dict


def build(lock: Lock, series: Series, cache: Cache, target: str, dist_dir: Path, *, quiet: bool) -> BuildResult:
    repo = base_repo(lock, cache, quiet=quiet)
    series = fit(series, repo)
    result = run_series(repo, series, strict=False)
    if not result.ok(strict=False):
        raise PatchError("the series does not apply to the pin; nothing was built", result)
    assert result.tree is not None
    changes = [_change(repo, result.tree, status, path) for status, path in changed_files(repo, result.tree)]
    art = lock.wheel(target)
    wheel = fetch_artifact(art, cache, quiet=quiet)
    version = local_version(lock.version, OVERLAY_VERSION, series.sha256)
    provenance = _provenance(lock, series, target, version, changes)
    path = build_wheel(wheel, art.distribution, version, changes, provenance, dist_dir)
    return BuildResult(path, version, result, provenance)


def _change(repo: Path, tree: str, status: str, path: str) -> Change:
    new = None if status == "D" else read_blob(repo, tree, path)
    old = None if status == "A" else read_blob(repo, UPSTREAM_TAG, path)
    mode = file_mode(repo, tree, path) if new is not None else 0o100644
    return Change(status, path, new, old, mode)


def _provenance(lock: Lock, series: Series, target: str, version: str, changes: list[Change]) -> dict:
    wheel = lock.wheel(target)
    if isinstance(lock.source, GitSource):
        source = {"kind": "git", "url": lock.source.url, "commit": lock.source.commit}
    else:
        source = {"kind": "sdist", "filename": lock.source.filename, "sha256": lock.source.sha256}
    kinds = {"A": "added", "M": "modified", "D": "removed"}
    files: dict[str, list[str]] = {k: [] for k in kinds.values()}
    for c in changes:
        files[kinds.get(c.status, "modified")].append(c.path)
    return {
        "overlay_version": OVERLAY_VERSION,
        "version": version,
        "target": target,
        "upstream": {
            "version": lock.version,
            "commit": lock.commit,
            "source": source,
            "wheel": {"distribution": wheel.distribution, "filename": wheel.filename, "sha256": wheel.sha256},
        },
        "series_sha256": series.sha256,
        "patches": [{"name": p.name, "sha256": p.sha256, "subject": p.subject} for p in series.patches],
        "modules": [{"path": f"{SRC_DIR}/{m.path}", "sha256": m.sha256} for m in series.laid_modules],
        "files": files,
    }
