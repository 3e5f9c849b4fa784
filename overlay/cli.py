"""Command line: fetch, check, apply, export, build, test, rebase, bisect, fuzz.

Exit codes: 0 ok; 1 a patch conflicts, drifts or is already upstream;
2 bad input (series, lock, patch file, arguments); 3 download or checksum
failure; 4 build refused (the series cannot be laid over a binary wheel);
130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

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

EPILOG = """\
commands, in the order a user meets them:
  build     fetch what is missing, apply the series, write the wheel to dist/
  fetch     download and verify the pinned source and binary wheel(s) into the cache
  check     dry-run the series on a scratch tree; fail on any conflict, offset
            drift, patch already upstream, or patch header without trailers
  apply     create the maintainer tree (build/tree, branch 'patched': a commit laying in
            src/, then one commit per patch)
  export    write the maintainer tree back: new files to src/, changes to upstream
            files to patches/ and series
  test      run the test suite (pytest; extra arguments go to pytest)
  fuzz      differential fuzzing against the upstream wheel: seeded random mixed
            batches on both builds, compared token for token (--minutes M,
            --report FILE; `fuzz --help` for the rest)
  rebase    replay the series onto a new upstream release or commit (3-way),
            per-patch status and drift; --continue / --abort after a conflict
  releases  list the supported vLLM releases (--upstream VERSION picks one for any
            command); --drop VERSION stops supporting one
  bisect    find the first upstream commit that breaks the series (or a patch,
            or a test command)

exit codes: 0 ok, 1 patch failed, 2 bad input, 3 fetch/checksum failed,
4 build refused, 130 interrupted
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="apply.py", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--version", action="version", version=f"vllm-overlay {OVERLAY_VERSION}")
    sub = p.add_subparsers(dest="command", required=True, metavar="command")

    common = _common_options()
    for add in (_add_build, _add_fetch, _add_check, _add_apply, _add_export, _add_rebase, _add_releases,
                _add_bisect):  # fmt: skip
        add(sub, common)
    sub.add_parser("test", help="run the test suite on every supported release ([--upstream VERSION] and "
                   "arguments after it go to pytest, on that one release)", add_help=False)  # fmt: skip
    sub.add_parser("fuzz", help="fuzz the overlay against upstream (tests/support/fuzz.py)", add_help=False)
    return p


