"""The patch series: ``series`` lists patch files in ``patches/`` in apply order.

Our own files live in ``src/`` beside it (overlay/modules.py) and are applied
first, as the module layer; ``Series.applied`` is that layer plus the patches.

Format: one patch file name per line; blank lines and ``#`` comments are
ignored. Anything else on a line (quilt options, paths, a second name) is an
error that names the line, so a typo never silently drops a patch.
"""

from __future__ import annotations

import email.parser
import hashlib
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from overlay.errors import InputError
from overlay.modules import LAYER_NAME, SRC_DIR, Module, layer_patch, load_modules

SERIES_FILE = "series"
PATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.patch$")
# Header trailers each patch must carry (checked by `check`).
REQUIRED_TRAILERS = ("Upstream-Status", "Tests")


@dataclass(frozen=True)
class Hunk:
    file: str
    index: int  # 1-based within its file
    source_start: int
    header: str  # the "@@ -a,b +c,d @@ ..." line

    def __str__(self) -> str:
        return f"{self.file} hunk #{self.index} ({self.header})"


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    data: bytes

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @cached_property
    def headers(self):
        return email.parser.BytesHeaderParser().parsebytes(self.data)

    @property
    def subject(self) -> str:
        subject = " ".join(str(self.headers.get("Subject", self.name)).split())
        return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)

    @cached_property
    def diff(self) -> PatchSet:
        try:
            return PatchSet(self.data.decode("utf-8", "surrogateescape"))
        except UnidiffParseError as e:
            raise InputError(f"patch {self.name}: not a valid diff: {e}") from None

    @property
    def files(self) -> list[str]:
        return [strip_prefix(f.path) for f in self.diff]

    def touched(self) -> list[tuple[str, int, int]]:
        """(file, lines added, lines removed) per file, in the patch's order."""
        return [(strip_prefix(f.path), f.added, f.removed) for f in self.diff]

    def hunks(self) -> list[Hunk]:
        out = []
        for f in self.diff:
            for i, h in enumerate(f, 1):
                header = f"@@ -{h.source_start},{h.source_length} +{h.target_start},{h.target_length} @@"
                out.append(Hunk(strip_prefix(f.path), i, h.source_start, header))
        return out

    def hunk_at(self, file: str, line: int) -> Hunk | None:
        """The hunk git reported as failing at ``file:line`` (its old start)."""
        for h in self.hunks():
            if h.file == file and h.source_start == line:
                return h
        return None

    def trailers(self) -> dict[str, str]:
        found = {}
        message = self.data.split(b"\n---\n", 1)[0].decode("utf-8", "replace")
        for line in message.splitlines():
            key, sep, value = line.partition(":")
            if sep and key in REQUIRED_TRAILERS:
                found[key] = value.strip()
        return found


def strip_prefix(path: str) -> str:
    return path[2:] if path[:2] in ("a/", "b/") else path


@dataclass(frozen=True)
class Series:
    path: Path
    patches: tuple[Patch, ...]
    modules: tuple[Module, ...] = ()  # src/ (overlay/modules.py)
    # For a release other than the primary: releases/<version>/patches (overlay/releases.py).
    own_patches: Path | None = None
    # src/ paths not laid into the tree at hand: families whose runner it lacks (overlay/families.py).
    left_out: frozenset[str] = frozenset()

    @property
    def laid_modules(self) -> tuple[Module, ...]:
        return tuple(m for m in self.modules if m.path not in self.left_out)

    @property
    def patch_dir(self) -> Path:
        return self.path.parent / "patches"

    def is_shared(self, patch: Patch) -> bool:
        """Whether ``patch`` is the shared file of a release other than the primary, which
        applies there at the release's own line offsets."""
        return self.own_patches is not None and patch.path.parent != self.own_patches

    @cached_property
    def layer(self) -> Patch | None:
        """The module layer: the patch that lays src/ into the tree (None without src/)."""
        if not self.laid_modules:
            return None
        return Patch(LAYER_NAME, self.path.parent / SRC_DIR, layer_patch(self.laid_modules))

    @property
    def applied(self) -> tuple[Patch, ...]:
        """What is applied to upstream, in order: the module layer, then the patches."""
        return (self.layer, *self.patches) if self.layer else self.patches

    @cached_property
    def sha256(self) -> str:
        """Identity of the series: the ordered patch names and contents, and src/'s files
        (all of them, whichever a tree takes).

        Comments and blank lines in ``series`` do not change it.
        """
        h = hashlib.sha256()
        for p in self.patches:
            h.update(f"{p.name}\0{p.sha256}\n".encode())
        for m in self.modules:
            h.update(f"{SRC_DIR}/{m.path}\0{m.sha256}\0{int(m.executable)}\n".encode())
        return h.hexdigest()


def parse_series_text(text: str, where: str) -> list[str]:
    names: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if len(line.split()) != 1 or not PATCH_NAME.match(line):
            raise InputError(
                f"{where}:{lineno}: bad series line {raw.strip()!r}: a line holds one patch "
                f"file name from patches/ (letters, digits, '._+-', ending in .patch)"
            )
        if line in names:
            raise InputError(f"{where}:{lineno}: {line} is listed twice")
        names.append(line)
    return names


def release_series_file(series_path: Path, own_patches: Path | None) -> Path:
    """The file listing a release's patches: its own ``releases/<version>/series`` where its
    patches are not the shared series' (a patch the primary dropped, say), else ``series``."""
    own = own_patches.parent / SERIES_FILE if own_patches is not None else None
    return own if own is not None and own.exists() else series_path


def load(series_path: Path, own_patches: Path | None = None) -> Series:
    """The series; with ``own_patches`` (a release's releases/<version>/patches), a patch
    found there replaces the shared file of the same name, and the release's own series
    file, where it has one, says which patches it takes."""
    names_path = release_series_file(series_path, own_patches)
    try:
        text = names_path.read_text()
    except FileNotFoundError:
        raise InputError(f"series file not found: {names_path}") from None
    patch_dir = series_path.parent / "patches"
    names = parse_series_text(text, str(names_path))
    own = {p.name for p in own_patches.iterdir()} if own_patches and own_patches.is_dir() else set()
    if stray := sorted(own - set(names)):
        raise InputError(f"{own_patches}: {', '.join(stray)} not in {names_path}; remove it")
    patches = []
    for name in names:
        path = (own_patches if name in own else patch_dir) / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{names_path}: patch {name} is listed but {path} does not exist") from None
        patch = Patch(name, path, data)
        if not patch.diff:
            raise InputError(f"patch {name}: contains no diff")
        patches.append(patch)
    return Series(series_path, tuple(patches), load_modules(series_path.parent / SRC_DIR), own_patches)


def write_series(series_path: Path, names: list[str], header: str) -> None:
    series_path.write_text(header + "".join(f"{n}\n" for n in names))
