"""Command line. Each command is declared once, in ``COMMANDS`` at the end of this file
(name, help, options, handler); the parser, ``--help`` and this list come from it
(tests/tool/test_cli.py checks this list against the table).

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

Exit codes: ``overlay/errors.py`` (``EXIT_CODES``), shown by ``apply.py --help``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlay import ROOT, errors, report
from overlay import __version__ as OVERLAY_VERSION
from overlay import lock as lockmod
from overlay import series as seriesmod
from overlay.errors import OverlayError

DESCRIPTION = """\
Build vLLM with this repository's patch series applied.

The series (our files in src/, then the hooks in series + patches/) applies
to the upstream vLLM pinned in upstream.lock. `build` lays the patched Python
files over the pinned binary wheel and writes dist/<name>-<version>+ovl...whl;
install it with pip.
"""


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    name: str
    help: str  # one line for --help's command list (and this module's docstring)
    run: Callable[[argparse.Namespace], int]
    description: str = ""
    options: tuple[Arg, ...] = ()
    one_of: tuple[Arg, ...] = ()  # exactly one of these is required
    common: bool = True  # takes COMMON (--series, --upstream, --json, ...)
    # Where arguments the command does not know go ("pytest"; none: they are an error).
    passes_on: str = ""
    own_help: bool = True  # False: --help goes on too (fuzz.py's own)


UPSTREAM = arg("--upstream", metavar="VERSION", default=None,
               help="which supported vLLM release (`apply.py releases` lists them; default: for build and fetch "
               "the newest with a binary wheel for the target, else the primary release)")  # fmt: skip
# Options every command of the series takes.
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="apply.py", description=DESCRIPTION, epilog=_epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--version", action="version", version=f"vllm-overlay {OVERLAY_VERSION}")
    sub = p.add_subparsers(dest="command", required=True, metavar="command", help="one of those listed below")
    for command in COMMANDS:
        _add_command(sub, command)
    return p


def _add_command(sub, command: Command) -> None:
    usage = f"apply.py {command.name} [options] [{command.passes_on} arguments]" if command.passes_on else None
    c = sub.add_parser(command.name, description=command.description or command.help, usage=usage,
                       add_help=command.own_help, allow_abbrev=not command.passes_on)  # fmt: skip
    for a in (*(COMMON if command.common else ()), *command.options):
        c.add_argument(*a.flags, **a.options)
    if command.one_of:
        group = c.add_mutually_exclusive_group(required=True)
        for a in command.one_of:
            group.add_argument(*a.flags, **a.options)


def command_list() -> str:
    """The commands with their help line, as --help's epilog and the module docstring show them."""
    width = max(len(c.name) for c in COMMANDS) + 2
    lines = []
    for c in COMMANDS:
        lines += textwrap.wrap(c.help, 96, initial_indent=f"  {c.name:<{width}}", subsequent_indent=" " * (width + 2))
    return "\n".join(lines)


def _epilog() -> str:
    return f"commands, in the order a user meets them:\n{command_list()}\n\n{errors.help_epilog()}"


def main(argv: list[str]) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    command = next(c for c in COMMANDS if c.name == args.command)
    if extra and not command.passes_on:
        parser.parse_args(argv)  # argparse's own "unrecognized arguments" message and exit code
    args.passed_on = extra
    return _run_guarded(command, args)


def _run_guarded(command: Command, args: argparse.Namespace) -> int:
    """Run a command; turn each way it can fail into its message and exit code (overlay/errors.py)."""
    try:
        return command.run(args)
    except OverlayError as e:
        return _fail(args, e)
    except KeyboardInterrupt:
        return _report_error(args, "interrupted; every file the tool writes is staged and moved into place, so "
                             "none was left half-written", errors.INTERRUPTED)  # fmt: skip
    except subprocess.CalledProcessError as e:
        if _is_git(e):
            return _git_failed(args, e)
        return _internal_error(args, command.name)
    except Exception:
        return _internal_error(args, command.name)


