"""Where things are: the repository, the benchmark results, the build folders."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
TESTS = ROOT / "tests"
SUPPORT = TESTS / "support"  # the tests' helpers: tiny model builders, engines, venvs
BUILD = ROOT / "build"
VENVS = BUILD / "venvs"  # build/venvs/{upstream,overlay}, shared with the test suite
MODELS = BUILD / "models"  # locally built models (bench-*: the benchmarks' own)
