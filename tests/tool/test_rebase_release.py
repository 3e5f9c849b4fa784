"""rebase --to VERSION: the release's sdist from the package index (a local one here), its
sha256 checked against the index's digest and recorded; a binary wheel the index lacks is
recorded as missing and `build` refuses that target."""

import shutil

import pytest
from support.cli import run_json, run_tool
from support.synthetic import ENGINE, SOURCE, LocalIndex, file_patch, make_sdist, sha256, snapshot

from overlay import errors

V2_COMMIT = "1234567abc"
V2 = {
    **SOURCE,
    "vllm/engine.py": ENGINE.replace("def step_11(x):\n", "def step_11(x):  # 2.0.0\n"),
    "vllm/_version.py": f"__version__ = version = '2.0.0'\n__commit_id__ = commit_id = 'g{V2_COMMIT}'\n",
}


@pytest.fixture
def release(tmp_path, upstream):
    e = ENGINE
    upstream.add_patch("0001-ten.patch", file_patch("vllm/engine.py", e, e.replace("x + 10\n", "x + 1000\n"), "ten"))
    (tmp_path / "v2").mkdir()
    return make_sdist(tmp_path / "v2", V2, version="2.0.0")


def _rebase(upstream, index, tmp_path, version="2.0.0"):
    return run_json("rebase", *upstream.args(), "--to", version, "--tree", str(tmp_path / "t"), env=index.env)


def test_release_without_binary_wheel(upstream, release, tmp_path):
    index = LocalIndex(tmp_path / "index", [upstream.sdist, release])
    try:
        code, out = _rebase(upstream, index, tmp_path)
    finally:
        index.close()
    assert code == errors.OK and out["completed"], out
    assert [p["status"] for p in out["patches"]] == ["merged-3way"]
    lock = (upstream.root / "upstream.lock").read_text()
    assert 'version = "2.0.0"' in lock and f'commit = "{V2_COMMIT}"' in lock
    assert f'sha256 = "{sha256(release)}"' in lock and f"size = {release.stat().st_size}" in lock
    assert "[wheels_missing]" in lock and "fakevllm-2.0.0-py3-none-any.whl is not on the package index" in lock
    assert "[wheels.cpu]" not in lock
    assert "missing_wheels" in out and "cpu" in out["missing_wheels"]
    # the new pin checks clean, and build refuses the target it has no wheel for, saying why
    assert run_tool("check", *upstream.args()).returncode == errors.OK
    proc = run_tool("build", *upstream.args(), "--target", "cpu", "--dist", str(tmp_path / "dist"))
    assert proc.returncode == errors.BUILD_REFUSED
    assert "no binary wheel for target 'cpu' at vLLM 2.0.0" in proc.stderr
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def test_release_with_binary_wheel_pins_its_index_digest(upstream, release, tmp_path):
    wheel = tmp_path / "v2" / "fakevllm-2.0.0-py3-none-any.whl"
    shutil.copy(upstream.wheel, wheel)
    index = LocalIndex(tmp_path / "index", [upstream.sdist, release, wheel])
    try:
        code, out = _rebase(upstream, index, tmp_path)
    finally:
        index.close()
    assert code == errors.OK, out
    lock = (upstream.root / "upstream.lock").read_text()
    assert "[wheels.cpu]" in lock and 'filename = "fakevllm-2.0.0-py3-none-any.whl"' in lock
    assert sha256(wheel) in lock and "wheels_missing" not in lock


def test_index_digest_mismatch_is_a_fetch_failure_and_writes_nothing(upstream, release, tmp_path):
    index = LocalIndex(tmp_path / "index", [upstream.sdist, release], digests={release.name: "0" * 64})
    before = snapshot(upstream.root)
    try:
        code, out = _rebase(upstream, index, tmp_path)
    finally:
        index.close()
    assert code == errors.FETCH_FAILED and "checksum mismatch" in out["error"], out
    assert snapshot(upstream.root) == before and not (tmp_path / "t").exists()
    assert not (upstream.cache / "downloads" / release.name).exists()


def test_unknown_release_is_bad_input(upstream, release, tmp_path):
    index = LocalIndex(tmp_path / "index", [upstream.sdist, release])
    before = snapshot(upstream.root)
    try:
        code, out = _rebase(upstream, index, tmp_path, version="9.9.9")
    finally:
        index.close()
    assert code == errors.BAD_INPUT and "has no fakevllm-9.9.9.tar.gz" in out["error"]
    assert snapshot(upstream.root) == before
