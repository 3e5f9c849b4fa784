"""What the tool prints: a readable table on stderr/stdout, or JSON with --json.

Every command ends in ``show``: its JSON report with --json (what scripts read), else its text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from rich.console import Console, RenderableType
from rich.table import Table

from overlay.patching import SeriesResult

STYLE = {
    "applied": "green",
    "offset": "yellow",
    "conflict": "bold red",
    "already-upstream": "bold red",
    "not-tried": "dim",
    "clean": "green",
    "merged-3way": "yellow",
    "target-gone": "bold red",
}


def console() -> Console:
    # Logs and pipes get full-width rows, so patch names are never folded.
    width = None if sys.stdout.isatty() else 200
    return Console(file=sys.stdout, highlight=False, width=width)


def series_table(result: SeriesResult, *, strict: bool) -> Table:
    table = Table(title="patch series", title_justify="left")
    for col in ("#", "patch", "status", "files", "hunks", "detail"):
        table.add_column(col, overflow="fold")
    for i, r in enumerate(result.results, 1):
        detail = "; ".join(r.offsets)
        if r.problem:
            where = str(r.hunk) if r.hunk else (r.file or "")
            detail = f"{where}: {r.problem}" if where else r.problem
        if r.status == "offset" and r.shared:
            detail = "shared patch, at this release's offsets: " + detail
        elif r.status == "offset" and strict:
            detail = "offset drift refused by check: " + detail
        style = STYLE.get(r.status, "")
        table.add_row(
            str(i), r.patch.name, f"[{style}]{r.status}[/]", str(len(r.patch.files)),
            str(len(r.patch.hunks())), detail,
        )  # fmt: skip
    return table


def rebase_table(result) -> Table:
    """Per-patch rebase report: status, drift, detail."""
    frm, to = result.old["version"], result.new["version"]
    table = Table(title=f"rebase {frm} -> {to}", title_justify="left")
    for col in ("#", "patch", "status", "drift", "detail"):
        table.add_column(col, overflow="fold")
    for i, s in enumerate(result.steps, 1):
        status = f"[{STYLE.get(s.status, '')}]{s.status}[/]"
        if s.resolution:
            status += f" ({s.resolution})"
        drift = "; ".join(f"{d['function']} ({d['file']} hunk #{d['hunk']}): {d['detail']}" for d in s.drift)
        detail = "; ".join(x for x in (s.detail, *s.offsets) if x)
        table.add_row(str(i), s.patch, status, f"[yellow]{drift}[/]" if drift else "-", detail)
    return table


# A piece of a command's text: a line for stdout, a rich table, a function that prints (stderr()),
# or None for a piece shown only sometimes.
Text = str | RenderableType | Callable[[], object] | None


def show(args: argparse.Namespace, payload: dict, *text: Text) -> None:
    """A command's result: with --json, ``payload`` as the JSON report on stdout and nothing else
    there (scripts parse it); else each piece of ``text`` in turn."""
    if getattr(args, "json", False):  # test and fuzz take no --json
        emit_json(payload)
        return
    for piece in text:
        if piece is None:
            continue
        if isinstance(piece, str):
            print(piece)
        elif callable(piece):
            piece()
        else:
            console().print(piece)


def stderr(*lines: str) -> Callable[[], None]:
    """Text for ``show`` that goes to stderr: errors, and what to do next."""
    return lambda: print(*lines, sep="\n", file=sys.stderr)


def emit_json(payload: dict) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))
