"""The real series on every supported release's pin: zero fuzz, vLLM's own style."""

import json
import shutil
import subprocess
import sys

import pytest
from support.cli import ROOT

from overlay import releases
from overlay import series as seriesmod

RELEASES = [r.version for r in releases.supported(ROOT)]


@pytest.mark.parametrize("version", RELEASES)
def test_series_applies_to_pin_with_zero_fuzz_and_no_drift(version):
    proc = subprocess.run([sys.executable, str(ROOT / "apply.py"), "check", "--upstream", version, "--json", "-q"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["upstream"] == version
    release = releases.select(ROOT, version)
    series = seriesmod.load(ROOT / "series", release.own_patches)
    names = [p.name for p in series.applied]
    assert [p["patch"] for p in report["patches"]] == names and series.layer and series.patches
    for p in report["patches"]:
        assert applies_as_written(p), p
        assert p["shared"] == (not release.primary and p["patch"] not in own_names(release)), p
    assert report["contract"] == []  # every upstream name contract.toml lists is in the pin


def applies_as_written(patch: dict) -> bool:
    """A patch's status in a check report: applied as written, or a shared patch (written against
    the primary) applied to another release at its offsets."""
    return patch["status"] == "applied" or (patch["status"] == "offset" and patch["shared"])


def own_names(release) -> set[str]:
    own = release.own_patches
    return {p.name for p in own.iterdir()} if own and own.is_dir() else set()


def test_design_doc_patch_table_counts_the_upstream_lines_each_patch_touches():
    """Each row of the patch table in docs/design.md ("The patches") names a patch of some supported
    release, the releases that take it, and the lines it adds and removes per file as written for
    the newest of them."""
    rows = [line for line in (ROOT / "docs" / "design.md").read_text().splitlines() if line.startswith("| `00")]
    newest, takers = {}, {}
    for release in releases.supported(ROOT):  # the primary first, then newest first
        for patch in seriesmod.load(ROOT / "series", release.own_patches).patches:
            newest.setdefault(patch.name, patch)
            takers.setdefault(patch.name, []).append(release.version)
    assert len(rows) == len(newest)
    for row, name in zip(rows, sorted(newest), strict=True):
        short, taken_by, touched = (cell.strip() for cell in row.split("|")[1:4])
        assert name.startswith(short.strip("`")), (short, name)
        assert taken_by == ", ".join(takers[name]), name
        expected = ", ".join(f"`{f.removeprefix('vllm/')}` +{a} -{r}" for f, a, r in newest[name].touched())
        assert touched == expected, name


def test_patches_change_only_upstream_files():
    """New files live in src/ (the module layer), never as new-file hunks in a patch."""
    series = seriesmod.load(ROOT / "series")
    for patch in series.patches:
        assert not [f.path for f in patch.diff if f.is_added_file], patch.name
    assert {m.path for m in series.modules} >= {
        "vllm/v1/worker/model_runner_v1_multi_step/window.py",
        "vllm/v1/core/sched/multi_step.py",
    }


@pytest.mark.parametrize("version", RELEASES)
def test_patched_python_passes_vllm_ruff(version, tmp_path):
    """Patches follow vLLM's ruff config (pyproject.toml of the pin), so they could go upstream,
    and every patched Python file byte-compiles."""
    tree = tmp_path / "tree"
    proc = subprocess.run([sys.executable, str(ROOT / "apply.py"), "apply", "-q", "--upstream", version, "--tree",
                           str(tree)], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    changed = subprocess.run(["git", "diff", "--name-only", "--diff-filter=AM", "upstream..patched"],
                             cwd=tree, capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    py = [f for f in changed if f.endswith(".py")]
    assert py
    ruff = [sys.executable, "-m", "ruff"]
    check = subprocess.run([*ruff, "check", *py], cwd=tree, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    fmt = subprocess.run([*ruff, "format", "--check", *py], cwd=tree, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout
    # and they byte-compile (on a release whose CPU build cannot run here, the one check of
    # every patched file that does not depend on importing it)
    compiled = subprocess.run([sys.executable, "-m", "py_compile", *py], cwd=tree, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr


def test_commit_pin_from_local_git_repo_of_the_sdist(tmp_path, lock):
    """A commit pin (git URL + commit) instead of the sdist: the upstream git
    host is unreachable here, so the repository is made from the real sdist."""
    import dataclasses
    import tarfile
    import zipfile

    from overlay.fetch import Cache, fetch_artifact
    from overlay.lock import GitSource, dump

    sdist = fetch_artifact(lock.source, Cache.locate(None), quiet=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    repo = tmp_path / "x" / f"vllm-{lock.version}"
    git = ["git", "-c", "user.name=u", "-c", "user.email=u@u"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A", "-f"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", f"v{lock.version}"], cwd=repo, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()

    # The project's own layout (every supported release), with this release's lock pinned to the commit.
    project = tmp_path / "project"
    project.mkdir()
    for ours in ("series", "upstream.lock"):
        (project / ours).write_bytes((ROOT / ours).read_bytes())
    for ours in ("patches", "releases"):
        shutil.copytree(ROOT / ours, project / ours)
    for ours in ("src", "contract.toml"):
        (project / ours).symlink_to(ROOT / ours)
    pinned = dataclasses.replace(lock, source=GitSource(str(repo), commit))
    dump(pinned, project / releases.select(ROOT, lock.version).lock_path.relative_to(ROOT))
    args = ["--series", str(project / "series"), "--upstream", lock.version]
    args += ["--cache-dir", str(tmp_path / "cache"), "--json", "-q"]
    # the binary wheel comes from the shared cache, not the network
    (tmp_path / "cache" / "downloads").mkdir(parents=True)
    wheel = fetch_artifact(lock.wheel("cpu"), Cache.locate(None), quiet=True)
    (tmp_path / "cache" / "downloads" / wheel.name).symlink_to(wheel)

    check = subprocess.run([sys.executable, str(ROOT / "apply.py"), "check", *args], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    report = json.loads(check.stdout)
    assert report["upstream"] == lock.version and report["patches"]
    assert all(applies_as_written(p) for p in report["patches"]), report["patches"]
    build = subprocess.run(
        [sys.executable, str(ROOT / "apply.py"), "build", "--target", "cpu", "--dist", str(tmp_path / "dist"), *args],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    out = json.loads(build.stdout)
    assert out["provenance"]["upstream"]["source"] == {"kind": "git", "url": str(repo), "commit": commit}
    with zipfile.ZipFile(out["wheel"]) as z:
        assert b"def version_line" in z.read("vllm/overlay.py")
