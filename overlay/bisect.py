"""bisect: the first upstream commit that breaks the series, a patch, or a test.

Binary search over ``git rev-list --first-parent good..bad`` (so a merged
side branch counts as the one commit that merged it). A commit is *bad* when
the series (or the series up to ``--patch``) does not apply to it with the
rules ``build`` uses (zero fuzz, offsets allowed, already-upstream refused),
or, with ``--test``, when the command exits non-zero in a checkout of the
patched tree (exit 125: this commit cannot be tested, try a neighbour, as in
``git bisect run``). Patches are applied in a scratch index of the cached
clone, so a step costs one ``git apply`` per patch, not a checkout; only
``--test`` writes the patched tree out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from overlay.errors import InputError
from overlay.fetch import Cache, fetch_git
from overlay.gitcmd import git
from overlay.lock import GitSource
from overlay.patching import run_series
from overlay.series import Series

SKIP = 125


@dataclass
class BisectResult:
    first_bad: str
    subject: str
    why: str
    good: str
    bad: str
    tested: list[dict] = field(default_factory=list)

    def as_json(self) -> dict:
        return {
            "ok": True,
            "first_bad": self.first_bad,
            "subject": self.subject,
            "why": self.why,
            "good": self.good,
            "bad": self.bad,
            "tested": self.tested,
        }


def bisect(url: str, good: str, bad: str, series: Series, cache: Cache, *, patch: str | None = None,
           test: str | None = None, quiet: bool = False) -> BisectResult:  # fmt: skip
    repo, good_full = fetch_git(GitSource(url, good), cache, quiet=quiet)
    _repo, bad_full = fetch_git(GitSource(url, bad), cache, quiet=True)
    if git(repo, "merge-base", "--is-ancestor", good_full, bad_full, check=False).returncode != 0:
        raise InputError(f"--good {good} is not an ancestor of --bad {bad}")
    if patch is not None:
        names = [p.name for p in series.patches]
        if patch not in names:
            raise InputError(f"--patch {patch}: not in the series ({', '.join(names)})")
        # the series up to that patch (run_series lays our modules first, fitted to each commit)
        series = replace(series, patches=series.patches[: names.index(patch) + 1])
    commits = git(repo, "rev-list", "--first-parent", "--reverse", f"{good_full}..{bad_full}").stdout.split()
    tested: list[dict] = []

    def probe(commit: str) -> tuple[int, str]:
        code, why = _probe(repo, commit, series, test)
        tested.append({"commit": commit, "good": code == 0, "skipped": code == SKIP, "why": why})
        if not quiet:
            print(f"bisect: {commit[:12]} {'good' if code == 0 else 'skip' if code == SKIP else 'bad'}: {why}",
                  file=sys.stderr)  # fmt: skip
        return code, why

    code, why = probe(good_full)
    if code != 0:
        raise InputError(f"--good {good} is not good: {why}")
    code, bad_why = probe(bad_full)
    if code == 0:
        raise InputError(f"--bad {bad} is not bad: the series applies{' and the test passes' if test else ''}")
    if code == SKIP:
        raise InputError(f"--bad {bad} cannot be tested (the test exited {SKIP})")
    lo, hi = -1, len(commits) - 1  # commits[lo] good (-1: the good commit), commits[hi] bad
    verdicts = {hi: bad_why}
    while hi - lo > 1:
        order = _probe_order(lo, hi)
        for mid in order:
            code, why = probe(commits[mid])
            if code != SKIP:
                break
        else:
            candidates = ", ".join(x[:12] for x in commits[lo + 1 : hi + 1])
            raise InputError(f"only untestable (skipped) commits are left: the first bad commit is one of {candidates}")
        if code == 0:
            lo = mid
        else:
            hi, verdicts[mid] = mid, why
    first = commits[hi]
    subject = git(repo, "log", "-1", "--format=%s", first).stdout.strip()
    return BisectResult(first, subject, verdicts[hi], good_full, bad_full, tested)


def _probe_order(lo: int, hi: int) -> list[int]:
    """The middle of (lo, hi) first, then its neighbours outwards (for skipped commits)."""
    mid = (lo + hi) // 2
    inside = [i for i in range(lo + 1, hi)]
    return sorted(inside, key=lambda i: (abs(i - mid), i))


def _probe(repo: Path, commit: str, series: Series, test: str | None) -> tuple[int, str]:
    result = run_series(repo, series, strict=False, base=commit)
    if not result.ok(strict=False):
        failed = next(r for r in result.results if not r.ok(strict=False))
        where = str(failed.hunk) if failed.hunk else (failed.file or "")
        return 1, f"{failed.patch.name}: {failed.status}" + (f" ({where}: {failed.problem})" if where else "")
    if not test:
        return 0, "the series applies"
    with tempfile.TemporaryDirectory(prefix="overlay-bisect-") as tmp:
        archive = subprocess.run(["git", "archive", "--format=tar", result.tree], cwd=repo, capture_output=True,
                                 check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = {**os.environ, "OVERLAY_TREE": tmp, "OVERLAY_COMMIT": commit}
        proc = subprocess.run(test, shell=True, cwd=tmp, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return 0, "the series applies and the test passes"
    if proc.returncode == SKIP:
        return SKIP, "the test cannot run here (exit 125)"
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return 1, f"the test failed (exit {proc.returncode})" + (": " + " | ".join(tail) if tail else "")
