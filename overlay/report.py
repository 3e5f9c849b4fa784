"""What the tool prints: a readable table on stderr/stdout, or JSON with --json."""

from __future__ import annotations

import json
import sys

from rich.console import Console
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


def emit_json(payload: dict) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))
