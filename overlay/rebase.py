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
lock are written, each file atomically, by the normal export code (overlay/rebase_finish.py).
The steps, the result and the state kept in the tree: overlay/rebase_state.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from overlay import lock as lockmod
from overlay import releases
from overlay.drift import patch_drift
from overlay.errors import InputError, PatchError
from overlay.families import fit
from overlay.gitcmd import git
from overlay.lock import Lock
from overlay.maintain import BRANCH, am_series, new_tree
from overlay.patching import conflict_result, hunk_offsets, run_series
from overlay.rebase_finish import finish, snapshot_kept
from overlay.rebase_state import (
    ALREADY_UPSTREAM,
    CLEAN,
    CONFLICT,
    MERGED_3WAY,
    OLD_BASE_REF,
    OLD_BRANCH,
    STOPS,
    TARGET_GONE,
    Rebase,
    RebaseResult,
    RebaseState,
    Step,
    file_digest,
    pin_json,
)
from overlay.series import Patch, Series, strip_prefix
from overlay.tree import UPSTREAM_TAG


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
    beside it is written down here as it applies now (snapshot_kept).
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
        snapshot_kept(rb, series.path, old_lock if add else None, base_of)
    rb.state = RebaseState(
        series=str(series.path),
        lock=str(old_lock.path),
        series_before=series.sha256,
        old=pin_json(old_lock),
        new=pin_json(new_lock),
        new_lock=lockmod.dumps(new_lock),
        lock_before_sha=file_digest(old_lock.path),
        series_before_sha=file_digest(series.path),
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


def resume(tree: Path) -> RebaseResult:
    """``--continue``: take the maintainer's resolution of the stopped patch, go on."""
    rb = Rebase(tree).load()
    i = rb.state.next
    if i == len(rb.state.steps):
        # Every patch is through, but the last attempt refused to finish (a kept release still
        # needs a dropped patch, the series was edited meanwhile): try the finish again.
        return finish(rb)
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
    return finish(rb)


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
