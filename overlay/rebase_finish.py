"""The end of a rebase, once every patch is through: the branch exported into series, patches/ and
src/ and the new lock written, each file atomically; and the releases kept beside the primary,
written down when the rebase starts (``snapshot_kept``) and written back at the end."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from overlay import lock as lockmod
from overlay import releases
from overlay.contract import CONTRACT_FILE, check_tree
from overlay.errors import InputError
from overlay.families import fit
from overlay.lock import Lock
from overlay.maintain import PATCH_DIR, exact_texts, export, export_into, patch_names, staged, write_own_patches
from overlay.modules import SRC_DIR
from overlay.rebase_state import Rebase, RebaseResult, file_digest
from overlay.series import SERIES_FILE, parse_series_text, write_series
from overlay.series import load as load_series


def finish(rb: Rebase) -> RebaseResult:
    """Every patch is through: export the branch and write the lock (atomically, per file)."""
    st = rb.state
    series_path, lock_path = Path(st.series), Path(st.lock)
    edited = file_digest(series_path) != st.series_before_sha or file_digest(lock_path) != st.lock_before_sha
    own = series_path.parent / releases.RELEASES_DIR / st.release / "patches" if st.release else None
    if edited or load_series(series_path, own).sha256 != st.series_before:
        raise InputError(
            f"{series_path}, patches/ or {lock_path} changed since the rebase started; not overwriting them. "
            f"The rebased branch is in {rb.tree}: put them back and `rebase --continue`, export the branch by "
            "hand, or `rebase --abort`"
        )
    new_lock = lockmod.loads(st.new_lock)
    project = series_path.parent
    if st.release:
        changes = _finish_other_release(rb.tree, series_path, st.release, new_lock)
    else:
        inside = lock_path.parent == project
        # contract.toml is read, not written: export_into takes its [families] from beside the series
        written = (series_path.name, PATCH_DIR, SRC_DIR, CONTRACT_FILE, releases.RELEASES_DIR,
                   *([lock_path.name] if inside else []))  # fmt: skip
        with staged(project, written) as stage:
            changes = export_into(rb.tree, stage / series_path.name, in_use=patch_names(project, shared=False))
            lockmod.dump(new_lock, stage / lock_path.name if inside else lock_path)
            # A patch that left the series on the new pin stays with each kept release that has it.
            changes += _keep_releases(stage, _kept(rb))
    after = fit(load_series(series_path), rb.tree)  # the rebased series: its src/ is what the contract concerns
    result = rb.result(completed=True)
    result.changes, result.series_after = changes, after.sha256
    result.contract = check_tree(series_path, after.laid_modules, rb.tree, "HEAD")
    shutil.rmtree(rb.dir)
    return result


KEPT_DIR = "kept"


def snapshot_kept(rb: Rebase, series_path: Path, add_old: Lock | None, base_of: Callable[[Lock], Path]) -> None:
    """Write down, in the rebase's state, each release other than the primary that is to stay
    supported (with ``add_old``, the primary too): its pin and each of its patches as git writes
    it against that release (a shared file that applies there at offsets is rewritten exactly:
    it may become that release's own text)."""
    project = series_path.parent
    if not (project / releases.LOCK_NAME).exists():
        return
    for release in releases.supported(project):
        if release.primary and add_old is None:
            continue
        series = load_series(series_path, release.own_patches)
        if release.primary:
            lock_text, texts = lockmod.dumps(add_old), {p.name: p.data for p in series.patches}
        else:
            lock_text, texts = release.lock_path.read_text(), exact_texts(base_of(release.lock()), series)
        folder = rb.dir / KEPT_DIR / release.version
        (folder / "patches").mkdir(parents=True)
        (folder / releases.LOCK_NAME).write_text(lock_text)
        write_series(folder / SERIES_FILE, list(texts), "")
        for name, data in texts.items():
            (folder / "patches" / name).write_bytes(data)


def _kept(rb: Rebase) -> list[tuple[str, str, dict[str, bytes]]]:
    """(version, lock text, patch name -> text) of each release snapshot_kept wrote down."""
    kept = []
    for folder in sorted((rb.dir / KEPT_DIR).iterdir()) if (rb.dir / KEPT_DIR).is_dir() else []:
        names = parse_series_text((folder / SERIES_FILE).read_text(), str(folder / SERIES_FILE))
        texts = {name: (folder / "patches" / name).read_bytes() for name in names}
        kept.append((folder.name, (folder / releases.LOCK_NAME).read_text(), texts))
    return kept


def _keep_releases(project: Path, kept: list[tuple[str, str, dict]]) -> list[tuple[str, str]]:
    """After the primary moved: each kept release's own patches are those whose change
    differs from the new shared files or that the new series lacks, with its own series
    file where its patches are not the new series' (its pin written for the old primary)."""
    changes = []
    shared = parse_series_text((project / SERIES_FILE).read_text(), SERIES_FILE)
    for version, lock_text, texts in kept:
        folder = project / releases.RELEASES_DIR / version
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / releases.LOCK_NAME).exists():
            (folder / releases.LOCK_NAME).write_text(lock_text)
            changes.append((f"{releases.RELEASES_DIR}/{version}/{releases.LOCK_NAME}", "added"))
        changes += write_own_patches(texts, project / PATCH_DIR, folder / "patches")
        changes += releases.write_series(folder, list(texts), shared)
    return changes


def _finish_other_release(tree: Path, series_path: Path, old_version: str, new_lock: Lock) -> list[tuple[str, str]]:
    """A release other than the primary moved to ``new_lock``: its folder is rewritten under
    the new version (pin and own patches), in a staging folder first."""
    base = series_path.parent / releases.RELEASES_DIR
    old_folder = base / old_version
    staging = Path(tempfile.mkdtemp(dir=base, prefix=f".{new_lock.version}-"))
    try:
        lockmod.dump(new_lock, staging / releases.LOCK_NAME)
        if (old_folder / SERIES_FILE).exists():  # its own list of patches goes with it
            shutil.copyfile(old_folder / SERIES_FILE, staging / SERIES_FILE)
        changes = export(tree, series_path, staging / "patches")
        shutil.rmtree(old_folder)
        os.replace(staging, base / new_lock.version)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return changes
