"""Apply the series to the upstream tree, patch by patch, and say how each went.

Zero fuzz always: git apply never fuzzes. A hunk that applies at an offset is
accepted by ``apply`` (with the offset reported) and refused by ``check``,
which also refuses a patch that is already upstream (it reverse-applies). The
one exception: on a release other than the primary, a shared patch (written
against the primary, overlay/releases.py) applies at that release's offsets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from overlay.series import Hunk, Patch, Series
from overlay.tree import UPSTREAM_TAG, Scratch, scratch

APPLIED = "applied"
OFFSET = "offset"
CONFLICT = "conflict"
ALREADY_UPSTREAM = "already-upstream"
NOT_TRIED = "not-tried"

_OFFSET = re.compile(r"^Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)\.$")
_FAILED_AT = re.compile(r"^error: patch failed: (.+):(\d+)$")
_NO_FILE = re.compile(r"^error: (.+): does not exist in index$")
_EXISTS = re.compile(r"^error: (.+): already exists in index$")


@dataclass
class PatchResult:
    patch: Patch
    status: str
    offsets: list[str] = field(default_factory=list)
    file: str | None = None
    hunk: Hunk | None = None
    problem: str = ""
    shared: bool = False  # a shared patch on a release other than the primary: offsets expected

    def ok(self, strict: bool) -> bool:
        return self.status == APPLIED or (self.status == OFFSET and (self.shared or not strict))

    def as_json(self) -> dict:
        return {
            "patch": self.patch.name,
            "sha256": self.patch.sha256,
            "subject": self.patch.subject,
            "status": self.status,
            "files": self.patch.files,
            "hunks": len(self.patch.hunks()),
            "offsets": self.offsets,
            "failed_file": self.file,
            "failed_hunk": str(self.hunk) if self.hunk else None,
            "problem": self.problem,
            "shared": self.shared,
        }


@dataclass
class SeriesResult:
    results: list[PatchResult]
    tree: str | None  # git tree of the patched source, when every patch applied

    def ok(self, strict: bool) -> bool:
        return all(r.ok(strict) for r in self.results)


def run_series(repo: Path, series: Series | list[Patch], *, strict: bool, base: str = UPSTREAM_TAG) -> SeriesResult:
    """Apply ``series`` (its module layer first, fitted to ``base``: overlay/families.py) in a
    scratch index of ``base``; stop at the first failure."""
    from overlay.families import fit

    results: list[PatchResult] = []
    patches = fit(series, repo, base).applied if isinstance(series, Series) else series
    with scratch(repo, base) as index:
        for patch in patches:
            if results and not results[-1].ok(strict):
                results.append(PatchResult(patch, NOT_TRIED))
                continue
            result = _apply_one(index, patch)
            result.shared = isinstance(series, Series) and series.is_shared(patch)
            results.append(result)
        tree = index.write_tree() if all(r.ok(strict) for r in results) else None
    return SeriesResult(results, tree)


def _apply_one(index: Scratch, patch: Patch) -> PatchResult:
    if index.apply(patch.data, check=True, reverse=True).returncode == 0:
        return PatchResult(patch, ALREADY_UPSTREAM, problem="reverse-applies cleanly: upstream already has it")
    forward = index.apply(patch.data, check=True)
    if forward.returncode != 0:
        return conflict_result(patch, forward.stderr)
    index.apply(patch.data, check=False)
    offsets = hunk_offsets(patch, forward.stderr)
    return PatchResult(patch, OFFSET if offsets else APPLIED, offsets)


def hunk_offsets(patch: Patch, log: str) -> list[str]:
    """'file hunk #i: offset N lines' for each hunk git placed off its line."""
    found, current = [], None
    for line in log.splitlines():
        if line.startswith("Checking patch "):
            current = line.removeprefix("Checking patch ").rstrip(".")
        elif m := _OFFSET.match(line):
            found.append(f"{current} hunk #{m[1]}: offset {m[3]} lines (now at line {m[2]})")
    return found


def conflict_result(patch: Patch, log: str) -> PatchResult:
    result = PatchResult(patch, CONFLICT)
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    for line in errors:
        if m := _FAILED_AT.match(line):
            result.file, result.hunk = m[1], patch.hunk_at(m[1], int(m[2]))
            result.problem = "context does not match (zero fuzz)"
            return result
        if m := _NO_FILE.match(line):
            result.file, result.problem = m[1], "file is not in the upstream tree (gone or renamed?)"
            return result
        if m := _EXISTS.match(line):
            result.file, result.problem = m[1], "file the patch creates already exists upstream"
            return result
    result.problem = errors[-1].removeprefix("error: ") if errors else log.strip()
    return result
