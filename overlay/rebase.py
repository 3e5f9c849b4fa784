"""Rebase the series onto a new upstream with git's 3-way merge.

The rebase tree (``build/rebase`` unless ``--tree``) is a clone of the new
base repo (tag ``upstream``) that also holds the old base
(``refs/overlay/old-upstream``) and the series replayed on it (branch
``old-patched``), so every blob a patch names in its ``index`` lines is there
for ``git am -3``. Each patch is then replayed on branch ``patched``:

- ``already-upstream``: it reverse-applies to the new base, or its 3-way merge
  changes nothing; it is dropped from the series.
- ``clean``: ``git apply`` takes it as is (zero fuzz; an offset is reported).
- ``merged-3way``: it applies only with ``git am -3``.
- ``conflict``: the 3-way merge left conflicts (file and hunk named).
- ``target-gone``: a file it modifies is not in the new upstream (renamed or
  deleted: git's rename detection between the two bases names the new path).

The replay stops at the first conflict or gone target with ``git am`` in
progress in the tree; resolve there (``git add``), then ``rebase --continue``;
or ``rebase --abort``. State lives in the tree's ``.git/overlay-rebase/``
(with a copy of the patches being replayed). Nothing outside the tree is
written until every patch is through: then ``series``, ``patches/`` and the
lock are written, each file atomically, by the normal export code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from overlay import lock as lockmod
from overlay import releases
from overlay.contract import CONTRACT_FILE, check_tree
from overlay.drift import patch_drift
from overlay.errors import InputError, PatchError
from overlay.families import fit
from overlay.gitcmd import git, git_env
from overlay.lock import Lock
from overlay.maintain import (
    BRANCH,
    PATCH_DIR,
    am_series,
    exact_texts,
    export,
    export_into,
    new_tree,
    staged,
    write_own_patches,
)
from overlay.modules import SRC_DIR
from overlay.patching import conflict_result, hunk_offsets, run_series
from overlay.series import SERIES_FILE, Patch, Series, parse_series_text, strip_prefix, write_series
from overlay.series import load as load_series
from overlay.tree import UPSTREAM_TAG

CLEAN = "clean"
MERGED_3WAY = "merged-3way"
CONFLICT = "conflict"
ALREADY_UPSTREAM = "already-upstream"
TARGET_GONE = "target-gone"
NOT_TRIED = "not-tried"
STOPS = (CONFLICT, TARGET_GONE)

OLD_BASE_REF = "refs/overlay/old-upstream"
OLD_BRANCH = "old-patched"
STATE_DIR = "overlay-rebase"


@dataclass
class Step:
    patch: str
    status: str = NOT_TRIED
    detail: str = ""
    file: str | None = None
    hunk: str | None = None
    renamed_to: str | None = None
    offsets: list[str] = field(default_factory=list)
    drift: list[dict] = field(default_factory=list)
    resolution: str | None = None  # after a stop: "resolved" (committed by hand) or "dropped"

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class RebaseResult:
    tree: Path
    steps: list[Step]
    old: dict
    new: dict
    completed: bool
    series_before: str
    series_after: str | None = None
    changes: list[tuple[str, str]] = field(default_factory=list)
    missing_wheels: dict[str, str] = field(default_factory=dict)
    contract: list[str] = field(default_factory=list)  # upstream names our modules use, gone on the new base

    @property
    def stopped_at(self) -> Step | None:
        return next((s for s in self.steps if s.status in STOPS and s.resolution is None), None)

    @property
    def needs_review(self) -> bool:
        """Completed, but a patch drifted, was dropped, or is already upstream, or the contract broke."""
        steps = any(s.drift or s.status == ALREADY_UPSTREAM or s.resolution == "dropped" for s in self.steps)
        return steps or bool(self.contract)

    def as_json(self) -> dict:
        stop = self.stopped_at
        return {
            "ok": self.completed and not self.needs_review,
            "completed": self.completed,
            "stopped_at": stop.patch if stop else None,
            "tree": str(self.tree),
            "from": self.old,
            "to": self.new,
            "series_sha256_before": self.series_before,
            "series_sha256_after": self.series_after,
            "patches": [s.as_json() for s in self.steps],
            "exported": [{"patch": n, "change": c} for n, c in self.changes],
            "missing_wheels": self.missing_wheels,
            "contract": self.contract,
        }


def _pin_json(lock: Lock) -> dict:
    return {"version": lock.version, "commit": lock.commit, "source": lock.source_id}


@dataclass
class RebaseState:
    """What a rebase in progress keeps in the tree's ``.git/overlay-rebase/state.json``."""

    series: str  # the series file being rebased
    lock: str  # its lock file
    series_before: str  # the series hash at the start (export refuses if it moved)
    old: dict  # the pins, as _pin_json writes them
    new: dict
    new_lock: str  # the lock to write on success (TOML)
    lock_before_sha: str  # file digests at the start
    series_before_sha: str
    steps: list[Step]  # one per patch of the series (the module layer first)
    next: int = 0  # index of the next step to replay
    head_before_step: str | None = None  # HEAD before that step, to undo an interrupted one
    version: int = 2
    # A release other than the primary being advanced ("": the primary; overlay/releases.py).
    release: str = ""
    # Keep the old primary as a supported release (rebase --add).
    add: bool = False

    def as_json(self) -> dict:
        return {**asdict(self), "steps": [s.as_json() for s in self.steps]}

    @classmethod
    def from_json(cls, data: dict) -> RebaseState:
        if data.get("version") != 2:
            raise InputError(f"rebase state version {data.get('version')}: started by another overlay version; "
                             "`rebase --abort` and start again")  # fmt: skip
        return cls(**{**data, "steps": [Step(**s) for s in data["steps"]]})


