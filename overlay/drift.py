"""Drift: a patch still applies, but upstream edited the code it hooks.

For each hunk of a Python file, the enclosing function or class in the
patch's pre-image (the file the patch was written against, found by the blob
id of its ``index`` line) is looked up with ``ast``: the innermost ``def`` or
``class`` whose lines hold every line the hunk removes, and both neighbours
of every run of lines it inserts. That definition is then compared with the
definition of the same qualified name in the new pre-image (the new upstream
with the earlier patches applied). Compared as syntax trees (``ast.dump``),
so moved code, comments and formatting do not count; any change to the code
does, even when the hunk applies cleanly. A definition that is gone counts.

Hunks at module level, non-Python files and files the patch creates are not
checked.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

from overlay.series import Patch, strip_prefix

_INDEX = re.compile(r"^index ([0-9a-f]{7,64})\.\.([0-9a-f]{7,64})")

# Reads a pre-image: (path, blob id from the patch or None) -> text or None.
Reader = Callable[[str, str | None], str | None]


@dataclass(frozen=True)
class Drift:
    file: str
    hunk: int  # 1-based within the file
    function: str  # qualified name, e.g. Scheduler.schedule
    detail: str

    def __str__(self) -> str:
        return f"{self.file} hunk #{self.hunk}: {self.function} {self.detail}"

    def as_json(self) -> dict:
        return {"file": self.file, "hunk": self.hunk, "function": self.function, "detail": self.detail}


@dataclass(frozen=True)
class _Def:
    qualname: str
    start: int
    end: int
    node: ast.AST


def definitions(source: str) -> list[_Def]:
    """Every function and class in ``source`` with its qualified name and line span."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[_Def] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out.append(_Def(name, start, child.end_lineno or child.lineno, child))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _innermost(defs: list[_Def], lines: list[int]) -> _Def | None:
    holding = [d for d in defs if all(d.start <= n <= d.end for n in lines)]
    return min(holding, key=lambda d: d.end - d.start, default=None)


def hooked_lines(hunk) -> list[list[int]]:
    """Groups of pre-image lines a hunk touches: each removed line alone, and
    for each run of inserted lines its two neighbours (which must share a def)."""
    groups: list[list[int]] = []
    prev_src: int | None = None
    pending_insert = False
    for line in hunk:
        if line.is_added:
            pending_insert = True
            continue
        if line.source_line_no is None:
            continue
        if pending_insert:
            groups.append([n for n in (prev_src, line.source_line_no) if n is not None])
            pending_insert = False
        if line.is_removed:
            groups.append([line.source_line_no])
        prev_src = line.source_line_no
    if pending_insert and prev_src is not None:
        groups.append([prev_src])
    return groups


def patch_drift(patch: Patch, read_old: Reader, read_new: Reader) -> list[Drift]:
    """Drift of ``patch`` between the old and the new pre-image."""
    found: list[Drift] = []
    for pfile in patch.diff:
        path = strip_prefix(pfile.path)
        if not path.endswith(".py") or pfile.is_added_file:
            continue
        blob = next((m[1] for m in map(_INDEX.match, pfile.patch_info) if m), None)
        old, new = read_old(path, blob), read_new(path, None)
        if old is None or new is None:
            continue  # unknown pre-image, or the file is gone (reported as target-gone)
        old_defs, new_defs = definitions(old), {d.qualname: d for d in definitions(new)}
        seen: set[str] = set()
        for i, hunk in enumerate(pfile, 1):
            for group in hooked_lines(hunk):
                d = _innermost(old_defs, group)
                if d is None or d.qualname in seen:
                    continue
                seen.add(d.qualname)
                if detail := _compare(d, new_defs.get(d.qualname), old, new):
                    found.append(Drift(path, i, d.qualname, detail))
    return found


def _compare(old: _Def, new: _Def | None, old_src: str, new_src: str) -> str:
    if new is None:
        return "is gone from the new upstream"
    if ast.dump(old.node) == ast.dump(new.node):
        return ""
    a = old_src.splitlines()[old.start - 1 : old.end]
    b = new_src.splitlines()[new.start - 1 : new.end]
    plus = minus = 0
    for line in difflib.unified_diff(a, b, lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            plus += 1
        elif line.startswith("-") and not line.startswith("---"):
            minus += 1
    return f"was edited upstream (+{plus}/-{minus} lines; was lines {old.start}-{old.end}, now {new.start}-{new.end})"


def series_drift(old_repo, new_repo, patches) -> dict[str, list[Drift]]:
    """Drift of each patch between two base repos (``check --drift-from``).

    The series is applied in scratch indexes of both: on the old base, which
    writes every pre-image blob the patches name into the old repo; on the
    new base, where each patch's new pre-image is read from the index just
    before the patch goes in. Stops at the first patch that does not apply to
    the new base (the table reports it).
    """
    from overlay.gitcmd import git
    from overlay.patching import run_series
    from overlay.tree import scratch

    run_series(old_repo, list(patches), strict=False)

    def read_old(path: str, blob: str | None) -> str | None:
        proc = git(old_repo, "cat-file", "blob", blob, check=False) if blob else None
        return proc.stdout if proc and proc.returncode == 0 else None

    out: dict[str, list[Drift]] = {}
    with scratch(new_repo) as index:

        def read_new(path: str, _blob: str | None) -> str | None:
            proc = git(new_repo, "cat-file", "blob", f":{path}", env=index.env, check=False)
            return proc.stdout if proc.returncode == 0 else None

        for patch in patches:
            out[patch.name] = patch_drift(patch, read_old, read_new)
            if index.apply(patch.data, check=False).returncode != 0:
                break
    return out
