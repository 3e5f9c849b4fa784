"""Command line. Each command is declared once, in ``COMMANDS`` at the end of this file
(name, help, options, handler); the parser (overlay/cmdline.py), ``--help`` and this list come
from it (tests/tool/test_cli.py checks this list against the table). The handlers:
overlay/commands.py (the series' commands), overlay/testrun.py (test), overlay/fuzz/ (fuzz).

Commands, in the order a user meets them:
  build     fetch what is missing, apply the series, write the wheel to dist/
  fetch     download and verify the pinned source and binary wheel(s) into the cache
  check     dry-run the series on a scratch tree; fail on any conflict, offset drift, patch
            already upstream, or patch header without trailers
  apply     create the maintainer tree (build/tree, branch 'patched': a commit laying in src/,
            then one commit per patch)
  export    write the maintainer tree back: new files to src/, changes to upstream files to
            patches/ and series
  test      run the test suite (pytest on every supported release; [--upstream VERSION] and
            pytest arguments: on that one release); --fast: the tool's tests and our src/tests
            unit tests, no engine
  fuzz      differential fuzzing against the upstream wheel: seeded random mixed batches on both
            builds, compared token for token (--minutes M, --report FILE; `fuzz --help` for the
            rest)
  rebase    replay the series onto a new upstream release or commit (3-way), per-patch status
            and drift; --continue / --abort after a conflict
  releases  list the supported vLLM releases (--upstream VERSION picks one for any command);
            --drop VERSION stops supporting one
  bisect    find the first upstream commit that breaks the series (or a patch, or a test
            command)

The options every command of the series takes (``COMMON``) may also stand before the command
(`apply.py --upstream 0.34.0 check`); given in both places, the one after the command wins, and
one before a command that does not take it is refused (overlay/cmdline.py).

Exit codes: ``overlay/errors.py`` (``EXIT_CODES``), shown by ``apply.py --help``; how a failure
becomes its code: overlay/failures.py.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from overlay import ROOT, cmdline, commands, errors, failures, testrun
from overlay import lock as lockmod
from overlay.cmdline import Arg, Command, arg

DESCRIPTION = """\
Build vLLM with this repository's patch series applied.