class Rebase:
    """A rebase in a tree, with its persisted state."""

    def __init__(self, tree: Path):
        self.tree = tree
        self.dir = tree / ".git" / STATE_DIR
        self.state: RebaseState

    @property
    def in_progress(self) -> bool:
        return (self.dir / "state.json").exists()

    def load(self) -> Rebase:
        if not self.in_progress:
            raise InputError(f"no rebase in progress in {self.tree}")
        self.state = RebaseState.from_json(json.loads((self.dir / "state.json").read_text()))
        return self

    def save(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state.as_json(), indent=2, sort_keys=True))
        os.replace(tmp, self.dir / "state.json")

    def git(self, *args: str, check: bool = True):
        return git(self.tree, *args, env=git_env(extra={"GIT_EDITOR": "true"}), check=check)

    def result(self, completed: bool) -> RebaseResult:
        st = self.state
        return RebaseResult(
            self.tree, list(st.steps), st.old, st.new, completed, st.series_before,
            missing_wheels=lockmod.loads(st.new_lock).missing_wheels,
        )  # fmt: skip

    def am_in_progress(self) -> bool:
        return (self.tree / ".git" / "rebase-apply").exists()


def check_can_start(tree: Path, *, force: bool) -> None:
    if tree.exists():
        if Rebase(tree).in_progress:
            raise InputError(f"a rebase is in progress in {tree}: `rebase --continue` or `rebase --abort`")
        if not force:
            raise InputError(f"{tree} already exists: pass --force to replace it (it may hold unexported work)")


def start(old_lock: Lock, new_lock: Lock, series: Series, old_base: Path, new_base: Path, tree: Path,
          *, force: bool, add: bool = False, base_of: Callable[[Lock], Path]) -> RebaseResult:  # fmt: skip
    """Set up the rebase tree and replay the series; stop at the first conflict.

    ``series`` is the one of the release being rebased: the primary (``add``: keep
    the old pin as a supported release), or another supported release (its own
    patches, overlay/releases.py), which the new pin then replaces. ``base_of`` gives
    a supported release's upstream repo: when the primary moves, every release kept
    beside it is written down here as it applies now (_snapshot_kept).
    """
    check_can_start(tree, force=force)
    _check_new_release(series, old_lock, new_lock, add=add)
    pre = run_series(old_base, series, strict=False)
    if not pre.ok(strict=False):
        raise PatchError("the series does not apply to the current pin; fix that before rebasing", pre)
    with new_tree(tree, new_base) as work:
        git(work, "fetch", "--quiet", "--no-tags", str(old_base), f"+refs/tags/{UPSTREAM_TAG}:{OLD_BASE_REF}")
        # The series on the old base: the pre-image blobs for 3-way merges and drift.
        git(work, "checkout", "--quiet", "-b", OLD_BRANCH, OLD_BASE_REF)
        am_series(work, fit(series, old_base).applied)
        git(work, "checkout", "--quiet", "-b", BRANCH, UPSTREAM_TAG)
    rb = Rebase(tree)
    (rb.dir / "patches").mkdir(parents=True)
    # Replayed on the new base: our modules as that base takes them (overlay/families.py).
    series = fit(series, new_base)
    for patch in series.applied:
        (rb.dir / "patches" / patch.name).write_bytes(patch.data)
    if series.own_patches is None:
        _snapshot_kept(rb, series.path, old_lock if add else None, base_of)
    rb.state = RebaseState(
        series=str(series.path),
        lock=str(old_lock.path),
        series_before=series.sha256,
        old=_pin_json(old_lock),
        new=_pin_json(new_lock),
        new_lock=lockmod.dumps(new_lock),
        lock_before_sha=_file_digest(old_lock.path),
        series_before_sha=_file_digest(series.path),
        steps=[Step(p.name) for p in series.applied],
        release=old_lock.version if series.own_patches is not None else "",
        add=add,
    )
    rb.save()
    return _run(rb)


