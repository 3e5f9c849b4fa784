"""The maintainer loop: apply -> edit/commit -> export; export is deterministic."""

import subprocess

import pytest
from support.cli import run_json, run_tool
from support.synthetic import ENGINE, file_patch, snapshot

from overlay import errors


def _git(tree, *args):
    return subprocess.run(
        ["git", "-c", "user.name=m", "-c", "user.email=m@m", *args],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


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
    before = snapshot(upstream.root)
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert code == 0 and all(p["change"] == "unchanged" for p in out["patches"])
    assert snapshot(upstream.root) == before
    # a fresh tree from the exported series exports the same bytes again
    assert run_tool("apply", *upstream.args(), "--tree", str(tree), "--force").returncode == 0
    assert run_tool("export", *upstream.args(), "--tree", str(tree)).returncode == 0
    assert snapshot(upstream.root) == before


def test_export_writes_edits_new_and_dropped_patches(upstream):
    tree = _apply_export_roundtrip(upstream)
    (tree / "vllm/engine.py").write_text((tree / "vllm/engine.py").read_text() + "HOOK = 1\n")
    _git(tree, "commit", "-q", "-am", "engine: hook\n\nUpstream-Status: not-forwarded\nTests: none")
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert code == 0
    assert [(p["patch"], p["change"]) for p in out["patches"]] == [
        ("0001-engine-edit.patch", "unchanged"),
        ("0002-engine-hook.patch", "added"),
    ]
    assert upstream.series.read_text().splitlines()[1:] == ["0001-engine-edit.patch", "0002-engine-hook.patch"]
    assert run_tool("check", *upstream.args()).returncode == 0
    # drop the first patch: its file goes, the second keeps its name (its number included)
    _git(tree, "rebase", "-q", "--onto", "upstream", "HEAD~1")
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert {(p["patch"], p["change"]) for p in out["patches"]} == {
        ("0002-engine-hook.patch", "changed"),
        ("0001-engine-edit.patch", "removed"),
    }
    assert sorted(p.name for p in (upstream.root / "patches").iterdir()) == ["0002-engine-hook.patch"]
    assert upstream.series.read_text().splitlines()[1:] == ["0002-engine-hook.patch"]
    # a new patch takes the next number past the series' (git's by position would reuse 0002's
    # dropped predecessor's 0001... or collide with 0002 itself)
    (tree / "vllm/engine.py").write_text((tree / "vllm/engine.py").read_text() + "HOOK = 2\n")
    _git(tree, "commit", "-q", "-am", "engine: second hook\n\nUpstream-Status: not-forwarded\nTests: none")
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert code == 0, out
    assert upstream.series.read_text().splitlines()[1:] == ["0002-engine-hook.patch", "0003-engine-second-hook.patch"]


def test_export_sends_new_files_to_src_and_upstream_changes_to_patches(upstream):
    """Our modules are files in src/, laid in before the series; patches only change upstream files."""
    tree = _apply_export_roundtrip(upstream)
    src = upstream.root / "src"
    (tree / "vllm/extra.py").write_text("EXTRA = 1\n")
    _git(tree, "add", "vllm/extra.py")
    _git(tree, "commit", "-q", "-m", "extra: a module and nothing else")
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert code == 0
    assert [(p["patch"], p["change"]) for p in out["patches"]] == [
        ("0001-engine-edit.patch", "unchanged"),
        ("src/vllm/extra.py", "added"),
    ]  # a commit that only adds our files is no patch
    assert (src / "vllm/extra.py").read_text() == "EXTRA = 1\n"
    assert upstream.series.read_text().splitlines()[1:] == ["0001-engine-edit.patch"]

    # a hook and a module edit in one commit: the hook becomes a patch, the module's text goes to src/
    (tree / "vllm/extra.py").write_text("EXTRA = 2\n")
    (tree / "vllm/engine.py").write_text((tree / "vllm/engine.py").read_text() + "from vllm.extra import EXTRA\n")
    _git(tree, "commit", "-q", "-am", "engine: hook\n\nUpstream-Status: not-forwarded\nTests: none")
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert [(p["patch"], p["change"]) for p in out["patches"]] == [
        ("0001-engine-edit.patch", "unchanged"),
        ("0002-engine-hook.patch", "added"),
        ("src/vllm/extra.py", "changed"),
    ]
    hook = (upstream.root / "patches" / "0002-engine-hook.patch").read_text()
    assert "vllm/engine.py" in hook and "extra.py" not in hook.split("\n---\n", 1)[1]
    code, out = run_json("check", *upstream.args())
    assert code == 0 and [p["patch"] for p in out["patches"]] == [
        "0000-our-modules-from-src.patch", "0001-engine-edit.patch", "0002-engine-hook.patch",
    ]  # fmt: skip

    # a fresh tree from src/ and the series exports the same bytes
    before = snapshot(upstream.root)
    assert run_tool("apply", *upstream.args(), "--tree", str(tree), "--force").returncode == 0
    assert (tree / "vllm/extra.py").read_text() == "EXTRA = 2\n"
    assert run_tool("export", *upstream.args(), "--tree", str(tree)).returncode == 0
    assert snapshot(upstream.root) == before

    # a module removed from the branch leaves src/
    _git(tree, "rm", "-q", "vllm/extra.py")
    _git(tree, "commit", "-q", "-m", "extra: gone")
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert ("src/vllm/extra.py", "removed") in [(p["patch"], p["change"]) for p in out["patches"]]
    assert not src.exists()


def test_export_refuses_uncommitted_changes(upstream):
    tree = _apply_export_roundtrip(upstream)
    (tree / "vllm/engine.py").write_text("changed\n")
    before = snapshot(upstream.root)
    proc = run_tool("export", *upstream.args(), "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT and "uncommitted" in proc.stderr
    assert snapshot(upstream.root) == before


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError("a write failed")])
def test_export_stopped_mid_write_leaves_series_patches_and_src_as_they_were(upstream, monkeypatch, tmp_path, failure):
    """Ctrl-C (or a failing write) after the patches and series are written, while src/ is:
    nothing of it reaches the project, and the interrupt message's "nothing half-written" holds."""
    from overlay import cli, maintain

    tree = _apply_export_roundtrip(upstream)
    (upstream.root / "src" / "vllm").mkdir(parents=True)
    (upstream.root / "src" / "vllm" / "gone.py").write_text("GONE = 1\n")
    (tree / "vllm/extra.py").write_text("EXTRA = 1\n")
    (tree / "vllm/engine.py").write_text((tree / "vllm/engine.py").read_text() + "from vllm.extra import EXTRA\n")
    _git(tree, "add", "vllm/extra.py")
    _git(tree, "commit", "-q", "-am", "engine: hook\n\nUpstream-Status: not-forwarded\nTests: none")
    before = snapshot(upstream.root)
    real = maintain.write_modules

    def write_then_fail(src, files, keep=frozenset()):
        real(src, files, keep)  # src/ half rewritten in place, were it not staged
        raise failure

    monkeypatch.setattr(maintain, "write_modules", write_then_fail)
    monkeypatch.setattr(cli, "CRASH_DIR", tmp_path / "crashes")
    code = cli.main(["export", *upstream.args(), "--tree", str(tree)])
    assert code == (errors.INTERRUPTED if failure is KeyboardInterrupt else errors.INTERNAL_ERROR)
    assert snapshot(upstream.root) == before
    assert not [p for p in upstream.root.iterdir() if p.name.startswith(".overlay-staging")]
    # the same export, not stopped, writes all three
    monkeypatch.setattr(maintain, "write_modules", real)
    assert cli.main(["export", *upstream.args(), "--tree", str(tree)]) == errors.OK
    after = snapshot(upstream.root)
    assert "patches/0002-engine-hook.patch" in after and "src/vllm/extra.py" in after
    assert "src/vllm/gone.py" not in after and after["series"] != before["series"]
