"""rebase: per-patch status, stop at a conflict, --continue / --abort, lock and series rewritten
only on success, drift flagged even when a patch applies clean.

Upstream history is a local git repository (tests/support/synthetic.py); the
project starts pinned to its first commit and rebases onto a later one.
"""

import subprocess

import pytest
from support.cli import run_json, run_tool
from support.synthetic import (
    ENGINE,
    SCHED,
    SOURCE,
    file_patch,
    git_commit,
    git_rename,
    pin_git,
    snapshot,
)

from overlay import errors

OLD_FILE = "".join(f"LINE_{i} = {i}\n" for i in range(30))


def _edit(text, old, new):
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.fixture
def history(tmp_path, upstream):
    """Upstream at v1 (the pin) and v2 (the rebase target)."""
    repo = tmp_path / "upstream-git"
    v1 = git_commit(repo, {**SOURCE, "vllm/scheduler.py": SCHED, "vllm/old_name.py": OLD_FILE}, "v1")
    pin_git(upstream, str(repo), v1)
    return repo, v1


def _patches(upstream):
    """One patch per status, in series order."""
    add = upstream.add_patch
    e = ENGINE
    add("0001-clean.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 5\n", "x + 500\n"), "clean edit"))
    add("0002-merge.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 10\n", "x + 1000\n"), "needs 3-way"))
    add("0003-upstream.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 15\n", "x + 1500\n"), "taken upstream"))
    add("0004-drift.patch", file_patch("vllm/scheduler.py", SCHED, _edit(SCHED, "out = []\n", "out = []  # ovl\n"),
                                      "hooks schedule"))  # fmt: skip
    add("0005-conflict.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 30\n", "x + 3000\n"), "conflicts"))
    add("0006-later.patch", file_patch("vllm/later.py", None, "LATER = 1\n", "later patch"))


def _v2(repo):
    engine = ENGINE
    engine = _edit(engine, "def step_11(x):\n", "def step_11(x):  # upstream touched the context\n")
    engine = _edit(engine, "x + 15\n", "x + 1500\n")  # the same change as patch 0003
    engine = _edit(engine, "x + 30\n", "x + 31\n")  # the line patch 0005 edits
    sched = _edit(SCHED, "budget -= 1\n", "budget -= req.cost\n")  # outside 0004's hunk, inside its function
    return git_commit(repo, {"vllm/engine.py": engine, "vllm/scheduler.py": sched}, "v2")


def _rebase(upstream, repo, commit, tree, *extra):
    return run_json("rebase", *upstream.args(), "--to-commit", commit, "--git-url", str(repo),
                    "--upstream-version", "2.0.0", "--tree", str(tree), *extra)  # fmt: skip


def _git(tree, *args):
    return subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True)