def _check_new_release(series: Series, old_lock: Lock, new_lock: Lock, *, add: bool) -> None:
    if add and series.own_patches is not None:
        raise InputError("--add keeps the primary release beside the new one: rebase the primary (no --upstream)")
    if add and new_lock.version == old_lock.version:
        raise InputError(f"--add: vLLM {new_lock.version} is the release being rebased")
    project = series.path.parent
    if not (project / releases.LOCK_NAME).exists():
        return
    others = {r.version for r in releases.supported(project)} - {old_lock.version}
    if new_lock.version in others:
        raise InputError(f"vLLM {new_lock.version} is already a supported release (`apply.py releases`)")


def _file_digest(path: Path | None) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path and path.exists() else ""


def resume(tree: Path) -> RebaseResult:
    """``--continue``: take the maintainer's resolution of the stopped patch, go on."""
    rb = Rebase(tree).load()
    i = rb.state.next
    if i == len(rb.state.steps):
        # Every patch is through, but the last attempt refused to finish (a kept release still
        # needs a dropped patch, the series was edited meanwhile): try the finish again.
        return _finish(rb)
    step = rb.state.steps[i]
    if step.status not in STOPS:
        # Interrupted while replaying this patch: undo whatever part of it happened, replay it.
        if rb.am_in_progress():
            rb.git("am", "--abort", check=False)
        rb.git("reset", "--quiet", "--hard", rb.state.head_before_step)
        return _run(rb)
    if rb.am_in_progress():
        unmerged = rb.git("diff", "--name-only", "--diff-filter=U").stdout.split()
        if unmerged:
            raise InputError(
                f"{step.patch}: unresolved conflicts in {', '.join(unmerged)}: edit, `git add` them in {tree}, "
                "then `rebase --continue`"
            )
        markers = rb.git("diff", "--cached", "--check", check=False).stdout
        if "conflict marker" in markers:
            raise InputError(f"{step.patch}: conflict markers are still staged:\n{markers.strip()}")
        if not rb.git("diff", "--cached", "--name-only").stdout.strip():
            raise InputError(
                f"{step.patch}: nothing is staged in {tree}. Apply the change there and `git add` it, "
                f"or run `git am --skip` there to drop the patch; then `rebase --continue`"
            )
        proc = rb.git("am", "--continue", check=False)
        if proc.returncode != 0:
            raise InputError(f"git am --continue failed in {tree}:\n{(proc.stdout + proc.stderr).strip()}")
    head = rb.git("rev-parse", "HEAD").stdout.strip()
    step.resolution = "dropped" if head == rb.state.head_before_step else "resolved"
    rb.state.steps[i] = step
    rb.state.next = i + 1
    rb.save()
    return _run(rb)


def abort(tree: Path) -> None:
    """Forget the rebase: remove its tree. ``series``, ``patches/`` and the lock were never written."""
    rb = Rebase(tree).load()
    if rb.am_in_progress():
        rb.git("am", "--abort", check=False)
    shutil.rmtree(tree)


def _run(rb: Rebase) -> RebaseResult:
    names = [s.patch for s in rb.state.steps]
    while rb.state.next < len(names):
        i = rb.state.next
        patch_path = rb.dir / "patches" / names[i]
        patch = Patch(names[i], patch_path, patch_path.read_bytes())
        rb.state.head_before_step = rb.git("rev-parse", "HEAD").stdout.strip()
        rb.save()
        step = _replay(rb, patch)
        rb.state.steps[i] = step
        if step.status in STOPS:
            rb.save()
            return rb.result(completed=False)
        rb.state.next = i + 1
        rb.save()
    return _finish(rb)