def _common_options() -> argparse.ArgumentParser:
    """Options every command takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--series",
        type=Path,
        default=ROOT / "series",
        help="series file; patches are read from patches/ beside it (default: %(default)s)",
    )
    common.add_argument(
        "--upstream",
        metavar="VERSION",
        default=None,
        help="which supported vLLM release (`apply.py releases` lists them; default: for build and fetch "
        "the newest with a binary wheel for the target, else the primary release)",
    )
    common.add_argument("--lock", type=Path, default=None,
                        help="a lock file to use instead of the supported releases' (default: upstream.lock "
                        "beside the series, or releases/VERSION/upstream.lock with --upstream)")  # fmt: skip
    common.add_argument(
        "--cache-dir",
        default=None,
        help="download and base-tree cache (default: $VLLM_OVERLAY_CACHE or ~/.cache/vllm-overlay)",
    )
    common.add_argument("--json", action="store_true", help="print a JSON report on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress output")

    return common


def _add_build(sub, common: argparse.ArgumentParser) -> None:
    b = sub.add_parser(
        "build",
        parents=[common],
        help="build the patched wheel into dist/",
        description="Fetch what is missing, apply the series and write the wheel.",
    )
    b.add_argument(
        "--target",
        choices=lockmod.TARGETS,
        default=None,
        help="which binary wheel to extend (default: cuda where a GPU is present, else cpu)",
    )
    b.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder (default: %(default)s)")


def _add_fetch(sub, common: argparse.ArgumentParser) -> None:
    f = sub.add_parser(
        "fetch",
        parents=[common],
        help="download and verify pinned artifacts",
        description="Download the pinned source and wheels into the cache, verifying sha256.",
    )
    f.add_argument(
        "--target",
        choices=(*lockmod.TARGETS, "all"),
        default=None,
        help="which binary wheel(s) to fetch besides the source (default: this machine's)",
    )


def _add_check(sub, common: argparse.ArgumentParser) -> None:
    c = sub.add_parser(
        "check",
        parents=[common],
        help="dry-run the series strictly on a scratch tree",
        description="Apply the series (src/, then the patches) to a scratch copy of the pin. Fails on any "
        "conflict, offset drift, patch already upstream, missing header trailer, or an upstream name "
        "contract.toml lists that the patched tree lacks.",
    )
    c.add_argument(
        "--drift-from",
        type=Path,
        default=None,
        metavar="LOCK",
        help="also flag drift: a function or class a hunk hooks that changed between this "
        "older pin and the current one, even when the patch applies",
    )


def _add_apply(sub, common: argparse.ArgumentParser) -> None:
    a = sub.add_parser(
        "apply",
        parents=[common],
        help="create the maintainer tree",
        description="Create a git checkout of the pin on branch 'patched' (tag 'upstream' marks the "
        "base): one commit laying in src/, then one commit per patch.",
    )
    a.add_argument("--tree", type=Path, default=ROOT / "build" / "tree", help="where (default: %(default)s)")
    a.add_argument("--force", action="store_true", help="replace an existing tree (loses unexported work)")


def _add_export(sub, common: argparse.ArgumentParser) -> None:
    e = sub.add_parser(
        "export",
        parents=[common],
        help="write src/, patches/ and series from the tree",
        description="Export upstream..HEAD of the maintainer tree: the files it adds to src/, its "
        "changes to upstream files as patches; deterministic, so an unchanged branch rewrites no byte.",
    )
    e.add_argument("--tree", type=Path, default=ROOT / "build" / "tree", help="which tree (default: %(default)s)")


def _add_rebase(sub, common: argparse.ArgumentParser) -> None:
    r = sub.add_parser(
        "rebase",
        parents=[common],
        help="replay the series onto a new upstream (3-way)",
        description="Replay the series onto a new vLLM release or commit with git's 3-way merge and "
        "report each patch (clean, merged-3way, conflict, already-upstream, target-gone) and its "
        "drift. Stops at the first conflict with the tree left for resolution. On success the "
        "lock, series and patches/ are rewritten; until then they are not touched.",
    )
    to = r.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", metavar="VERSION", help="a release: its sdist from the package index")
    to.add_argument("--to-commit", metavar="SHA", help="a commit of --git-url")
    to.add_argument("--continue", dest="resume", action="store_true", help="resume after resolving a stop")
    to.add_argument("--abort", action="store_true", help="drop the rebase and its tree")
    r.add_argument("--add", action="store_true",
                   help="keep the current primary release supported beside the new one (its pin and, where its "
                   "hunks differ, its own patches go to releases/VERSION/); default: the new pin replaces "
                   "it")  # fmt: skip
    r.add_argument("--git-url", help="repository of --to-commit")
    r.add_argument("--upstream-version", help="version to record for --to-commit (default: from the wheel, "
                   "else the last release tag)")  # fmt: skip
    r.add_argument("--wheel", action="append", default=[], metavar="TARGET=URL",
                   help="binary wheel for --to-commit by URL (sha256 recorded from the download)")  # fmt: skip
    r.add_argument("--wheel-index", action="append", default=[], metavar="TARGET=URL",
                   help="find the --to-commit wheel on a simple index, e.g. vLLM's per-commit "
                   "https://wheels.vllm.ai/<commit>/ (sha256 recorded from the download)")  # fmt: skip
    r.add_argument("--tree", type=Path, default=ROOT / "build" / "rebase", help="rebase tree (default: %(default)s)")
    r.add_argument("--force", action="store_true", help="replace an existing rebase tree that holds no rebase")


def _add_releases(sub, common: argparse.ArgumentParser) -> None:
    r = sub.add_parser(
        "releases",
        parents=[common],
        help="list the supported vLLM releases, or drop one",
        description="List the supported vLLM releases (the primary, whose hunks patches/ holds, then the "
        "others under releases/) with their commit, binary wheels and own patches; --drop removes one.",
    )
    r.add_argument("--drop", metavar="VERSION", help="stop supporting this release (not the primary)")


def _add_bisect(sub, common: argparse.ArgumentParser) -> None:
    bi = sub.add_parser(
        "bisect",
        parents=[common],
        help="find the first upstream commit that breaks the series",
        description="Binary search over the first-parent history good..bad of --git-url for the first "
        "commit where the series (or the series up to --patch) stops applying, or, with --test, "
        "where the command fails in the patched tree.",
    )
    bi.add_argument("--git-url", required=True, help="upstream repository (URL or path)")
    bi.add_argument("--good", required=True, help="a commit where the series applies (and the test passes)")
    bi.add_argument("--bad", required=True, help="a later commit where it does not")
    bi.add_argument("--patch", help="only the series up to and including this patch")
    bi.add_argument("--test", help="shell command run in the patched tree; non-zero exit = broken (125: skip)")


def main(argv: list[str]) -> int:
    if argv[:1] == ["test"]:
        return _run_tests(argv[1:])
    if argv[:1] == ["fuzz"]:
        return _run_fuzzer(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except OverlayError as e:
        return _fail(args, e)
    except KeyboardInterrupt:
        print("interrupted; nothing was left half-written", file=sys.stderr)
        return errors.INTERRUPTED
    except subprocess.CalledProcessError as e:  # a git step the tool did not expect to fail
        print(f"error: {' '.join(map(str, e.cmd))} failed:\n{e.stderr}", file=sys.stderr)
        return errors.BAD_INPUT


def _fail(args, e: OverlayError) -> int:
    result = getattr(e, "result", None)
    if args.json:
        payload = {"ok": False, "error": str(e), "exit_code": e.exit_code}
        if result is not None:
            payload["patches"] = [r.as_json() for r in result.results]
        report.emit_json(payload)
    else:
        if result is not None:
            report.console().print(report.series_table(result, strict=args.command == "check"))
        print(f"error: {e}", file=sys.stderr)
    return e.exit_code


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


def _run_tests(args: list[str]) -> int:
    """`test [--upstream VERSION] [pytest arguments]`.

    With arguments: pytest on one release (--upstream, else the default CPU
    release). Without: the whole suite on the default release, then the tests
    marked every_release on each other supported release.
    """
    from overlay import releases

    version = None
    if args[:1] == ["--upstream"] and len(args) > 1:
        version, args = args[1], args[2:]
    elif args and args[0].startswith("--upstream="):
        version, args = args[0].split("=", 1)[1], args[1:]
    try:
        default = releases.select(ROOT, target="cpu")
        runs = [(version or default.version, args)]
        if version is None and not args:
            others = [r.version for r in releases.supported(ROOT) if r.version != default.version]
            runs += [(v, ["-m", EVERY_RELEASE]) for v in others]
        else:
            releases.select(ROOT, version)
    except OverlayError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    worst = 0
    for v, pytest_args in runs:
        print(f"== tests on vLLM {v}: pytest {' '.join(pytest_args)}", flush=True)
        env = {**os.environ, TEST_RELEASE_ENV: v}
        code = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env).returncode
        worst = worst or code
    return worst


def _run_fuzzer(fuzz_args: list[str]) -> int:
    cmd = [sys.executable, str(ROOT / "tests" / "support" / "fuzz.py"), *fuzz_args]
    return subprocess.run(cmd, cwd=ROOT, env=dict(os.environ)).returncode


COMMANDS = {
    "fetch": cmd_fetch,
    "check": cmd_check,
    "apply": cmd_apply,
    "export": cmd_export,
    "build": cmd_build,
    "rebase": cmd_rebase,
    "releases": cmd_releases,
    "bisect": cmd_bisect,
}
