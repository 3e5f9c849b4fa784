"""`apply.py test`: pytest on every supported release as CI runs it, on one release, or `--fast`
(the tool's tests and our src/tests unit tests, side by side, no engine).

Each run is a pytest process of its own with the release in TEST_RELEASE_ENV, which the real
tests' venvs (tests/support/venvs.py) read; `apply.py fuzz` picks its release the same way.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from overlay import ROOT

# The real tests' release (tests/support/venvs.py reads it).
TEST_RELEASE_ENV = "OVERLAY_TEST_UPSTREAM"
# What runs on each supported release besides the default one (pytest.ini's marker).
EVERY_RELEASE = "every_release"
# `test --fast`: the tool's tests, then our src/tests unit tests in the overlay venv (no engine).
TOOL_TESTS = "tests/tool"
SRC_UNIT_TESTS = ROOT / "tests" / "src_unit_tests.py"


def cmd_test(args: argparse.Namespace) -> int:
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
