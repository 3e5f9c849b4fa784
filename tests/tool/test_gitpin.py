"""Commit pins: the source comes from a git URL + commit (fetched with the git command line).

The upstream git host is unreachable here, so the repository is a local one
built from the synthetic source, with two commits.
"""

import subprocess
import tarfile

from support.cli import run_json
from support.synthetic import ENGINE, file_patch, lock_text, sha256

from overlay import errors


def _git_upstream(tmp_path, upstream):
    repo = tmp_path / "upstream-git"
    with tarfile.open(upstream.sdist) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    (tmp_path / "x" / "fakevllm-1.0.0").rename(repo)
    git = ["git", "-c", "user.name=u", "-c", "user.email=u@u"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "v1"], cwd=repo, check=True)
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    (repo / "vllm/engine.py").write_text(ENGINE.replace("x + 20\n", "x + 20  # main moved on\n"))
    subprocess.run([*git, "commit", "-q", "-am", "main moves"], cwd=repo, check=True)
    second = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    return repo, first, second


def _pin(upstream, url, commit):
    source = f'[source]\nkind = "git"\nurl = "{url}"\ncommit = "{commit}"\n'
    (upstream.root / "upstream.lock").write_text(lock_text("0" * 64, sha256(upstream.wheel), source=source))


def test_commit_pin_applies_and_builds(upstream, tmp_path):
    repo, first, second = _git_upstream(tmp_path, upstream)
    upstream.add_patch(
        "0001-engine.patch",
        file_patch("vllm/engine.py", ENGINE, ENGINE.replace("x + 20\n", "x + 2000\n"), "engine: edit"),
    )
    _pin(upstream, str(repo), first)
    code, out = run_json("check", *upstream.args())
    assert code == errors.OK, out
    code, out = run_json("build", *upstream.args(), "--target", "cpu", "--dist", str(tmp_path / "dist"))
    assert code == errors.OK, out
    assert out["provenance"]["upstream"]["source"] == {"kind": "git", "url": str(repo), "commit": first}
    # the same patch conflicts with the later commit, whose tree changed the hunk
    _pin(upstream, str(repo), second)
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED
    assert out["patches"][0]["status"] == "conflict"


def test_unknown_commit_is_clear(upstream, tmp_path):
    repo, _first, _second = _git_upstream(tmp_path, upstream)
    _pin(upstream, str(repo), "1234567890abcdef1234567890abcdef12345678")
    code, out = run_json("check", *upstream.args())
    assert code == errors.BAD_INPUT
    assert "not found" in out["error"]


def test_build_refuses_wheel_not_built_from_pinned_source(upstream, tmp_path):
    """Main moved past the release the binary wheel was built from: laying its
    files over that wheel would mix two versions, so the build refuses."""
    repo, _first, second = _git_upstream(tmp_path, upstream)
    moved = ENGINE.replace("x + 20\n", "x + 20  # main moved on\n")
    upstream.add_patch(
        "0001-engine.patch",
        file_patch("vllm/engine.py", moved, moved.replace("x + 3\n", "x + 33\n"), "engine: edit"),
    )
    _pin(upstream, str(repo), second)
    code, out = run_json("build", *upstream.args(), "--target", "cpu", "--dist", str(tmp_path / "dist"))
    assert code == errors.BUILD_REFUSED, out
    assert "vllm/engine.py differs from the pinned source" in out["error"]
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())