The series (our files in src/, then the hooks in series + patches/) applies
to the upstream vLLM pinned in upstream.lock. `build` lays the patched Python
files over the pinned binary wheel and writes dist/<name>-<version>+ovl...whl;
install it with pip.
"""

UPSTREAM = arg("--upstream", metavar="VERSION", default=None,
               help="which supported vLLM release (`apply.py releases` lists them; default: for build and fetch "
               "the newest with a binary wheel for the target, else the primary release)")  # fmt: skip
# Options every command of the series takes; they may also stand before the command.
COMMON = (
    arg("--series", type=Path, default=ROOT / "series",
        help="series file; patches are read from patches/ beside it (default: %(default)s)"),
    UPSTREAM,
    arg("--lock", type=Path, default=None,
        help="a lock file to use instead of the supported releases' (default: upstream.lock beside the series, "
        "or releases/VERSION/upstream.lock with --upstream)"),
    arg("--cache-dir", default=None,
        help="download and base-tree cache (default: $VLLM_OVERLAY_CACHE or ~/.cache/vllm-overlay)"),
    arg("--json", action="store_true", help="print a JSON report on stdout"),
    arg("-q", "--quiet", action="store_true", help="no progress output"),
)  # fmt: skip


def _tree_option(where: str, what: str) -> Arg:
    return arg("--tree", type=Path, default=ROOT / "build" / where, help=f"{what} (default: %(default)s)")


FORCE_TREE = arg("--force", action="store_true", help="replace an existing tree (it may hold unexported work)")
# Where an internal error's traceback goes (overlay/failures.py).
CRASH_DIR = ROOT / "build" / "crashes"


def main(argv: list[str]) -> int:
    command, args = parse(argv)
    return failures.run_guarded(command.run, args, crash_dir=CRASH_DIR)


def parse(argv: list[str]) -> tuple[Command, argparse.Namespace]:
    """The command ``argv`` names and its arguments (argparse's own message and exit 2 where they are wrong)."""
    return cmdline.parse(argv, COMMANDS, COMMON, description=DESCRIPTION, epilog=_epilog())


def command_list() -> str:
    """The commands with their help line, as --help's epilog and the module docstring show them."""
    width = max(len(c.name) for c in COMMANDS) + 2
    lines = []
    for c in COMMANDS:
        lines += textwrap.wrap(c.help, 96, initial_indent=f"  {c.name:<{width}}", subsequent_indent=" " * (width + 2))
    return "\n".join(lines)


def _epilog() -> str:
    return f"commands, in the order a user meets them:\n{command_list()}\n\n{errors.help_epilog()}"


def _cmd_fuzz(args: argparse.Namespace) -> int:
    # Imported when fuzz runs, not with this module: the fuzzer's package puts tests/ on sys.path.
    from overlay.fuzz.command import cmd_fuzz

    return cmd_fuzz(args)


COMMANDS = (
    Command(
        "build", "fetch what is missing, apply the series, write the wheel to dist/", commands.cmd_build,
        "Fetch what is missing, apply the series and write the wheel.",
        options=(
            arg("--target", choices=lockmod.TARGETS, default=None,
                help="which binary wheel to extend (default: cuda where a GPU is present, else cpu)"),
            arg("--dist", type=Path, default=ROOT / "dist", help="output folder (default: %(default)s)"),
        ),
    ),
    Command(
        "fetch", "download and verify the pinned source and binary wheel(s) into the cache", commands.cmd_fetch,
        "Download the pinned source and wheels into the cache, verifying sha256.",
        options=(
            arg("--target", choices=(*lockmod.TARGETS, "all"), default=None,
                help="which binary wheel(s) to fetch besides the source (default: this machine's)"),
        ),
    ),
    Command(
        "check", "dry-run the series on a scratch tree; fail on any conflict, offset drift, patch already "
        "upstream, or patch header without trailers", commands.cmd_check,
        "Apply the series (src/, then the patches) to a scratch copy of the pin. Fails on any conflict, offset "
        "drift, patch already upstream, missing header trailer, or an upstream name contract.toml lists that "
        "the patched tree lacks.",
        options=(
            arg("--drift-from", type=Path, default=None, metavar="LOCK",
                help="also flag drift: a function or class a hunk hooks that changed between this older pin and "
                "the current one, even when the patch applies"),
        ),
    ),
    Command(
        "apply", "create the maintainer tree (build/tree, branch 'patched': a commit laying in src/, then one "
        "commit per patch)", commands.cmd_apply,
        "Create a git checkout of the pin on branch 'patched' (tag 'upstream' marks the base): one commit "
        "laying in src/, then one commit per patch.",
        options=(_tree_option("tree", "where"), FORCE_TREE),
    ),
    Command(
        "export", "write the maintainer tree back: new files to src/, changes to upstream files to patches/ "
        "and series", commands.cmd_export,
        "Export upstream..HEAD of the maintainer tree: the files it adds to src/, its changes to upstream files "
        "as patches; deterministic, so an unchanged branch rewrites no byte. Staged and moved into place: an "
        "export that fails leaves src/, patches/ and series as they were.",
        options=(_tree_option("tree", "which tree"),),
    ),
    Command(
        "test", "run the test suite (pytest on every supported release; [--upstream VERSION] and pytest "
        "arguments: on that one release); --fast: the tool's tests and our src/tests unit tests, no engine",
        testrun.cmd_test,
        "Run the test suite with pytest; arguments this command does not know go to pytest.",
        options=(
            arg("--upstream", metavar="VERSION", default=None,
                help="the supported vLLM release to test (default: every one; with pytest arguments or --fast, "
                "the newest with a CPU wheel)"),
            arg("--fast", action="store_true",
                help="only tests/tool and our src/tests unit tests (in build/venvs/overlay, made if missing); "
                "no engine starts"),
        ),
        common=False, passes_on="pytest",
    ),
    Command(
        "fuzz", "differential fuzzing against the upstream wheel: seeded random mixed batches on both builds, "
        "compared token for token (--minutes M, --report FILE; `fuzz --help` for the rest)", _cmd_fuzz,
        options=(UPSTREAM,), common=False, passes_on="fuzzer", own_help=False,
    ),
    Command(
        "rebase", "replay the series onto a new upstream release or commit (3-way), per-patch status and drift; "
        "--continue / --abort after a conflict", commands.cmd_rebase,
        "Replay the series onto a new vLLM release or commit with git's 3-way merge and report each patch "
        "(clean, merged-3way, conflict, already-upstream, target-gone) and its drift. Stops at the first "
        "conflict with the tree left for resolution. On success the lock, series and patches/ are rewritten; "
        "until then they are not touched.",
        one_of=(
            arg("--to", metavar="VERSION", help="a release: its sdist from the package index"),
            arg("--to-commit", metavar="SHA", help="a commit of --git-url"),
            arg("--continue", dest="resume", action="store_true",
                help="resume after resolving a stop (or after a refused finish)"),
            arg("--abort", action="store_true", help="drop the rebase and its tree"),
        ),
        options=(
            arg("--add", action="store_true",
                help="keep the current primary release supported beside the new one (its pin and, where its hunks "
                "differ, its own patches go to releases/VERSION/); default: the new pin replaces it"),
            arg("--git-url", help="repository of --to-commit"),
            arg("--upstream-version",
                help="version to record for --to-commit (default: from the wheel, else the last release tag)"),
            arg("--wheel", action="append", default=[], metavar="TARGET=URL",
                help="binary wheel for --to-commit by URL (sha256 recorded from the download)"),
            arg("--wheel-index", action="append", default=[], metavar="TARGET=URL",
                help="find the --to-commit wheel on a simple index, e.g. vLLM's per-commit "
                "https://wheels.vllm.ai/<commit>/ (sha256 recorded from the download)"),
            _tree_option("rebase", "rebase tree"),
            arg("--force", action="store_true", help="replace an existing rebase tree that holds no rebase"),
        ),
    ),
    Command(
        "releases", "list the supported vLLM releases (--upstream VERSION picks one for any command); "
        "--drop VERSION stops supporting one", commands.cmd_releases,
        "List the supported vLLM releases (the primary, whose hunks patches/ holds, then the others under "
        "releases/) with their commit, binary wheels and own patches; --drop removes one.",
        options=(arg("--drop", metavar="VERSION", help="stop supporting this release (not the primary)"),),
    ),
    Command(
        "bisect", "find the first upstream commit that breaks the series (or a patch, or a test command)",
        commands.cmd_bisect,
        "Binary search over the first-parent history good..bad of --git-url for the first commit where the "
        "series (or the series up to --patch) stops applying, or, with --test, where the command fails in the "
        "patched tree.",
        options=(
            arg("--git-url", required=True, help="upstream repository (URL or path)"),
            arg("--good", required=True, help="a commit where the series applies (and the test passes)"),
            arg("--bad", required=True, help="a later commit where it does not"),
            arg("--patch", help="only the series up to and including this patch"),
            arg("--test", help="shell command run in the patched tree; non-zero exit = broken (125: skip)"),
        ),
    ),
)  # fmt: skip
