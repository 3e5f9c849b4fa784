"""The tool's own times, with pytest-benchmark: build (warm and cold), apply, check and export.

Run by `benchmarks/bench.py build`, which saves each run under benchmarks/results/tool_timings/
and compares it with the newest saved one. Outside tests/ (pytest.ini: testpaths = tests), so
`python3 apply.py test` never collects it; no engine runs. Every command runs as a user runs
it, `python3 apply.py COMMAND -q`, on a copy of the real series (series, patches/, src/,
upstream.lock, contract.toml) in a temporary folder, with its own caches, dist folders and
trees, so nothing here writes the repository (not dist/, not build/tree, not patches/):

  build warm   the CPU wheel, cache filled (downloads and the base tree)
  build cold   the CPU wheel from a fresh cache holding only the downloaded sdist and binary
               wheel (linked from the user's cache, see overlay/fetch.py's Cache), so the base
               tree is unpacked and committed again; the network is not timed
  apply        the maintainer tree, into a new folder each round
  check        the series' dry run on a scratch tree
  export       the maintainer tree written back over the copy (an unchanged branch rewrites no byte)
  copy wheel   for scale: `cp` of the finished wheel (page-cached), what a build cannot beat

Rounds: pytest-benchmark's own calibration for the commands that can repeat in place
(--benchmark-min-rounds, --benchmark-max-time); build cold and apply need a fresh cache or
folder set up, untimed, before each round, and run --benchmark-min-rounds rounds.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from harness import results  # noqa: E402

from overlay import lock as lockmod  # noqa: E402
from overlay.fetch import Cache, fetch_artifact  # noqa: E402

PYTHON3 = shutil.which("python3") or sys.executable  # as users run apply.py (it re-runs itself in .tool-venv)
SERIES_FILES = ["series", "upstream.lock", "contract.toml"]
SERIES_DIRS = ["patches", "src"]


def apply_py(*args: object) -> None:
    proc = subprocess.run([PYTHON3, str(ROOT / "apply.py"), *map(str, args), "-q"], capture_output=True, text=True)
    assert proc.returncode == 0, f"apply.py {' '.join(map(str, args))}: exit {proc.returncode}\n{proc.stderr[-3000:]}"


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tool-timings")


@pytest.fixture(scope="session")
def series(work: Path) -> Path:
    """A copy of the real series; its ``series`` file."""
    copy = work / "repo"
    copy.mkdir()
    for name in SERIES_FILES:
        shutil.copy2(ROOT / name, copy / name)
    for name in SERIES_DIRS:
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy / "series"


@pytest.fixture(scope="session")
def artifacts() -> list[Path]:
    """The pinned sdist and CPU wheel in the user's cache (fetched there first if missing)."""
    lock = lockmod.load(ROOT / "upstream.lock")
    assert isinstance(lock.source, lockmod.Artifact), "a git-pinned source has no downloaded artifact to reuse"
    cache = Cache.locate(None)
    return [fetch_artifact(art, cache, quiet=True) for art in (lock.source, lock.wheel("cpu"))]


def artifacts_only_cache(where: Path, artifacts: list[Path]) -> Path:
    """A cache folder holding only the downloads (hard links where the file system allows)."""
    downloads = fresh(where) / "downloads"
    downloads.mkdir(parents=True)
    for path in artifacts:
        try:
            os.link(path, downloads / path.name)
        except OSError:
            shutil.copy2(path, downloads / path.name)
    return where


@pytest.fixture(scope="session")
def warm_cache(work: Path, artifacts: list[Path], series: Path) -> Path:
    """A cache with the downloads and the base tree (one untimed build fills it)."""
    cache = artifacts_only_cache(work / "cache-warm", artifacts)
    apply_py("build", "--target", "cpu", "--series", series, "--cache-dir", cache, "--dist", work / "dist-fill")
    return cache


def rounds(request) -> int:
    return max(1, request.config.getoption("benchmark_min_rounds"))


def test_build_warm(benchmark, work, series, warm_cache):
    dist = fresh(work / "dist-warm")
    benchmark(apply_py, "build", "--target", "cpu", "--series", series, "--cache-dir", warm_cache, "--dist", dist)
    (wheel,) = dist.glob("*.whl")
    overlay, upstream = results.wheel_provenance(wheel)
    benchmark.extra_info.update(overlay=overlay, upstream=upstream, wheel=wheel.name, wheel_bytes=wheel.stat().st_size)


def test_copy_wheel(benchmark, work, warm_cache):
    (wheel,) = (work / "dist-fill").glob("*.whl")  # the wheel of warm_cache's filling build
    copy = work / "copy.whl"
    benchmark(subprocess.run, ["cp", str(wheel), str(copy)], check=True)


def test_build_cold(benchmark, request, work, series, artifacts):
    counter = itertools.count()

    def setup():
        n = next(counter)
        fresh(work / f"cache-cold-{n - 1}")  # the last round's base tree: disk, not time
        cache = artifacts_only_cache(work / f"cache-cold-{n}", artifacts)
        dist = fresh(work / "dist-cold")
        return ("build", "--target", "cpu", "--series", series, "--cache-dir", cache, "--dist", dist), {}

    benchmark.pedantic(apply_py, setup=setup, rounds=rounds(request))


def test_apply(benchmark, request, work, series, warm_cache):
    def setup():
        return ("apply", "--series", series, "--cache-dir", warm_cache, "--tree", fresh(work / "tree-apply")), {}

    benchmark.pedantic(apply_py, setup=setup, rounds=rounds(request))


def test_check(benchmark, series, warm_cache):
    benchmark(apply_py, "check", "--series", series, "--cache-dir", warm_cache)


def snapshot(copy: Path) -> dict[str, bytes]:
    """Every file of the series copy, by path."""
    paths = [copy / name for name in SERIES_FILES]
    paths += [p for name in SERIES_DIRS for p in (copy / name).rglob("*") if p.is_file()]
    return {str(p.relative_to(copy)): p.read_bytes() for p in paths}


def test_export(benchmark, work, series, warm_cache):
    tree = fresh(work / "tree-export")
    apply_py("apply", "--series", series, "--cache-dir", warm_cache, "--tree", tree)
    before = snapshot(series.parent)
    benchmark(apply_py, "export", "--series", series, "--cache-dir", warm_cache, "--tree", tree)
    after = snapshot(series.parent)
    # The branch is the series unchanged, so every export writes it back byte for byte.
    assert after == before, sorted(set(before) ^ set(after)) or [k for k in before if before[k] != after[k]]
