"""How a command's failure reaches the user: its message, and the exit code overlay/errors.py
gives that kind of failure.

``run_guarded`` runs a command and turns each way it can fail into one: an ``OverlayError`` is
its own message and code; a git command that failed is git's words and code 5 (git-failed); any
other exception is a bug in the tool, code 70 (internal-error), named in one line with the file
holding its traceback (in ``crash_dir``: overlay/cli.py's CRASH_DIR, build/crashes/), so a script
does not read a bug as a conflict or as bad input; Ctrl-C is code 130. With --json the same goes
into the JSON report scripts parse.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from overlay import __version__ as OVERLAY_VERSION
from overlay import errors, report
from overlay.errors import OverlayError


def run_guarded(run: Callable[[argparse.Namespace], int], args: argparse.Namespace, *, crash_dir: Path) -> int:
    """``run(args)``'s exit code, or the code of the way it failed (a traceback into ``crash_dir``)."""
    try:
        return run(args)
    except OverlayError as e:
        return _fail(args, e)
    except KeyboardInterrupt:
        return _report_error(args, "interrupted; every file the tool writes is staged and moved into place, so "
                            "none was left half-written", errors.INTERRUPTED)  # fmt: skip
    except subprocess.CalledProcessError as e:
        if _is_git(e):
            return _git_failed(args, e)
        return _internal_error(args, crash_dir)
    except Exception:
        return _internal_error(args, crash_dir)


def _report_error(args: argparse.Namespace, message: str, code: int, *, patches: list | None = None,
                 table: report.Text = None) -> int:  # fmt: skip
    """``message`` on stderr (after ``table``); with --json the JSON report scripts read, on stdout."""
    payload = {"ok": False, "error": message.removeprefix("error: "), "exit_code": code}
    if patches is not None:
        payload["patches"] = patches
    report.show(args, payload, table, report.stderr(message))
    return code


def _fail(args: argparse.Namespace, e: OverlayError) -> int:
    """An error the user can act on; a series that failed to apply also shows its table."""
    result = getattr(e, "result", None)
    if result is None:
        return _report_error(args, f"error: {e}", e.exit_code)
    table = report.series_table(result, strict=args.command == "check")
    return _report_error(args, f"error: {e}", e.exit_code, patches=[r.as_json() for r in result.results], table=table)


def _is_git(e: subprocess.CalledProcessError) -> bool:
    cmd = e.cmd if isinstance(e.cmd, list | tuple) else str(e.cmd).split()
    return bool(cmd) and Path(str(cmd[0])).name == "git"


def _git_failed(args: argparse.Namespace, e: subprocess.CalledProcessError) -> int:
    """A git step the tool expected to succeed failed: git's own words, and not "bad input"."""
    where = f" in {e.cwd}" if getattr(e, "cwd", None) else ""
    stderr = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else e.stderr or ""
    message = (f"error: git failed{where} (exit {e.returncode}): {' '.join(map(str, e.cmd))}\n{stderr.strip()}\n"
               "(a problem with git, that tree or the disk, not with the series)")  # fmt: skip
    return _report_error(args, message, errors.GIT_FAILED)


def _internal_error(args: argparse.Namespace, crash_dir: Path) -> int:
    """An exception nobody expected: one line naming the command and the file with the traceback,
    and its own exit code, so a script does not read a bug as a conflict or as bad input."""
    text = traceback.format_exc()
    path = _write_crash_report(crash_dir, args.command, text)
    if path is None:
        print(text, file=sys.stderr, end="")
    where = f"traceback in {path}" if path else "traceback above"
    message = f"internal error in `apply.py {args.command}` (a bug in the tool, not in the series): {where}"
    return _report_error(args, message, errors.INTERNAL_ERROR)


def _write_crash_report(crash_dir: Path, command: str, text: str) -> Path | None:
    """Write the traceback into ``crash_dir`` (the temp folder where that fails); None: nowhere."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    for folder in (crash_dir, Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=folder, prefix=f"apply-{command}-{stamp}-", suffix=".txt")
            with os.fdopen(fd, "w") as f:
                f.write(f"apply.py {command} (vllm-overlay {OVERLAY_VERSION})\n{text}")
            return Path(name)
        except OSError:
            continue
    return None
