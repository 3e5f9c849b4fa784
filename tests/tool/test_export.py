"""The maintainer loop: apply -> edit/commit -> export; export is deterministic."""

import subprocess

from support.cli import run_json, run_tool
from support.synthetic import ENGINE, file_patch

from overlay import errors


def _git(tree, *args):
    return subprocess.run(
        ["git", "-c", "user.name=m", "-c", "user.email=m@m", *args],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _snapshot(root):
    return {p.name: p.read_bytes() for p in sorted((root / "patches").iterdir())} | {
        "series": (root / "series").read_bytes()
    }


def _apply_export_roundtrip(upstream):
    upstream.add_patch(
        "0001-engine.patch",
        file_patch("vllm/engine.py", ENGINE, ENGINE.replace("x + 20\n", "x + 2000\n"), "engine: edit"),
    )
    tree = upstream.root / "tree"
    assert run_tool("apply", *upstream.args(), "--tree", str(tree)).returncode == 0
    # first export normalises names and the series header
    assert run_tool("export", *upstream.args(), "--tree", str(tree)).returncode == 0
    return tree


def test_export_of_unchanged_branch_changes_no_byte(upstream):
    tree = _apply_export_roundtrip(upstream)
    before = _snapshot(upstream.root)
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert code == 0 and all(p["change"] == "unchanged" for p in out["patches"])
    assert _snapshot(upstream.root) == before
    # a fresh tree from the exported series exports the same bytes again
    assert run_tool("apply", *upstream.args(), "--tree", str(tree), "--force").returncode == 0
    assert run_tool("export", *upstream.args(), "--tree", str(tree)).returncode == 0
    assert _snapshot(upstream.root) == before


def test_export_writes_edits_new_and_dropped_patches(upstream):
    tree = _apply_export_roundtrip(upstream)
    (tree / "vllm/extra.py").write_text("EXTRA = 1\n")
    _git(tree, "add", "vllm/extra.py")
    _git(tree, "commit", "-q", "-m", "extra: add\n\nUpstream-Status: not-forwarded\nTests: none")
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert code == 0
    assert [(p["patch"], p["change"]) for p in out["patches"]] == [
        ("0001-engine-edit.patch", "unchanged"),
        ("0002-extra-add.patch", "added"),
    ]
    assert upstream.series.read_text().splitlines()[1:] == ["0001-engine-edit.patch", "0002-extra-add.patch"]
    assert run_tool("check", *upstream.args()).returncode == 0
    # drop the first patch: its file goes, the second is renumbered
    _git(tree, "rebase", "-q", "--onto", "upstream", "HEAD~1")
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert {(p["patch"], p["change"]) for p in out["patches"]} == {
        ("0001-extra-add.patch", "added"),
        ("0001-engine-edit.patch", "removed"),
        ("0002-extra-add.patch", "removed"),
    }
    assert sorted(p.name for p in (upstream.root / "patches").iterdir()) == ["0001-extra-add.patch"]


def test_export_refuses_uncommitted_changes(upstream):
    tree = _apply_export_roundtrip(upstream)
    (tree / "vllm/engine.py").write_text("changed\n")
    before = _snapshot(upstream.root)
    proc = run_tool("export", *upstream.args(), "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT and "uncommitted" in proc.stderr
    assert _snapshot(upstream.root) == before