def _replay(rb: Rebase, patch: Patch) -> Step:
    step = Step(patch.name)
    step.drift = [d.as_json() for d in patch_drift(patch, _blob_reader(rb.tree), _head_reader(rb.tree))]
    p = str(patch.path)
    if rb.git("apply", "--check", "--reverse", p, check=False).returncode == 0:
        step.status, step.detail = ALREADY_UPSTREAM, "reverse-applies to the new upstream: dropped from the series"
        return step
    forward = rb.git("apply", "--check", "--verbose", p, check=False)
    if forward.returncode == 0:
        rb.git("am", "--quiet", "--keep-cr", "--committer-date-is-author-date", p)
        step.status, step.offsets = CLEAN, hunk_offsets(patch, forward.stderr)
        return step
    failed = conflict_result(patch, forward.stderr)
    step.file, step.hunk = failed.file, str(failed.hunk) if failed.hunk else None
    gone = [f for f in _modified_files(patch) if rb.git("cat-file", "-e", f"HEAD:{f}", check=False).returncode != 0]
    if gone:
        step.status, step.file = TARGET_GONE, gone[0]
        step.renamed_to = _renamed(rb, gone[0])
        where = f"renamed upstream to {step.renamed_to}" if step.renamed_to else "deleted upstream (no rename found)"
        step.detail = f"{gone[0]} is not in the new upstream: {where}; apply the change by hand"
        rb.git("am", "--keep-cr", "--committer-date-is-author-date", p, check=False)  # leaves the session open
        return step
    head = rb.git("rev-parse", "HEAD").stdout.strip()
    merged = rb.git("am", "-3", "--keep-cr", "--committer-date-is-author-date", p, check=False)
    if merged.returncode == 0:
        if rb.git("rev-parse", "HEAD").stdout.strip() == head:
            step.status, step.detail = ALREADY_UPSTREAM, "3-way merge changed nothing: dropped from the series"
        else:
            step.status = MERGED_3WAY
            step.detail = f"{failed.hunk or failed.file}: {failed.problem}; merged with 3-way"
        return step
    unmerged = rb.git("diff", "--name-only", "--diff-filter=U").stdout.split()
    step.status = CONFLICT
    step.file = unmerged[0] if unmerged else failed.file
    step.detail = f"3-way merge left conflicts in {', '.join(unmerged) or failed.file}" + (
        f" (first failing hunk: {failed.hunk})" if failed.hunk else ""
    )
    return step


def _modified_files(patch: Patch) -> list[str]:
    return [strip_prefix(f.path) for f in patch.diff if not f.is_added_file]


def _renamed(rb: Rebase, path: str) -> str | None:
    out = rb.git("diff", "--name-status", "-M", "-z", OLD_BASE_REF, UPSTREAM_TAG).stdout.split("\0")
    i = 0
    while i < len(out) - 1:
        status = out[i]
        if status.startswith(("R", "C")):
            if out[i + 1] == path:
                return out[i + 2]
            i += 3
        else:
            i += 2
    return None


def _blob_reader(tree: Path):
    def read(path: str, blob: str | None) -> str | None:
        if not blob:
            return None
        proc = git(tree, "cat-file", "blob", blob, check=False)
        return proc.stdout if proc.returncode == 0 else None

    return read


def _head_reader(tree: Path):
    def read(path: str, _blob: str | None) -> str | None:
        proc = git(tree, "cat-file", "blob", f"HEAD:{path}", check=False)
        return proc.stdout if proc.returncode == 0 else None

    return read


def _finish(rb: Rebase) -> RebaseResult:
    """Every patch is through: export the branch and write the lock (atomically, per file)."""
    st = rb.state
    series_path, lock_path = Path(st.series), Path(st.lock)
    edited = _file_digest(series_path) != st.series_before_sha or _file_digest(lock_path) != st.lock_before_sha
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
            changes = export_into(rb.tree, stage / series_path.name)
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


def _snapshot_kept(rb: Rebase, series_path: Path, add_old: Lock | None, base_of: Callable[[Lock], Path]) -> None:
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
    """(version, lock text, patch name -> text) of each release _snapshot_kept wrote down."""
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