def _is_git(e: subprocess.CalledProcessError) -> bool:
    cmd = e.cmd if isinstance(e.cmd, list | tuple) else str(e.cmd).split()
    return bool(cmd) and Path(str(cmd[0])).name == "git"


def _git_failed(args, e: subprocess.CalledProcessError) -> int:
    """A git step the tool expected to succeed failed: git's own words, and not "bad input"."""
    where = f" in {e.cwd}" if getattr(e, "cwd", None) else ""
    stderr = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else e.stderr or ""
    message = (f"error: git failed{where} (exit {e.returncode}): {' '.join(map(str, e.cmd))}\n{stderr.strip()}\n"
               "(a problem with git, that tree or the disk, not with the series)")  # fmt: skip
    return _report_error(args, message, errors.GIT_FAILED)


def _internal_error(args, command: str) -> int:
    """An exception nobody expected: one line naming the command and the file with the traceback,
    and its own exit code, so a script does not read a bug as a conflict or as bad input."""
    text = traceback.format_exc()
    path = _write_crash_report(command, text)
    if path is None:
        print(text, file=sys.stderr, end="")
    where = f"traceback in {path}" if path else "traceback above"
    message = f"internal error in `apply.py {command}` (a bug in the tool, not in the series): {where}"
    return _report_error(args, message, errors.INTERNAL_ERROR)


CRASH_DIR = ROOT / "build" / "crashes"


