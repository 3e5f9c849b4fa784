"""The maintainer loop: a git branch of the patched tree to edit, exported back.

``apply`` makes a checkout whose ``patched`` branch holds the module layer
(src/) and then one commit per patch on top of the ``upstream`` tag; edit,
commit, rebase there as usual (a change to one of our modules can go in any
commit: export takes each added file's final content).
``export`` turns ``upstream..patched`` back into ``patches/`` and ``series``
(changes to upstream files) and ``src/`` (the files the branch adds).
Export runs git without user configuration and with --zero-commit,
--full-index, --no-signature and --no-numbered, so exporting an unchanged
branch rewrites no byte.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from overlay.contract import CONTRACT_FILE, tree_reader
from overlay.errors import InputError, PatchError
from overlay.families import fit, left_out
from overlay.gitcmd import git, git_env
from overlay.modules import SRC_DIR, write_modules
from overlay.patching import SeriesResult, run_series
from overlay.releases import RELEASES_DIR, same_change
from overlay.releases import write_series as write_release_series
from overlay.series import Series, parse_series_text, release_series_file, write_series
from overlay.tree import UPSTREAM_TAG, file_mode, read_blob

BRANCH = "patched"
# In a tree's .git: the supported release it was made for (export writes that release's patches).
RELEASE_FILE = "overlay-release"
PATCH_DIR = "patches"
SERIES_HEADER = "# Patch series, in apply order. Written by `apply.py export`; one file name per line.\n"


def make_tree(base: Path, series: Series, tree_dir: Path, *, force: bool, release: str = "") -> SeriesResult:
    """Check the series, then create ``tree_dir`` with one commit per patch.

    Nothing is written when a patch fails; an existing tree is replaced only
    with ``force`` (it may hold unexported work).
    """
    if tree_dir.exists() and not force:
        raise InputError(
            f"{tree_dir} already exists (it may hold unexported work): export it, or pass --force to recreate it"
        )
    series = fit(series, base)
    result = run_series(base, series, strict=False)
    if not result.ok(strict=False):
        raise PatchError("the series does not apply; no tree was written", result)
    with new_tree(tree_dir, base) as work:
        git(work, "checkout", "--quiet", "-b", BRANCH, UPSTREAM_TAG)
        am_series(work, series.applied)
        if release:
            (work / ".git" / RELEASE_FILE).write_text(release + "\n")
    return result


def tree_release(tree_dir: Path) -> str | None:
    """The supported release ``apply`` made ``tree_dir`` for (None: not recorded)."""
    path = tree_dir / ".git" / RELEASE_FILE
    return path.read_text().strip() if path.exists() else None


@contextmanager
def new_tree(tree_dir: Path, base: Path) -> Iterator[Path]:
    """A clone of ``base`` (no checkout) to build in; it replaces ``tree_dir``
    only when the block succeeds, so a failure leaves no half-made tree."""
    tree_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=tree_dir.parent, prefix=f".{tree_dir.name}-"))
    try:
        work = tmp / "tree"
        git(tmp, "clone", "--quiet", "--no-checkout", str(base), str(work))
        yield work
        if tree_dir.exists():
            shutil.rmtree(tree_dir)
        os.replace(work, tree_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def am_series(work: Path, patches) -> None:
    """Commit each patch on the checked-out branch (``git am`` of its text, fixed identity)."""
    env = git_env()
    for patch in patches:
        git(work, "am", "--quiet", "--keep-cr", "--committer-date-is-author-date", env=env, input=patch.data)


def export(tree_dir: Path, series_path: Path, own_patches: Path | None = None) -> list[tuple[str, str]]:
    """Write ``upstream..HEAD`` of ``tree_dir`` back; return (name, change) per file.

    Files the branch adds go to src/ beside ``series_path`` as HEAD has them
    (names ``src/...``); its changes to upstream files become the patches, one
    per commit that has any (a commit that only edits our modules has none).
    With ``own_patches`` (the tree is of a release other than the primary) the
    patches go there, and only those whose change differs from the shared file;
    a patch the branch adds after that release's own goes to its series too.
    Everything is written in a staging copy first (``staged``), so a failure or
    an interrupt leaves series, patches/, src/ and the release's folder as they were.
    """
    project = series_path.parent
    own = own_patches.relative_to(project) if own_patches is not None else None
    # contract.toml is read, not written: export_into needs its [families] beside the series
    written = (series_path.name, PATCH_DIR, SRC_DIR, CONTRACT_FILE, *([str(own.parent)] if own else []))
    # Read before staging (it copies one release's folder at most). A kept release's new patch is
    # numbered past every name; the primary's past the kept releases' own (its series handles the rest).
    in_use = patch_names(project, shared=own is not None)
    with staged(project, written) as stage:
        return export_into(tree_dir, stage / series_path.name, stage / own if own else None, in_use=in_use)


def export_into(
    tree_dir: Path, series_path: Path, own_patches: Path | None = None, *, in_use: list[str]
) -> list[tuple[str, str]]:
    """``export``, writing in place: for a staging copy (``staged``). ``in_use``: the patch
    names a new patch must be numbered past (``patch_names``): every release's for a kept
    release's tree, the kept releases' own for the primary's."""
    if not (tree_dir / ".git").exists():
        raise InputError(f"{tree_dir} is not a patched tree: run `apply.py apply` first")
    if git(tree_dir, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise InputError(f"{tree_dir} has uncommitted changes: commit them first")
    if git(tree_dir, "rev-list", "--merges", f"{UPSTREAM_TAG}..HEAD").stdout.strip():
        raise InputError("the branch has merge commits; a series must be linear")
    patch_dir = series_path.parent / PATCH_DIR
    names_path = release_series_file(series_path, own_patches)
    old = parse_series_text(names_path.read_text(), str(names_path)) if names_path.exists() else []
    added = _added_files(tree_dir)
    # src/ files of the families this tree's upstream has no runner for stay as they are
    keep = left_out(series_path, tree_reader(tree_dir, UPSTREAM_TAG))
    if own_patches is not None:
        fresh = _kept_release_names(_format_patches(tree_dir, added), old, in_use, names_path.name)
        changes = write_own_patches(fresh, patch_dir, own_patches)
        if list(fresh) != old:
            shared = parse_series_text(series_path.read_text(), str(series_path))
            changes += write_release_series(own_patches.parent, list(fresh), shared)
    else:
        fresh = _keep_names(_format_patches(tree_dir, added), old, in_use)
        changes = _write_patches(fresh, old, patch_dir, series_path)
    return changes + write_modules(series_path.parent / SRC_DIR, added, keep)


def _format_patches(tree_dir: Path, added: dict) -> dict[str, bytes]:
    """name -> text of each patch ``upstream..HEAD`` makes of changes to upstream files."""
    outside = [f":(exclude,literal){path}" for path in added]
    with tempfile.TemporaryDirectory() as tmp:
        git(tree_dir, "format-patch", "--quiet", "--zero-commit", "--full-index",
            "--no-signature", "--no-numbered", "--no-renames", "--output-directory", tmp,
            f"{UPSTREAM_TAG}..HEAD", "--", ".", *outside, env=git_env())  # fmt: skip
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir()}


