"""Our unit tests (src/tests/, in upstream's style) on the overlay build, with no engine start.

``apply.py test --fast`` runs this script after the tool tests (pytest arguments
are passed on). It runs every test file the patched tree of the release under
test adds under tests/ (the module layer lays src/tests/ there, so whichever of
our tests that release's tree holds), from a copy of that tree's tests/ folder
(upstream's helpers such as tests/v1/core/utils.py sit beside ours), with the
vLLM installed in the overlay venv the real tests use (build/venvs/overlay,
tests/support/venvs.py). That venv is made, or its wheel rebuilt and
reinstalled, the normal way when it is missing or its installed files differ
from the tree. As tests/upstream_suite/run.sh does (where these tests also run,
in the long suite): an offline Hugging Face cache that resolves
facebook/opt-125m, with the config run.sh writes, and the distributed tests in
a pytest process of their own.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support import venvs  # noqa: E402

from overlay import series as seriesmod  # noqa: E402
from overlay.fetch import Cache  # noqa: E402
from overlay.patching import run_series  # noqa: E402
from overlay.tree import base_repo, changed_files, read_blob  # noqa: E402

# What the tests import beyond vLLM (tests/conftest.py imports tblib); the versions
# tests/real/test_upstream_suite.py installs for the same files.
TEST_DEPS = ("pytest==9.1.0", "tblib==3.1.0")
RUN_SH = ROOT / "tests" / "upstream_suite" / "run.sh"
OPT_125M = "models--facebook--opt-125m"
NO_TESTS_RAN = 5  # pytest's exit code when the arguments select nothing
# Upstream's tests/conftest.py tears every test down with cleanup_dist_env_and_memory() (a full
# gc.collect with torch loaded: ~0.5 s a test here, 30 of the 40 s these tests take) unless the
# test is marked skip_global_cleanup, which its docstring offers to CPU unit tests. Ours start no
# engine and no distributed group, so the fast loop marks them all; run.sh keeps the cleanup.
NO_CLEANUP_PLUGIN = "overlay_no_global_cleanup"
NO_CLEANUP = """\
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.skip_global_cleanup)
"""


def patched_tree() -> tuple[Path, str]:
    """(base repo, git tree of the patched source) of the release under test."""
    release = venvs.release_under_test()
    series = seriesmod.load(ROOT / "series", release.own_patches)
    repo = base_repo(release.lock(), Cache.locate(None), quiet=True)
    result = run_series(repo, series, strict=False)
    if result.tree is None:
        failed = next(r for r in result.results if not r.ok(strict=False))
        sys.exit(f"the series does not apply to vLLM {release.version} ({failed.patch.name}): `apply.py check`")
    return repo, result.tree


def our_tests(repo: Path, tree: str) -> list[str]:
    """The test files the series adds under tests/ (ours; upstream's are not run here)."""
    added = [path for status, path in changed_files(repo, tree) if status == "A"]
    return sorted(p for p in added if p.startswith("tests/") and Path(p).name.startswith("test_"))


def overlay_python(repo: Path, tree: str) -> Path:
    """The overlay venv's python, (re)made unless its installed vLLM matches the tree."""
    where = venvs.venv_dir("overlay")
    python = where / "bin" / "python"
    stale = _stale_files(python, repo, tree) if python.exists() else ["(no venv)"]
    if stale:
        print(f"[fast] {where}: rebuilding ({len(stale)} file(s) differ, e.g. {stale[0]})", flush=True)
        python = venvs.vllm_venv(where, venvs.overlay_wheel())
    if subprocess.run([python, "-c", "import pytest, tblib"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "--quiet", *TEST_DEPS], check=True)
    return python


def _stale_files(python: Path, repo: Path, tree: str) -> list[str]:
    """Python files the series changes under vllm/ whose installed copy differs from the tree's."""
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    changed = [p for s, p in changed_files(repo, tree) if s != "D" and p.startswith("vllm/") and p.endswith(".py")]
    return [p for p in changed if not _same(Path(site) / p, read_blob(repo, tree, p))]


def _same(path: Path, data: bytes) -> bool:
    return path.is_file() and path.read_bytes() == data


def lay_out(repo: Path, tree: str, work: Path) -> None:
    """The patched tree's tests/ folder, a pytest.ini, the cleanup plugin and the offline model cache,
    in ``work``."""
    # git() decodes its output as text: the archive is read as bytes here
    data = subprocess.run(["git", "archive", "--format=tar", tree, "tests"], cwd=repo, capture_output=True,
                          check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(work, filter="data")
    (work / "pytest.ini").write_text("[pytest]\nmarkers =\n    skip_global_cleanup\n    cpu_test\n")
    (work / f"{NO_CLEANUP_PLUGIN}.py").write_text(NO_CLEANUP)
    snapshot = work / "hf" / "hub" / OPT_125M / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(_opt_125m_config())
    (work / "hf" / "hub" / OPT_125M / "refs").mkdir()
    (work / "hf" / "hub" / OPT_125M / "refs" / "main").write_text("0" * 40)


def _opt_125m_config() -> str:
    """The facebook/opt-125m config.json run.sh writes (one copy: taken from run.sh)."""
    found = re.search(r"cat > \"\$SNAP/config.json\" <<'EOF'\n(.*?\n)EOF\n", RUN_SH.read_text(), re.S)
    if not found:
        sys.exit(f"{RUN_SH}: no facebook/opt-125m config.json heredoc found (has run.sh changed?)")
    return found.group(1)


def run(python: Path, work: Path, files: list[str], pytest_args: list[str]) -> int:
    """pytest on ``files``: the distributed tests in their own process (as run.sh does)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_MODEL_REDIRECT_PATH")}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(work / "hf" / "hub"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    groups = [[f for f in files if not f.startswith("tests/distributed/")],
              [f for f in files if f.startswith("tests/distributed/")]]  # fmt: skip
    worst = 0
    for group in (g for g in groups if g):
        cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-p", NO_CLEANUP_PLUGIN, *pytest_args, *group]
        code = subprocess.run(cmd, cwd=work, env=env).returncode
        if code == NO_TESTS_RAN and pytest_args:
            code = 0  # the arguments selected none of these (e.g. -k for a tool test)
        worst = worst or code
    return worst


def main(pytest_args: list[str]) -> int:
    start = time.monotonic()
    repo, tree = patched_tree()
    files = our_tests(repo, tree)
    if not files:
        print("[fast] the patched tree holds none of our unit tests (src/tests/)")
        return 1
    python = overlay_python(repo, tree)
    print(f"[fast] {len(files)} file(s) with {python} (ready in {time.monotonic() - start:.0f} s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="overlay-unit-tests-") as tmp:
        lay_out(repo, tree, Path(tmp))
        return run(python, Path(tmp), files, pytest_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