def test_each_status_stop_at_conflict_then_continue(upstream, history, tmp_path):
    repo, _v1 = history
    _patches(upstream)
    v2 = _v2(repo)
    tree = tmp_path / "rebase-tree"
    before = snapshot(upstream.root)

    code, out = _rebase(upstream, repo, v2, tree)
    assert code == errors.PATCH_FAILED, out
    statuses = [(p["patch"], p["status"]) for p in out["patches"]]
    assert statuses == [
        ("0001-clean.patch", "clean"),
        ("0002-merge.patch", "merged-3way"),
        ("0003-upstream.patch", "already-upstream"),
        ("0004-drift.patch", "clean"),
        ("0005-conflict.patch", "conflict"),
        ("0006-later.patch", "not-tried"),
    ]
    by = {p["patch"]: p for p in out["patches"]}
    assert not out["completed"] and out["stopped_at"] == "0005-conflict.patch"
    conflict = by["0005-conflict.patch"]
    assert conflict["file"] == "vllm/engine.py"
    assert conflict["hunk"].startswith("vllm/engine.py hunk #1 (@@ -")
    # drift: only the patch whose function upstream edited
    assert [d["function"] for d in by["0004-drift.patch"]["drift"]] == ["Scheduler.schedule"]
    assert all(not by[n]["drift"] for n in ("0001-clean.patch", "0002-merge.patch"))
    # nothing pinned was written; the tree holds the conflict
    assert snapshot(upstream.root) == before
    text = (tree / "vllm/engine.py").read_text()
    assert "<<<<<<<" in text and ">>>>>>>" in text

    # --continue refuses while the conflict is unresolved
    proc = run_tool("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT and "unresolved conflicts in vllm/engine.py" in proc.stderr
    assert snapshot(upstream.root) == before

    # resolve: keep the patch's intent on upstream's new line
    resolved = _edit(ENGINE, "def step_11(x):\n", "def step_11(x):  # upstream touched the context\n")
    resolved = _edit(resolved, "x + 15\n", "x + 1500\n")
    resolved = _edit(resolved, "x + 5\n", "x + 500\n")
    resolved = _edit(resolved, "x + 10\n", "x + 1000\n")
    resolved = _edit(resolved, "x + 30\n", "x + 3100\n")
    (tree / "vllm/engine.py").write_text(resolved)
    assert _git(tree, "add", "vllm/engine.py").returncode == 0

    code, out = run_json("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    # completed, but a patch drifted and one was dropped: review needed (exit 1)
    assert code == errors.PATCH_FAILED and out["completed"], out
    by = {p["patch"]: p for p in out["patches"]}
    assert by["0005-conflict.patch"]["resolution"] == "resolved"
    assert by["0006-later.patch"]["status"] == "clean"
    lock = (upstream.root / "upstream.lock").read_text()
    assert f'commit = "{v2}"' in lock and 'version = "2.0.0"' in lock
    names = upstream.series.read_text().split("\n")[1:-1]
    assert names == [
        "0001-clean-edit.patch",
        "0002-needs-3-way.patch",
        "0003-hooks-schedule.patch",
        "0004-conflicts.patch",
    ]  # the later patch only added a file: it is in src/ now, as export writes every new file
    assert (upstream.root / "src/vllm/later.py").read_text() == "LATER = 1\n"
    assert sorted(p.name for p in (upstream.root / "patches").iterdir()) == sorted(names)
    assert "x + 3100" in (upstream.root / "patches" / "0004-conflicts.patch").read_text()
    assert not (tree / ".git" / "overlay-rebase").exists()
    # the rewritten series passes check on the new pin, zero fuzz
    code, out = run_json("check", *upstream.args())
    assert code == errors.OK, out
    # and the rebase tree is a maintainer tree: export of it changes nothing
    after = snapshot(upstream.root)
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert code == errors.OK and snapshot(upstream.root) == after


def test_clean_rebase_exits_zero_and_updates_pin(upstream, history, tmp_path):
    repo, _v1 = history
    e = ENGINE
    upstream.add_patch("0001-a.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 5\n", "x + 500\n"), "a"))
    v2 = git_commit(repo, {"README.md": "upstream moved on\n"}, "v2")
    tree = tmp_path / "t"
    code, out = _rebase(upstream, repo, v2, tree)
    assert code == errors.OK and out["ok"] and out["completed"], out
    assert [p["status"] for p in out["patches"]] == ["clean"]
    assert out["series_sha256_after"]
    assert f'commit = "{v2}"' in (upstream.root / "upstream.lock").read_text()
    # a second rebase cannot start over an existing tree without --force
    proc = run_tool("rebase", *upstream.args(), "--to-commit", v2, "--git-url", str(repo), "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT and "--force" in proc.stderr


def _patch_a_file_upstream_renames(upstream, repo):
    new_old = _edit(OLD_FILE, "LINE_3 = 3\n", "LINE_3 = 33\n")
    upstream.add_patch("0001-old.patch", file_patch("vllm/old_name.py", OLD_FILE, new_old, "old file"))
    v2 = git_rename(repo, "vllm/old_name.py", "vllm/new_name.py", OLD_FILE + "EXTRA = 1\n", "rename")
    return v2, new_old


def test_target_gone_names_the_rename_and_abort_restores_nothing_written(upstream, history, tmp_path):
    repo, _v1 = history
    v2, new_old = _patch_a_file_upstream_renames(upstream, repo)
    tree = tmp_path / "t"
    before = snapshot(upstream.root)
    code, out = _rebase(upstream, repo, v2, tree)
    assert code == errors.PATCH_FAILED
    step = out["patches"][0]
    assert step["status"] == "target-gone"
    assert step["file"] == "vllm/old_name.py" and step["renamed_to"] == "vllm/new_name.py"
    assert snapshot(upstream.root) == before
    # a new rebase cannot start while this one is in progress
    proc = run_tool("rebase", *upstream.args(), "--to-commit", v2, "--git-url", str(repo), "--tree", str(tree),
                    "--force")  # fmt: skip
    assert proc.returncode == errors.BAD_INPUT and "in progress" in proc.stderr
    code, out = run_json("rebase", *upstream.args(), "--abort", "--tree", str(tree))
    assert code == errors.OK and out["aborted"]
    assert not tree.exists()
    assert snapshot(upstream.root) == before


def test_target_gone_resolved_by_hand(upstream, history, tmp_path):
    repo, _v1 = history
    v2, new_old = _patch_a_file_upstream_renames(upstream, repo)
    tree = tmp_path / "t"
    assert _rebase(upstream, repo, v2, tree)[0] == errors.PATCH_FAILED
    (tree / "vllm/new_name.py").write_text(new_old + "EXTRA = 1\n")
    _git(tree, "add", "vllm/new_name.py")
    code, out = run_json("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    assert code == errors.OK and out["completed"], out
    assert out["patches"][0]["resolution"] == "resolved"
    patch = (upstream.root / "patches" / "0001-old-file.patch").read_text()
    assert "vllm/new_name.py" in patch and "LINE_3 = 33" in patch


def test_dropping_the_stopped_patch_with_git_am_skip(upstream, history, tmp_path):
    repo, _v1 = history
    e = ENGINE
    upstream.add_patch("0001-c.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 30\n", "x + 3000\n"), "c"))
    upstream.add_patch(
        "0002-d.patch", file_patch("vllm/scheduler.py", SCHED, _edit(SCHED, "out = []\n", "out = []  # d\n"), "d")
    )
    v2 = git_commit(repo, {"vllm/engine.py": _edit(e, "x + 30\n", "x + 31\n")}, "v2")
    tree = tmp_path / "t"
    assert _rebase(upstream, repo, v2, tree)[0] == errors.PATCH_FAILED
    proc = run_tool("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT  # unresolved
    assert _git(tree, "am", "--skip").returncode == 0
    code, out = run_json("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    assert code == errors.PATCH_FAILED and out["completed"]  # completed; a dropped patch needs review
    assert out["patches"][0]["resolution"] == "dropped"
    assert upstream.series.read_text().split("\n")[1:-1] == ["0002-d.patch"]  # keeps its name


def test_series_not_applying_to_current_pin_writes_nothing(upstream, history, tmp_path):
    repo, _v1 = history
    e = ENGINE.replace("x + 7\n", "x + 77\n")  # not what the pin has
    upstream.add_patch("0001-bad.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 7", "x + 8"), "bad"))
    v2 = git_commit(repo, {"README.md": "v2\n"}, "v2")
    before = snapshot(upstream.root)
    code, out = _rebase(upstream, repo, v2, tmp_path / "t")
    assert code == errors.PATCH_FAILED and "does not apply to the current pin" in out["error"]
    assert snapshot(upstream.root) == before and not (tmp_path / "t").exists()