def _keep_names(fresh: dict[str, bytes], old: list[str], in_use: list[str]) -> dict[str, bytes]:
    """``fresh`` (git's names: a number by position, then the subject) in series order, each
    under the name the series already gives that subject: a patch keeps its number when one
    before it leaves the series. A new subject keeps git's name unless its number is not past
    every kept patch's and every name in ``in_use`` (the kept releases' own patches); then it
    takes the next number past them (git's by position would reuse the number of a patch that
    left, which a kept release's own series may still use, or of a patch only they take)."""
    by_subject = {_subject(name): name for name in old if "-" in name}
    kept = [by_subject[_subject(n)] for n in fresh if _subject(n) in by_subject]
    last = _last_number(kept + in_use)
    named = {}
    for name, data in sorted(fresh.items()):
        number, subject = name.split("-", 1)
        if subject not in by_subject and number.isdigit() and int(number) <= last:
            last += 1
            by_subject[subject] = f"{last:0{len(number)}d}-{subject}"
        named[by_subject.get(subject, name)] = data
    if len(named) != len(fresh):
        raise InputError(f"two commits of the branch have the same subject: {', '.join(sorted(fresh))}")
    return named


def _kept_release_names(fresh: dict[str, bytes], old: list[str], in_use: list[str], listed_in: str) -> dict:
    """A kept release's patches under their names: those of its series ``old``, in its order,
    then those the branch adds after them (a fix to a file the primary no longer has). An added
    patch takes the name another release gives its subject, else the next number past every
    name in ``in_use``. Removing or renaming a patch happens on the primary release's tree."""
    ordered = sorted(fresh)  # git's names: by position
    if [_subject(n) for n in ordered[: len(old)]] != [_subject(n) for n in old]:
        raise InputError(
            f"the tree's patches ({', '.join(ordered)}) do not start with those of {listed_in} "
            f"({', '.join(old)}): a release other than the primary keeps the patches it has and may "
            "add some after them; patches are removed or renamed on the primary release's tree"
        )
    by_subject = {_subject(name): name for name in in_use}
    last = _last_number(in_use)
    named = {name: fresh[git_name] for name, git_name in zip(old, ordered, strict=False)}
    for git_name in ordered[len(old) :]:
        subject = _subject(git_name)
        if subject not in by_subject:
            last += 1
            by_subject[subject] = f"{last:04d}-{subject}"
        named[by_subject[subject]] = fresh[git_name]
    return named


def _subject(name: str) -> str:
    return name.split("-", 1)[1] if "-" in name else name


def _last_number(names: list[str]) -> int:
    """The highest patch number among ``names`` (0: none)."""
    return max((int(n.split("-", 1)[0]) for n in names if n.split("-", 1)[0].isdigit()), default=0)