def _write_crash_report(command: str, text: str) -> Path | None:
    """Write the traceback to build/crashes/ (the temp folder where that fails); None: nowhere."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    for folder in (CRASH_DIR, Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=folder, prefix=f"apply-{command}-{stamp}-", suffix=".txt")
            with os.fdopen(fd, "w") as f:
                f.write(f"apply.py {command} (vllm-overlay {OVERLAY_VERSION})\n{text}")
            return Path(name)
        except OSError:
            continue
    return None


def _fail(args, e: OverlayError) -> int:
    result = getattr(e, "result", None)
    if result is not None and not getattr(args, "json", False):
        report.console().print(report.series_table(result, strict=args.command == "check"))
    patches = [r.as_json() for r in result.results] if result is not None else None
    return _report_error(args, f"error: {e}", e.exit_code, patches=patches)


def _report_error(args, message: str, code: int, *, patches: list | None = None) -> int:
    """``message`` on stderr; with --json also the JSON report scripts read on stdout."""
    if getattr(args, "json", False):
        payload = {"ok": False, "error": message.removeprefix("error: "), "exit_code": code}
        if patches is not None:
            payload["patches"] = patches
        report.emit_json(payload)
    else:
        print(message, file=sys.stderr)
    return code


def _release(args, target: str | None = None):
    """The supported release the command works on (overlay/releases.py)."""
    from overlay import releases

    if args.lock is not None and args.upstream is not None:
        raise errors.InputError("--lock and --upstream are exclusive: --upstream picks a supported release's lock")
    project = args.series.resolve().parent
    if args.lock is not None:
        lock = lockmod.load(args.lock.resolve())
        return releases.Release(lock.version, args.lock.resolve(), None)
    return releases.select(project, args.upstream, target=target)


def _load(args, target: str | None = None):
    from overlay.fetch import Cache

    release = _release(args, target)
    series = seriesmod.load(args.series.resolve(), release.own_patches)
    return release.lock(), series, Cache.locate(args.cache_dir)


def cmd_fetch(args) -> int:
    from overlay.build import default_target
    from overlay.fetch import fetch_artifact
    from overlay.tree import base_repo

    target = args.target or default_target()
    lock, _series, cache = _load(args, target=None if target == "all" else target)
    base = base_repo(lock, cache, quiet=args.quiet)
    targets = list(lock.wheels) if target == "all" else [target]
    wheels = {t: str(fetch_artifact(lock.wheel(t), cache, quiet=args.quiet)) for t in targets}
    if args.json:
        report.emit_json({"ok": True, "base_tree": str(base), "wheels": wheels})
    else:
        print(f"upstream tree: {base}")
        for t, path in wheels.items():
            print(f"{t} wheel: {path} (sha256 verified)")
    return errors.OK


def _series_report(args, strict: bool) -> int:
    from overlay.contract import check_tree
    from overlay.families import fit
    from overlay.patching import run_series
    from overlay.tree import base_repo

    lock, series, cache = _load(args)
    problems = []
    if strict:
        for p in series.patches:
            missing = [t for t in seriesmod.REQUIRED_TRAILERS if t not in p.trailers()]
            if missing:
                problems.append(f"patch {p.name}: header lacks {', '.join(missing)}: trailer(s)")
    repo = base_repo(lock, cache, quiet=args.quiet)
    result = run_series(repo, series, strict=strict)
    drift = {}
    if getattr(args, "drift_from", None):
        from overlay.drift import series_drift

        old = lockmod.load(args.drift_from.resolve())
        drift = series_drift(base_repo(old, cache, quiet=args.quiet), repo, series.patches)
    drifted = {name: found for name, found in drift.items() if found}
    laid = fit(series, repo).laid_modules
    contract = check_tree(series.path, laid, repo, result.tree) if result.tree else []
    ok = result.ok(strict) and not problems and not drifted and not contract
    if args.json:
        patches = [r.as_json() for r in result.results]
        if args.drift_from:
            for p in patches:
                p["drift"] = [d.as_json() for d in drift.get(p["patch"], [])]
        report.emit_json({
            "ok": ok, "series_sha256": series.sha256, "upstream": lock.version,
            "patches": patches, "problems": problems, "contract": contract,
        })  # fmt: skip
    else:
        report.console().print(report.series_table(result, strict=strict))
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        for name, found in drifted.items():
            for d in found:
                print(f"drift: {name}: {d}")
        for line in contract:
            print(f"contract: {line}")
        print(f"series {series.sha256[:12]}: {'ok' if ok else 'FAILED'} against vLLM {lock.version}")
    if problems and result.ok(strict):
        return errors.BAD_INPUT
    return errors.OK if ok else errors.PATCH_FAILED


def cmd_check(args) -> int:
    return _series_report(args, strict=True)


def cmd_apply(args) -> int:
    from overlay.maintain import make_tree
    from overlay.tree import base_repo

    lock, series, cache = _load(args)
    result = make_tree(base_repo(lock, cache, quiet=args.quiet), series, args.tree.resolve(), force=args.force,
                       release=lock.version)  # fmt: skip
    if args.json:
        report.emit_json({"ok": True, "tree": str(args.tree), "patches": [r.as_json() for r in result.results]})
    else:
        report.console().print(report.series_table(result, strict=False))
        print(f"tree: {args.tree} (branch 'patched'; base tag 'upstream'). Edit, commit, then `apply.py export`.")
    return errors.OK


def cmd_export(args) -> int:
    from overlay.maintain import export

    release = _tree_release(args)
    changes = export(args.tree.resolve(), args.series.resolve(), release.own_patches)
    if args.json:
        report.emit_json({"ok": True, "patches": [{"patch": n, "change": c} for n, c in changes]})
    else:
        for name, change in changes:
            print(f"{change:9} {name}")
    return errors.OK


def _tree_release(args):
    """The release a maintainer tree belongs to: the one `apply` recorded in it, which
    --upstream, if given, must name."""
    from overlay.maintain import tree_release

    recorded = tree_release(args.tree.resolve())
    if args.upstream and recorded and args.upstream != recorded:
        raise errors.InputError(f"{args.tree} was made for vLLM {recorded}, not {args.upstream}")
    if args.lock is None and args.upstream is None and recorded is not None:
        args.upstream = recorded
    return _release(args)


def cmd_build(args) -> int:
    from overlay.build import build, default_target

    target = args.target or default_target()
    lock, series, cache = _load(args, target=target)
    result = build(lock, series, cache, target, args.dist.resolve(), quiet=args.quiet)
    if args.json:
        report.emit_json({"ok": True, "wheel": str(result.wheel), "version": result.version,
                          "provenance": result.provenance,
                          "patches": [r.as_json() for r in result.series.results]})  # fmt: skip
    else:
        if not args.quiet:
            report.console().print(report.series_table(result.series, strict=False))
        print(f"built {result.wheel}")
        print(f"install: pip install '{result.wheel}'")
    return errors.OK


def cmd_rebase(args) -> int:
    from overlay import rebase

    tree = args.tree.resolve()
    if args.abort:
        rebase.abort(tree)
        if args.json:
            report.emit_json({"ok": True, "aborted": True, "tree": str(tree)})
        else:
            print(f"rebase aborted; {tree} removed. series, patches/ and the lock were not touched.")
        return errors.OK
    try:
        result = rebase.resume(tree) if args.resume else _rebase_start(args, tree)
    except KeyboardInterrupt:
        if rebase.Rebase(tree).in_progress:
            print(f"rebase interrupted: `apply.py rebase --continue --tree {tree}` resumes it, `--abort` drops "
                  "it; series, patches/ and the lock are untouched", file=sys.stderr)  # fmt: skip
        raise
    if args.json:
        report.emit_json(result.as_json())
    else:
        report.console().print(report.rebase_table(result))
        _rebase_summary(result)
    if not result.completed or result.needs_review:
        return errors.PATCH_FAILED
    return errors.OK


def _rebase_start(args, tree: Path):
    from overlay import rebase

    if args.to_commit and not args.git_url:
        raise errors.InputError("--to-commit needs --git-url")
    if args.to and (args.git_url or args.wheel or args.wheel_index or args.upstream_version):
        raise errors.InputError("--git-url, --wheel(-index) and --upstream-version go with --to-commit, not --to")
    from overlay.tree import base_repo
    from overlay.upstream import resolve_commit, resolve_release

    lock, series, cache = _load(args)
    rebase.check_can_start(tree, force=args.force)
    if args.to:
        new = resolve_release(args.to, lock, cache, quiet=args.quiet)
    else:
        new = resolve_commit(
            args.git_url, args.to_commit, cache, version=args.upstream_version,
            wheel_urls=dict(_target_url(w) for w in args.wheel),
            wheel_indexes=dict(_target_url(w) for w in args.wheel_index),
            distributions={t: a.distribution for t, a in lock.wheels.items()}, quiet=args.quiet,
        )  # fmt: skip
    old_base = base_repo(lock, cache, quiet=args.quiet)
    new_base = base_repo(new, cache, quiet=args.quiet)
    return rebase.start(lock, new, series, old_base, new_base, tree, force=args.force, add=args.add,
                        base_of=lambda pin: base_repo(pin, cache, quiet=args.quiet))  # fmt: skip


def _target_url(spec: str) -> tuple[str, str]:
    target, sep, url = spec.partition("=")
    if not sep or not url:
        raise errors.InputError(f"--wheel/--wheel-index {spec!r}: expected TARGET=URL")
    return target, url


def _rebase_summary(result) -> None:
    frm, to = result.old, result.new
    print(f"rebase vLLM {frm['version']} ({frm['commit'][:12]}) -> {to['version']} ({to['commit'][:12]})")
    stop = result.stopped_at
    if stop:
        print(f"stopped at {stop.patch} ({stop.status}): resolve in {result.tree} (edit, `git add`), then "
              "`apply.py rebase --continue`; or `apply.py rebase --abort`. series, patches/ and the lock "
              "are untouched.", file=sys.stderr)  # fmt: skip
        return
    print(f"series {result.series_before[:12]} -> {result.series_after[:12]}; lock and patches/ written")
    for target, why in sorted(result.missing_wheels.items()):
        print(f"note: no {target} wheel: {why}; `build --target {target}` will refuse")
    for line in result.contract:
        print(f"contract: {line}", file=sys.stderr)
    if result.needs_review:
        print("review needed: a patch drifted or was dropped (see the table), or the contract broke",
              file=sys.stderr)  # fmt: skip


def cmd_releases(args) -> int:
    from overlay import releases

    project = args.series.resolve().parent
    if args.drop:
        gone = releases.drop(project, args.drop)
        if args.json:
            report.emit_json({"ok": True, "dropped": gone.version})
        else:
            print(f"dropped vLLM {gone.version}: removed {gone.lock_path.parent}")
        return errors.OK
    rows = []
    for r in releases.supported(project):
        lock = r.lock()
        own = sorted(p.name for p in r.own_patches.iterdir()) if r.own_patches and r.own_patches.is_dir() else []
        rows.append(
            {
                "version": r.version,
                "commit": lock.commit,
                "primary": r.primary,
                "lock": str(r.lock_path),
                "wheels": sorted(lock.wheels),
                "wheels_missing": lock.missing_wheels,
                "own_patches": own,
            }
        )
    if args.json:
        report.emit_json({"ok": True, "releases": rows})
        return errors.OK
    for row in rows:
        wheels = ", ".join(row["wheels"]) or "none"
        role = "primary (patches/)" if row["primary"] else f"{len(row['own_patches'])} patch(es) of its own"
        print(f"vLLM {row['version']} ({row['commit']}): wheels {wheels}; {role}")
        for target, why in sorted(row["wheels_missing"].items()):
            print(f"  no {target} wheel: {why}")
    return errors.OK


def cmd_bisect(args) -> int:
    from overlay.bisect import bisect

    lock, series, cache = _load(args)
    result = bisect(args.git_url, args.good, args.bad, series, cache, patch=args.patch, test=args.test,
                    quiet=args.quiet)  # fmt: skip
    if args.json:
        report.emit_json(result.as_json())
    else:
        for c in result.tested:
            print(f"{c['commit'][:12]} {'good' if c['good'] else 'bad '} {c['why']}")
        print(f"first bad commit: {result.first_bad} {result.subject}")
        print(f"  {result.why}")
    return errors.OK


# The real tests' release (tests/support/venvs.py reads it).
TEST_RELEASE_ENV = "OVERLAY_TEST_UPSTREAM"
# What runs on each supported release besides the default one (pytest.ini's marker).
EVERY_RELEASE = "every_release"
# `test --fast`: the tool's tests, then our src/tests unit tests in the overlay venv (no engine).
TOOL_TESTS = "tests/tool"
SRC_UNIT_TESTS = ROOT / "tests" / "src_unit_tests.py"


def cmd_test(args) -> int:
    """`test [--upstream VERSION] [--fast] [pytest arguments]`.

    With arguments: pytest on one release (--upstream, else the default CPU
    release). Without: the whole suite on the default release, then the tests
    marked every_release on each other supported release.
    """
    if args.fast:
        return _fast_tests(args.upstream, args.passed_on)
    worst = 0
    for version, pytest_args in _test_runs(args.upstream, args.passed_on):
        print(f"== tests on vLLM {version}: pytest {' '.join(pytest_args)}", flush=True)
        code = _pytest(version, pytest_args)  # every release runs, whatever an earlier one gave
        worst = worst or code
    return worst


def _test_runs(version: str | None, pytest_args: list[str]) -> list[tuple[str, list[str]]]:
    from overlay import releases

    default = releases.select(ROOT, target="cpu")
    if version is not None:
        releases.select(ROOT, version)  # an unknown release is bad input, before any test runs
    runs = [(version or default.version, pytest_args)]
    if version is None and not pytest_args:
        others = [r.version for r in releases.supported(ROOT) if r.version != default.version]
        runs += [(v, ["-m", EVERY_RELEASE]) for v in others]
    return runs


def _pytest(version: str, pytest_args: list[str]) -> int:
    env = {**os.environ, TEST_RELEASE_ENV: version}
    return subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env).returncode


def _fast_tests(version: str | None, pytest_args: list[str]) -> int:
    """The tool's tests and, beside them, our src/tests unit tests (tests/src_unit_tests.py, its
    output shown when the tool tests are done): the two take about as long, so side by side."""
    from overlay import releases

    release = releases.select(ROOT, version, target=None if version else "cpu").version
    env = {**os.environ, TEST_RELEASE_ENV: release}
    print(f"== test --fast on vLLM {release}: {TOOL_TESTS}, and our src/tests unit tests beside them", flush=True)
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        # niced: the tool tests are the longer part, so they get the CPU first
        units = subprocess.Popen(["nice", "-n", "10", sys.executable, str(SRC_UNIT_TESTS), *pytest_args], cwd=ROOT,
                                 env=env, stdout=log, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        tool = subprocess.run([sys.executable, "-m", "pytest", TOOL_TESTS, *pytest_args], cwd=ROOT, env=env)
        tool_s = time.monotonic() - start
        units.wait()
        log.seek(0)
        print(f"== src/tests unit tests:\n{log.read()}", end="", flush=True)
    print(f"== test --fast: tool tests {_outcome(tool.returncode)} in {tool_s:.0f} s, src/tests unit tests "
          f"{_outcome(units.returncode)}; {time.monotonic() - start:.0f} s in all", flush=True)  # fmt: skip
    return tool.returncode or units.returncode


def _outcome(code: int) -> str:
    return "passed" if code == 0 else f"FAILED (exit {code})"


def cmd_fuzz(args) -> int:
    """tests/support/fuzz.py with the rest of the arguments; --upstream picks the release its venvs hold."""
    from overlay import releases

    env = dict(os.environ)
    if args.upstream is not None:
        env[TEST_RELEASE_ENV] = releases.select(ROOT, args.upstream).version
    cmd = [sys.executable, str(ROOT / "tests" / "support" / "fuzz.py"), *args.passed_on]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


COMMANDS = (
    Command(
        "build", "fetch what is missing, apply the series, write the wheel to dist/", cmd_build,
        "Fetch what is missing, apply the series and write the wheel.",
        options=(
            arg("--target", choices=lockmod.TARGETS, default=None,
                help="which binary wheel to extend (default: cuda where a GPU is present, else cpu)"),
            arg("--dist", type=Path, default=ROOT / "dist", help="output folder (default: %(default)s)"),
        ),
    ),
    Command(
        "fetch", "download and verify the pinned source and binary wheel(s) into the cache", cmd_fetch,
        "Download the pinned source and wheels into the cache, verifying sha256.",
        options=(
            arg("--target", choices=(*lockmod.TARGETS, "all"), default=None,
                help="which binary wheel(s) to fetch besides the source (default: this machine's)"),
        ),
    ),
    Command(
        "check", "dry-run the series on a scratch tree; fail on any conflict, offset drift, patch already "
        "upstream, or patch header without trailers", cmd_check,
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
        "commit per patch)", cmd_apply,
        "Create a git checkout of the pin on branch 'patched' (tag 'upstream' marks the base): one commit "
        "laying in src/, then one commit per patch.",
        options=(_tree_option("tree", "where"), FORCE_TREE),
    ),
    Command(
        "export", "write the maintainer tree back: new files to src/, changes to upstream files to patches/ "
        "and series", cmd_export,
        "Export upstream..HEAD of the maintainer tree: the files it adds to src/, its changes to upstream files "
        "as patches; deterministic, so an unchanged branch rewrites no byte. Staged and moved into place: an "
        "export that fails leaves src/, patches/ and series as they were.",
        options=(_tree_option("tree", "which tree"),),
    ),
    Command(
        "test", "run the test suite (pytest on every supported release; [--upstream VERSION] and pytest "
        "arguments: on that one release); --fast: the tool's tests and our src/tests unit tests, no engine",
        cmd_test,
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
        "compared token for token (--minutes M, --report FILE; `fuzz --help` for the rest)", cmd_fuzz,
        options=(UPSTREAM,), common=False, passes_on="fuzz.py", own_help=False,
    ),
    Command(
        "rebase", "replay the series onto a new upstream release or commit (3-way), per-patch status and drift; "
        "--continue / --abort after a conflict", cmd_rebase,
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
        "--drop VERSION stops supporting one", cmd_releases,
        "List the supported vLLM releases (the primary, whose hunks patches/ holds, then the others under "
        "releases/) with their commit, binary wheels and own patches; --drop removes one.",
        options=(arg("--drop", metavar="VERSION", help="stop supporting this release (not the primary)"),),
    ),
    Command(
        "bisect", "find the first upstream commit that breaks the series (or a patch, or a test command)",
        cmd_bisect,
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
