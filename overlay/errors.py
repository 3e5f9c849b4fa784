"""Errors the tool reports to users, and the exit codes scripts can rely on.

``EXIT_CODES`` is the one place the codes are written: the constants below,
``apply.py --help``'s epilog and README.md's table (between the
``exit-codes`` markers) are all made from it. After editing it, run
``python3 -m overlay.errors --write README.md``; tests/tool/test_exit_codes.py
fails while README.md's table differs. How a command's failure becomes its code (and the
traceback file of an internal error): overlay/failures.py.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ExitCode:
    code: int
    name: str
    meaning: str


EXIT_CODES = (
    ExitCode(0, "ok", "done; for `rebase`, also nothing to review"),
    ExitCode(1, "patch-failed", "a patch conflicts, drifts or is already upstream; `rebase` stopped at a patch, "
             "or finished with something to review"),
    ExitCode(2, "bad-input", "something the user can fix: the series, a lock, a patch file, the arguments, "
             "a tree in the wrong state"),
    ExitCode(3, "fetch-failed", "a download failed or a checksum did not match"),
    ExitCode(4, "build-refused", "the series cannot be laid over the binary wheel"),
    ExitCode(5, "git-failed", "a git command failed where the tool expected it to succeed (git's own message "
             "is shown): look at the tree it names, the disk and git itself, not at the series"),
    ExitCode(70, "internal-error", "a bug in the tool: the message names the command and the file holding "
             "the traceback; please report it with that file"),
    ExitCode(130, "interrupted", "interrupted (Ctrl-C); files the tool writes are written whole or not at all"),
)  # fmt: skip
_BY_NAME = {e.name: e.code for e in EXIT_CODES}

OK = _BY_NAME["ok"]
PATCH_FAILED = _BY_NAME["patch-failed"]
BAD_INPUT = _BY_NAME["bad-input"]
FETCH_FAILED = _BY_NAME["fetch-failed"]
BUILD_REFUSED = _BY_NAME["build-refused"]
GIT_FAILED = _BY_NAME["git-failed"]
INTERNAL_ERROR = _BY_NAME["internal-error"]
INTERRUPTED = _BY_NAME["interrupted"]

README_BEGIN = "<!-- exit-codes:begin -->"
README_END = "<!-- exit-codes:end -->"


def help_epilog() -> str:
    """The exit codes for ``apply.py --help``."""
    lines = ["exit codes:"]
    for e in EXIT_CODES:
        lines += textwrap.wrap(e.meaning, 96, initial_indent=f"  {e.code:<4} {e.name:<15} ", subsequent_indent=" " * 23)
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The exit codes as README.md's table (the lines between its markers)."""
    rows = ["| code | name | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{e.code}` | {e.name} | {e.meaning} |" for e in EXIT_CODES]
    return "\n".join(rows) + "\n"


def readme_block(text: str) -> str:
    """What ``text`` (README.md) holds between the exit-code markers."""
    begin, end = _marker_span(text)
    return text[begin:end]


def write_readme(path: Path) -> bool:
    """Rewrite the exit-code table in ``path``; True when it changed."""
    text = path.read_text()
    begin, end = _marker_span(text)
    new = text[:begin] + markdown_table() + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


def _marker_span(text: str) -> tuple[int, int]:
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise InputError(f"no {README_BEGIN!r} ... {README_END!r} block")
    return begin + len(README_BEGIN) + 1, end


class OverlayError(Exception):
    """A failure the user can act on; ``str()`` is the message shown."""

    exit_code = BAD_INPUT


class InputError(OverlayError):
    exit_code = BAD_INPUT


class FetchError(OverlayError):
    exit_code = FETCH_FAILED


class PatchError(OverlayError):
    exit_code = PATCH_FAILED

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result  # the SeriesResult to report, when there is one


class BuildRefused(OverlayError):
    exit_code = BUILD_REFUSED


def _main(argv: list[str]) -> int:
    """``python3 -m overlay.errors [--write README.md]``: print the table, or write it into a README."""
    if argv[:1] == ["--write"] and len(argv) == 2:
        changed = write_readme(Path(argv[1]))
        print(f"{argv[1]}: {'exit-code table rewritten' if changed else 'exit-code table up to date'}")
        return OK
    if argv:
        print("usage: python3 -m overlay.errors [--write README.md]", file=sys.stderr)
        return BAD_INPUT
    print(markdown_table(), end="")
    return OK


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
