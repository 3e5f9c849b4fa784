"""Malformed series and patch files get a clear error naming the problem."""

import pytest
from support.cli import run_tool
from support.synthetic import ENGINE, file_patch, make_patch

from overlay import errors


def _engine_patch(subject="engine: tweak"):
    return file_patch("vllm/engine.py", ENGINE, ENGINE.replace("x + 3", "x + 33"), subject)


@pytest.mark.parametrize(
    "line, needle",
    [
        ("0001-a.patch -p1", "bad series line"),
        ("patches/0001-a.patch", "bad series line"),
        ("0001 a.patch", "bad series line"),
        ("0001-a.diff", "bad series line"),
    ],
)
def test_bad_series_line_names_line(upstream, line, needle):
    (upstream.root / "patches" / "0001-a.patch").write_text(_engine_patch())
    upstream.series.write_text(f"# header\n\n{line}\n")
    proc = run_tool("check", *upstream.args())
    assert proc.returncode == errors.BAD_INPUT
    assert needle in proc.stderr and "series:3" in proc.stderr, proc.stderr


def test_duplicate_patch_refused(upstream):
    upstream.add_patch("0001-a.patch", _engine_patch())
    with upstream.series.open("a") as f:
        f.write("0001-a.patch\n")
    proc = run_tool("check", *upstream.args())
    assert proc.returncode == errors.BAD_INPUT
    assert "listed twice" in proc.stderr


def test_missing_patch_file_named(upstream):
    upstream.series.write_text("0001-missing.patch\n")
    proc = run_tool("check", *upstream.args())
    assert proc.returncode == errors.BAD_INPUT
    assert "0001-missing.patch" in proc.stderr and "does not exist" in proc.stderr


def test_patch_without_diff_refused(upstream):
    upstream.add_patch("0001-empty.patch", "Subject: [PATCH] nothing here\n\njust words\n")
    proc = run_tool("check", *upstream.args())
    assert proc.returncode == errors.BAD_INPUT
    assert "0001-empty.patch" in proc.stderr and "no diff" in proc.stderr


def test_check_requires_header_trailers(upstream):
    text = make_patch({"vllm/engine.py": ENGINE}, {"vllm/engine.py": ENGINE + "# x\n"}, "no trailers", trailers=False)
    upstream.add_patch("0001-bare.patch", text)
    proc = run_tool("check", *upstream.args())
    assert proc.returncode == errors.BAD_INPUT
    assert "0001-bare.patch" in proc.stderr and "Upstream-Status" in proc.stderr


def test_series_hash_ignores_comments(tmp_path, upstream):
    from overlay import series

    upstream.add_patch("0001-a.patch", _engine_patch())
    before = series.load(upstream.series).sha256
    upstream.series.write_text("# another comment\n\n0001-a.patch  # trailing\n")
    assert series.load(upstream.series).sha256 == before
    (upstream.root / "patches" / "0001-a.patch").write_text(_engine_patch("engine: other words"))
    assert series.load(upstream.series).sha256 != before


def test_malformed_lock_is_clear(upstream):
    lock = upstream.root / "upstream.lock"
    lock.write_text(lock.read_text().replace('sha256 = "', 'sha256 = "zz', 1))
    proc = run_tool("check", *upstream.args())
    assert proc.returncode == errors.BAD_INPUT
    assert "upstream.lock" in proc.stderr and "sha256" in proc.stderr
