"""ci/nightly.sh end to end against a local "upstream main" (a git repository) and a local
per-commit wheel index (http.server), as the workflow runs it against GitHub and wheels.vllm.ai."""

import json
import os
import subprocess
import sys
from pathlib import Path

from support.cli import ROOT, run_json
from support.synthetic import ENGINE, SOURCE, LocalIndex, file_patch, git_commit, pin_git, sha256, snapshot

from overlay import errors


def _nightly(upstream, repo, wheels, report_dir, **more):
    args = " ".join(upstream.args())
    env = {
        **more,
        **os.environ,
        "UPSTREAM_URL": str(repo),
        "WHEELS_URL": wheels,
        "TARGET": "cpu",
        "REPORT_DIR": str(report_dir),
        "OVERLAY_ARGS": args,
        "TEST_CMD": f"{sys.executable} apply.py check {args}",
        "GITHUB_STEP_SUMMARY": str(report_dir.parent / "summary.md"),
    }
    proc = subprocess.run(["bash", str(ROOT / "ci" / "nightly.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True)  # fmt: skip
    report = json.loads((report_dir / "report.json").read_text())
    return proc, report


def _setup(upstream, tmp_path, main_engine):
    repo = tmp_path / "upstream-git"
    v1 = git_commit(repo, dict(SOURCE), "v1")
    pin_git(upstream, str(repo), v1)
    e = ENGINE
    upstream.add_patch("0001-a.patch", file_patch("vllm/engine.py", e, e.replace("x + 5\n", "x + 500\n"), "a"))
    head = git_commit(repo, {"vllm/engine.py": main_engine, "README.md": "main moved\n"}, "main")
    index = LocalIndex(tmp_path / "wheels", [upstream.wheel], prefix=head)
    return repo, head, index


def test_nightly_rebases_builds_tests_and_reports(upstream, tmp_path):
    # (main leaves the patched file alone: the build checks the wheel was built from the same source)
    repo, head, index = _setup(upstream, tmp_path, ENGINE)
    try:
        proc, report = _nightly(upstream, repo, index.base, tmp_path / "nightly")
    finally:
        index.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["upstream_commit"] == head
    assert (report["rebase_exit"], report["build_exit"], report["test_exit"]) == (0, 0, 0)
    assert [p["status"] for p in report["stages"]["rebase"]["patches"]] == ["clean"]
    wheel = Path(report["stages"]["build"]["wheel"])
    assert wheel.exists() and wheel.parent == tmp_path / "nightly" / "dist"
    # the lock pins main's head and the per-commit wheel by URL, with the sha256 of the download
    lock = (upstream.root / "upstream.lock").read_text()
    assert f'commit = "{head}"' in lock
    assert f'url = "{index.base}/{upstream.wheel.name}"' in lock
    assert sha256(upstream.wheel) in lock
    assert "| 0001-a.patch | clean |" in (tmp_path / "summary.md").read_text()


def test_nightly_reports_every_patch_past_a_conflict_and_a_gone_file_and_fails(upstream, tmp_path):
    """Main conflicts with 0001 and removed 0002's file: each patch still gets its status
    (0003 after both), and a series that lost patches is not built."""
    extra, e = "def extra():\n    return 0\n", ENGINE
    upstream.add_patch("0001-a.patch", file_patch("vllm/engine.py", e, e.replace("x + 5\n", "x + 500\n"), "a"))
    upstream.add_patch("0002-b.patch", file_patch("vllm/extra.py", extra, extra + "# b\n", "b"))
    upstream.add_patch("0003-c.patch", file_patch("setup.py", SOURCE["setup.py"], SOURCE["setup.py"] + "# c\n", "c"))
    repo = tmp_path / "upstream-git"
    v1 = git_commit(repo, {**SOURCE, "vllm/extra.py": extra}, "v1")
    pin_git(upstream, str(repo), v1)
    head = git_commit(repo, {"vllm/engine.py": ENGINE.replace("x + 5\n", "x + 6\n"), "vllm/extra.py": None}, "main")
    index = LocalIndex(tmp_path / "wheels", [upstream.wheel], prefix=head)
    try:
        proc, report = _nightly(upstream, repo, index.base, tmp_path / "nightly")
    finally:
        index.close()
    assert proc.returncode == errors.PATCH_FAILED, proc.stdout + proc.stderr
    patches = report["stages"]["rebase"]["patches"]
    assert [(p["patch"], p["status"]) for p in patches] == [
        ("0001-a.patch", "conflict"),
        ("0002-b.patch", "target-gone"),
        ("0003-c.patch", "clean"),
    ]
    assert report["patches_stopped"] == 2 and "build_exit" not in report
    assert "| 0002-b.patch | target-gone |" in (tmp_path / "summary.md").read_text()


def test_nightly_without_a_wheel_for_the_commit_is_a_fetch_failure(upstream, tmp_path):
    repo, head, index = _setup(upstream, tmp_path, ENGINE)
    try:
        proc, report = _nightly(upstream, repo, index.base + "/nothing-here", tmp_path / "nightly")
    finally:
        index.close()
    assert proc.returncode == errors.FETCH_FAILED, proc.stdout + proc.stderr
    assert report["rebase_exit"] == errors.FETCH_FAILED


def test_nightly_with_a_wheel_url_template(upstream, tmp_path):
    repo, head, index = _setup(upstream, tmp_path, ENGINE)
    # the file server also serves <commit>/<wheel> when the wheel is placed there
    (tmp_path / "wheels" / head / upstream.wheel.name).write_bytes(upstream.wheel.read_bytes())
    template = f"{index.base}/{{commit}}/{upstream.wheel.name}"
    try:
        proc, report = _nightly(upstream, repo, "http://127.0.0.1:9/unused", tmp_path / "nightly", WHEEL_URL=template)
    finally:
        index.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f'url = "{index.base}/{head}/{upstream.wheel.name}"' in (upstream.root / "upstream.lock").read_text()


def test_per_commit_wheel_not_matching_its_index_digest_is_refused(upstream, tmp_path):
    repo = tmp_path / "upstream-git"
    v1 = git_commit(repo, dict(SOURCE), "v1")
    pin_git(upstream, str(repo), v1)
    head = git_commit(repo, {"README.md": "main moved\n"}, "main")
    index = LocalIndex(tmp_path / "wheels", [upstream.wheel], prefix=head, digests={upstream.wheel.name: "0" * 64})
    before = snapshot(upstream.root)
    try:
        code, out = run_json("rebase", *upstream.args(), "--to-commit", head, "--git-url", str(repo),
                             "--wheel-index", f"cpu={index.base}/{head}/", "--tree", str(tmp_path / "t"))  # fmt: skip
    finally:
        index.close()
    assert code == errors.FETCH_FAILED and "checksum mismatch" in out["error"], out
    assert snapshot(upstream.root) == before