def test_unknown_target_commit_is_bad_input(upstream, history, tmp_path):
    repo, _v1 = history
    before = snapshot(upstream.root)
    code, out = _rebase(upstream, repo, "f" * 40, tmp_path / "t")
    assert code == errors.BAD_INPUT and "not found" in out["error"]
    assert snapshot(upstream.root) == before


def test_series_edited_during_a_stopped_rebase_is_not_overwritten(upstream, history, tmp_path):
    repo, _v1 = history
    e = ENGINE
    upstream.add_patch("0001-c.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 30\n", "x + 3000\n"), "c"))
    v2 = git_commit(repo, {"vllm/engine.py": _edit(e, "x + 30\n", "x + 31\n")}, "v2")
    tree = tmp_path / "t"
    assert _rebase(upstream, repo, v2, tree)[0] == errors.PATCH_FAILED
    assert _git(tree, "am", "--skip").returncode == 0
    with upstream.series.open("a") as f:
        f.write("# someone edited the series meanwhile\n")
    edited = upstream.series.read_text()
    before = snapshot(upstream.root)
    code, out = run_json("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    assert code == errors.BAD_INPUT and "changed since the rebase started" in out["error"]
    assert snapshot(upstream.root) == before
    # every patch is through and the finish was refused: --continue tries the finish again
    proc = run_tool("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT and "changed since the rebase started" in proc.stderr, proc.stderr
    assert snapshot(upstream.root) == before
    upstream.series.write_text(edited.replace("# someone edited the series meanwhile\n", ""))
    code, out = run_json("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    assert code == errors.PATCH_FAILED and out["completed"], out  # done; the dropped patch needs review
    assert upstream.series.read_text().split("\n")[1:-1] == []


def test_already_upstream_found_by_the_3way_merge(upstream, history, tmp_path):
    """Upstream made the patch's change and also edited its context: the patch neither
    applies nor reverse-applies, and the 3-way merge changes nothing."""
    repo, _v1 = history
    e = ENGINE
    upstream.add_patch("0001-x.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 20\n", "x + 2000\n"), "x"))
    upstream.add_patch(
        "0002-y.patch", file_patch("vllm/scheduler.py", SCHED, _edit(SCHED, "out = []\n", "out = []  # y\n"), "y")
    )
    both = _edit(_edit(e, "x + 20\n", "x + 2000\n"), "def step_21(x):\n", "def step_21(x):  # upstream\n")
    v2 = git_commit(repo, {"vllm/engine.py": both}, "v2")
    code, out = _rebase(upstream, repo, v2, tmp_path / "t")
    assert code == errors.PATCH_FAILED and out["completed"], out  # completed; the drop needs review
    first, second = out["patches"]
    assert first["status"] == "already-upstream" and "3-way merge changed nothing" in first["detail"]
    assert second["status"] == "clean"
    assert upstream.series.read_text().split("\n")[1:-1] == ["0002-y.patch"]  # keeps its name


def test_continue_after_an_interruption_replays_the_interrupted_patch(upstream, history, tmp_path):
    """Interrupted inside `git am` of a patch (simulated: the state says the patch was never
    reported, the am session is open): --continue undoes the half-applied patch and replays it,
    so no patch is lost."""
    import json

    repo, _v1 = history
    e = ENGINE
    upstream.add_patch("0001-a.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 5\n", "x + 500\n"), "a"))
    upstream.add_patch("0002-c.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 30\n", "x + 3000\n"), "c"))
    v2 = git_commit(repo, {"vllm/engine.py": _edit(e, "x + 30\n", "x + 31\n")}, "v2")
    tree = tmp_path / "t"
    assert _rebase(upstream, repo, v2, tree)[0] == errors.PATCH_FAILED
    state_file = tree / ".git" / "overlay-rebase" / "state.json"
    state = json.loads(state_file.read_text())
    state["steps"][1]["status"] = "not-tried"
    state_file.write_text(json.dumps(state))
    code, out = run_json("rebase", *upstream.args(), "--continue", "--tree", str(tree))
    assert code == errors.PATCH_FAILED and out["stopped_at"] == "0002-c.patch", out
    assert [p["status"] for p in out["patches"]] == ["clean", "conflict"]
    log = _git(tree, "log", "--format=%s", "upstream..HEAD").stdout.split("\n")
    assert log == ["a", ""]  # patch 0001 committed once, 0002 in progress again
    assert "<<<<<<<" in (tree / "vllm/engine.py").read_text()