def patch_names(project: Path, *, shared: bool) -> list[str]:
    """The patch file names of each kept release's own folder, and with ``shared`` the
    primary's (patches/) too."""
    folders = [*([project / PATCH_DIR] if shared else []), *(d / PATCH_DIR for d in (project / RELEASES_DIR).glob("*"))]
    return sorted({p.name for folder in folders for p in folder.glob("*.patch")})


def exact_texts(base: Path, series: Series) -> dict[str, bytes]:
    """Each patch of ``series`` as git writes it against ``base``: texts that apply there at no
    offset, as a release's own text must (by position: one commit per patch, in order)."""
    with tempfile.TemporaryDirectory(prefix="overlay-exact-") as tmp:
        tree = Path(tmp) / "tree"
        make_tree(base, series, tree, force=True)
        fresh = _format_patches(tree, _added_files(tree))
    return {p.name: fresh[name] for p, name in zip(series.patches, sorted(fresh), strict=True)}


def _write_patches(fresh: dict[str, bytes], old: list[str], patch_dir: Path, series_path: Path) -> list:
    """The primary release's patches/ and series: exactly ``fresh`` (in series order)."""
    names = list(fresh)
    changes = []
    patch_dir.mkdir(exist_ok=True)
    for name in names:
        dest = patch_dir / name
        if dest.exists() and dest.read_bytes() == fresh[name]:
            changes.append((name, "unchanged"))
            continue
        changes.append((name, "changed" if dest.exists() else "added"))
        dest.write_bytes(fresh[name])
    for name in old:
        if name not in fresh:
            (patch_dir / name).unlink(missing_ok=True)
            changes.append((name, "removed"))
    new_text = SERIES_HEADER + "".join(f"{n}\n" for n in names)
    if not series_path.exists() or series_path.read_text() != new_text:
        write_series(series_path, names, SERIES_HEADER)
    return changes


def write_own_patches(texts: dict[str, bytes], shared: Path, own: Path) -> list[tuple[str, str]]:
    """A release other than the primary: ``own/NAME`` holds each text of ``texts`` whose change
    differs from the shared ``shared/NAME`` or that has no shared file (a patch the primary does
    not take); the others are left to the shared file. Changes are named from the project root
    (``releases/VERSION/patches/NAME``)."""
    changes = []
    for name, data in texts.items():
        dest, label = own / name, (own / name).relative_to(shared.parent).as_posix()
        if (shared / name).exists() and same_change((shared / name).read_bytes(), data):
            if dest.exists():
                dest.unlink()
                changes.append((label, "shared"))
            continue
        if dest.exists() and dest.read_bytes() == data:
            changes.append((label, "unchanged"))
            continue
        changes.append((label, "changed" if dest.exists() else "added"))
        own.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    if own.is_dir() and not any(own.iterdir()):
        own.rmdir()
    return changes


@contextmanager
def staged(project: Path, names: Iterable[str]) -> Iterator[Path]:
    """A copy of ``names`` (files or folders, relative to ``project``) to write in.

    When the block succeeds, each one whose content changed replaces the original by
    rename (Ctrl-C held off meanwhile); a failure or an interrupt inside the block leaves
    the originals as they were. Every writer of the project's files goes through here.
    """
    names = list(dict.fromkeys(names))
    tmp = Path(tempfile.mkdtemp(dir=project, prefix=".overlay-staging-"))
    try:
        stage = tmp / "new"
        for name in names:
            _copy(project / name, stage / name)
        yield stage
        changed = [n for n in names if _contents(project / n) != _contents(stage / n)]
        with _no_interrupt():
            for name in changed:
                _swap(project / name, stage / name, tmp / "old" / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True)
    elif src.exists():
        shutil.copy2(src, dest)


def _contents(path: Path) -> dict[str, tuple[bytes, int]] | None:
    """relative path -> (data, mode) of each file at ``path`` (a file or a folder); None if absent."""
    if not path.exists():
        return None
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {p.relative_to(path).as_posix(): (p.read_bytes(), p.stat().st_mode) for p in files}


def _swap(original: Path, new: Path, old: Path) -> None:
    """Put ``new`` in place of ``original`` (which goes to ``old``), by renames."""
    old.parent.mkdir(parents=True, exist_ok=True)
    if original.exists():
        os.replace(original, old)
    if new.exists():
        original.parent.mkdir(parents=True, exist_ok=True)
        os.replace(new, original)


@contextmanager
def _no_interrupt() -> Iterator[None]:
    """Hold Ctrl-C off while the renames run: it arrives after the last one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _added_files(tree_dir: Path) -> dict[str, tuple[bytes, bool]]:
    """path -> (HEAD's data, executable) for each file HEAD has and upstream does not."""
    out = git(tree_dir, "diff-tree", "-r", "-z", "--no-renames", "--diff-filter=A", "--name-only",
              UPSTREAM_TAG, "HEAD").stdout  # fmt: skip
    return {
        path: (read_blob(tree_dir, "HEAD", path), file_mode(tree_dir, "HEAD", path) == 0o100755)
        for path in out.split("\0")
        if path
    }
