"""The series' commands (fetch, check, apply, export, build, rebase, releases, bisect): one handler
each, ``cmd_NAME(args) -> exit code``, declared in overlay/cli.py's table.

A handler finds the release it works on (``_load``), does its work in the module named after it,
and ends in ``report.show``: its JSON report with --json, else its text. Failures are raised
(overlay/errors.py) and reported by overlay/failures.py; modules are imported where used, so
`apply.py --help` loads none of them.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

from overlay import errors, report
from overlay import lock as lockmod
from overlay import series as seriesmod


def _release(args: argparse.Namespace, target: str | None = None):
    """The supported release the command works on (overlay/releases.py)."""
    from overlay import releases

    if args.lock is not None and args.upstream is not None:
        raise errors.InputError("--lock and --upstream are exclusive: --upstream picks a supported release's lock")
    project = args.series.resolve().parent
    if args.lock is not None:
        lock = lockmod.load(args.lock.resolve())
        return releases.Release(lock.version, args.lock.resolve(), None)
    return releases.select(project, args.upstream, target=target)


def _load(args: argparse.Namespace, target: str | None = None):
    from overlay.fetch import Cache

    release = _release(args, target)
    series = seriesmod.load(args.series.resolve(), release.own_patches)
    return release.lock(), series, Cache.locate(args.cache_dir)


def cmd_fetch(args: argparse.Namespace) -> int:
    from overlay.build import default_target
    from overlay.fetch import fetch_artifact
    from overlay.tree import base_repo

    target = args.target or default_target()
    lock, _series, cache = _load(args, target=None if target == "all" else target)
    base = base_repo(lock, cache, quiet=args.quiet)
    targets = list(lock.wheels) if target == "all" else [target]
    wheels = {t: str(fetch_artifact(lock.wheel(t), cache, quiet=args.quiet)) for t in targets}
    report.show(args, {"ok": True, "base_tree": str(base), "wheels": wheels}, f"upstream tree: {base}",
                *(f"{t} wheel: {path} (sha256 verified)" for t, path in wheels.items()))  # fmt: skip
    return errors.OK


def cmd_check(args: argparse.Namespace) -> int:
    """The series applied strictly to a scratch tree: headers, conflicts, offsets, drift, the contract."""
    from overlay.contract import check_tree
    from overlay.families import fit
    from overlay.patching import run_series
    from overlay.tree import base_repo

    lock, series, cache = _load(args)
    problems = [f"patch {p.name}: header lacks {', '.join(missing)}: trailer(s)"
                for p in series.patches if (missing := _missing_trailers(p))]  # fmt: skip
    repo = base_repo(lock, cache, quiet=args.quiet)
    result = run_series(repo, series, strict=True)
    drift = {}
    if args.drift_from:
        from overlay.drift import series_drift

        old = lockmod.load(args.drift_from.resolve())
        drift = series_drift(base_repo(old, cache, quiet=args.quiet), repo, series.patches)
    drifted = {name: found for name, found in drift.items() if found}
    laid = fit(series, repo).laid_modules
    contract = check_tree(series.path, laid, repo, result.tree) if result.tree else []
    ok = result.ok(strict=True) and not problems and not drifted and not contract
    patches = [r.as_json() for r in result.results]
    if args.drift_from:
        for p in patches:
            p["drift"] = [d.as_json() for d in drift.get(p["patch"], [])]
    report.show(
        args,
        {"ok": ok, "series_sha256": series.sha256, "upstream": lock.version, "patches": patches, "problems": problems,
         "contract": contract},
        report.series_table(result, strict=True),
        *(report.stderr(f"error: {problem}") for problem in problems),
        *(f"drift: {name}: {d}" for name, found in drifted.items() for d in found),
        *(f"contract: {line}" for line in contract),
        f"series {series.sha256[:12]}: {'ok' if ok else 'FAILED'} against vLLM {lock.version}",
    )  # fmt: skip
    if problems and result.ok(strict=True):
        return errors.BAD_INPUT
    return errors.OK if ok else errors.PATCH_FAILED


def _missing_trailers(patch) -> list[str]:
    return [t for t in seriesmod.REQUIRED_TRAILERS if t not in patch.trailers()]


def cmd_apply(args: argparse.Namespace) -> int:
    from overlay.maintain import make_tree
    from overlay.tree import base_repo

    lock, series, cache = _load(args)
    result = make_tree(base_repo(lock, cache, quiet=args.quiet), series, args.tree.resolve(), force=args.force,
                       release=lock.version)  # fmt: skip
    next_step = f"tree: {args.tree} (branch 'patched'; base tag 'upstream'). Edit, commit, then `apply.py export`."
    report.show(args, {"ok": True, "tree": str(args.tree), "patches": [r.as_json() for r in result.results]},
                report.series_table(result, strict=False), next_step)  # fmt: skip
    return errors.OK


def cmd_export(args: argparse.Namespace) -> int:
    from overlay.maintain import export

    release = _tree_release(args)
    changes = export(args.tree.resolve(), args.series.resolve(), release.own_patches)
    report.show(args, {"ok": True, "patches": [{"patch": n, "change": c} for n, c in changes]},
                *(f"{change:9} {name}" for name, change in changes))  # fmt: skip
    return errors.OK


def _tree_release(args: argparse.Namespace):
    """The release a maintainer tree belongs to: the one `apply` recorded in it, which
    --upstream, if given, must name."""
    from overlay.maintain import tree_release

    recorded = tree_release(args.tree.resolve())
    if args.upstream and recorded and args.upstream != recorded:
        raise errors.InputError(f"{args.tree} was made for vLLM {recorded}, not {args.upstream}")
    if args.lock is None and args.upstream is None and recorded is not None:
        args.upstream = recorded
    return _release(args)


def cmd_build(args: argparse.Namespace) -> int:
    from overlay.build import build, default_target

    target = args.target or default_target()
    lock, series, cache = _load(args, target=target)
    result = build(lock, series, cache, target, args.dist.resolve(), quiet=args.quiet)
    report.show(args, {"ok": True, "wheel": str(result.wheel), "version": result.version,
                       "provenance": result.provenance, "patches": [r.as_json() for r in result.series.results]},
                None if args.quiet else report.series_table(result.series, strict=False),
                f"built {result.wheel}", f"install: pip install '{result.wheel}'")  # fmt: skip
    return errors.OK


def cmd_rebase(args: argparse.Namespace) -> int:
    from overlay import rebase

    tree = args.tree.resolve()
    if args.abort:
        rebase.abort(tree)
        report.show(args, {"ok": True, "aborted": True, "tree": str(tree)},
                    f"rebase aborted; {tree} removed. series, patches/ and the lock were not touched.")  # fmt: skip
        return errors.OK
    try:
        result = rebase.resume(tree) if args.resume else _rebase_start(args, tree)
    except KeyboardInterrupt:
        if rebase.Rebase(tree).in_progress:
            print(f"rebase interrupted: `apply.py rebase --continue --tree {tree}` resumes it, `--abort` drops "
                  "it; series, patches/ and the lock are untouched", file=sys.stderr)  # fmt: skip
        raise
    report.show(args, result.as_json(), report.rebase_table(result), functools.partial(_rebase_summary, result))
    if not result.completed or result.needs_review:
        return errors.PATCH_FAILED
    return errors.OK


def _rebase_start(args: argparse.Namespace, tree: Path):
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


def cmd_releases(args: argparse.Namespace) -> int:
    from overlay import releases

    project = args.series.resolve().parent
    if args.drop:
        gone = releases.drop(project, args.drop)
        report.show(args, {"ok": True, "dropped": gone.version},
                    f"dropped vLLM {gone.version}: removed {gone.lock_path.parent}")  # fmt: skip
        return errors.OK
    rows = [_release_row(r) for r in releases.supported(project)]
    report.show(args, {"ok": True, "releases": rows}, *_release_lines(rows))
    return errors.OK


def _release_row(release) -> dict:
    lock = release.lock()
    own = release.own_patches
    return {
        "version": release.version,
        "commit": lock.commit,
        "primary": release.primary,
        "lock": str(release.lock_path),
        "wheels": sorted(lock.wheels),
        "wheels_missing": lock.missing_wheels,
        "own_patches": sorted(p.name for p in own.iterdir()) if own and own.is_dir() else [],
    }


def _release_lines(rows: list[dict]) -> Iterator[str]:
    for row in rows:
        wheels = ", ".join(row["wheels"]) or "none"
        role = "primary (patches/)" if row["primary"] else f"{len(row['own_patches'])} patch(es) of its own"
        yield f"vLLM {row['version']} ({row['commit']}): wheels {wheels}; {role}"
        for target, why in sorted(row["wheels_missing"].items()):
            yield f"  no {target} wheel: {why}"


def cmd_bisect(args: argparse.Namespace) -> int:
    from overlay.bisect import bisect

    _lock, series, cache = _load(args)
    result = bisect(args.git_url, args.good, args.bad, series, cache, patch=args.patch, test=args.test,
                    quiet=args.quiet)  # fmt: skip
    report.show(args, result.as_json(),
                *(f"{c['commit'][:12]} {'good' if c['good'] else 'bad '} {c['why']}" for c in result.tested),
                f"first bad commit: {result.first_bad} {result.subject}", f"  {result.why}")  # fmt: skip
    return errors.OK