def _module(upstream, path, text):
    (upstream.root / "src" / path).parent.mkdir(parents=True, exist_ok=True)
    (upstream.root / "src" / path).write_text(text)


def test_rebase_replays_the_module_layer_first_and_keeps_src(upstream, history, tmp_path):
    repo, _v1 = history
    e = ENGINE
    _module(upstream, "vllm/ours.py", "OURS = 1\n")
    hook = _edit(e, "x + 30\n", "x + 3000\n") + "from vllm.ours import OURS\n"
    upstream.add_patch("0001-hook.patch", file_patch("vllm/engine.py", e, hook, "hook"))
    v2 = git_commit(repo, {"README.md": "upstream moved on\n"}, "v2")
    before = snapshot(upstream.root)
    code, out = _rebase(upstream, repo, v2, tmp_path / "t")
    assert code == errors.OK and out["completed"], out
    assert [(p["patch"], p["status"]) for p in out["patches"]] == [
        ("0000-our-modules-from-src.patch", "clean"),
        ("0001-hook.patch", "clean"),
    ]

    def ours(files):
        return {k: v for k, v in files.items() if k.startswith(("patches/", "src/"))}

    assert ours(snapshot(upstream.root)) == ours(before) and "src/vllm/ours.py" in before  # only the pin moved
    assert (tmp_path / "t" / "vllm/ours.py").read_text() == "OURS = 1\n"


def test_upstream_adding_a_file_we_carry_stops_at_the_module_layer(upstream, history, tmp_path):
    repo, _v1 = history
    _module(upstream, "vllm/ours.py", "OURS = 1\n")
    upstream.add_patch(
        "0001-c.patch", file_patch("vllm/engine.py", ENGINE, _edit(ENGINE, "x + 30\n", "x + 3000\n"), "c")
    )
    v2 = git_commit(repo, {"vllm/ours.py": "UPSTREAMS = 2\n"}, "v2")
    before = snapshot(upstream.root)
    code, out = _rebase(upstream, repo, v2, tmp_path / "t")
    assert code == errors.PATCH_FAILED and not out["completed"], out
    layer = out["patches"][0]
    assert layer["patch"] == "0000-our-modules-from-src.patch" and layer["status"] == "conflict", layer
    assert "vllm/ours.py" in layer["detail"], layer
    assert snapshot(upstream.root) == before
