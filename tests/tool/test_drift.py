"""Drift: a hunk applies, but the function or class it hooks changed upstream."""

from pathlib import Path

import pytest
from support.cli import run_json
from support.synthetic import SCHED, SOURCE, file_patch, git_commit, pin_git

from overlay import errors
from overlay.drift import patch_drift
from overlay.series import Patch

HOOKED = SCHED.replace("        out = []\n", "        out = []  # overlay\n")


def _patch(old, new, path="vllm/scheduler.py"):
    data = file_patch(path, old, new, "hook").encode()
    return Patch("0001-hook.patch", Path("/nonexistent"), data)


def _drift(patch, old, new):
    return patch_drift(patch, lambda _p, _b: old, lambda _p, _b: new)


def test_edit_inside_the_hooked_function_is_drift():
    new = SCHED.replace("budget -= 1\n", "budget -= req.cost\n")
    [d] = _drift(_patch(SCHED, HOOKED), SCHED, new)
    assert (d.file, d.hunk, d.function) == ("vllm/scheduler.py", 1, "Scheduler.schedule")
    assert "edited upstream (+1/-1 lines" in d.detail


def test_moved_code_comments_and_other_functions_are_not_drift():
    new = "# new header\n# more\n" + SCHED.replace("        return out\n", "        return out  # upstream note\n")
    new = new.replace("self.queue.remove(req)", "self.queue.discard(req)")  # another method
    assert _drift(_patch(SCHED, HOOKED), SCHED, new) == []


def test_hooked_function_gone_is_drift():
    new = SCHED.replace("def schedule(self, budget)", "def plan(self, budget)")
    [d] = _drift(_patch(SCHED, HOOKED), SCHED, new)
    assert d.function == "Scheduler.schedule" and d.detail == "is gone from the new upstream"


def test_insertion_between_functions_hooks_neither():
    # module-level lines right after helper()'s last line: helper() is not what they hook
    patched = SCHED.replace("    return 1\n", "    return 1\nADDED = 3\n")
    new = SCHED.replace("return 1", "return 10").replace("return 2", "return 20")
    assert _drift(_patch(SCHED, patched), SCHED, new) == []
    # an insertion inside a method hooks that method
    inside = SCHED.replace("        return out\n", "        out.sort()\n        return out\n")
    new = SCHED.replace("if budget <= 0:", "if budget < 1:")
    assert [d.function for d in _drift(_patch(SCHED, inside), SCHED, new)] == ["Scheduler.schedule"]


def test_non_python_and_new_files_are_not_checked():
    assert _drift(_patch("a\nb\n", "a\nc\n", path="docs/x.md"), "a\nb\n", "z\n") == []
    assert _drift(_patch(None, "X = 1\n", path="vllm/new.py"), None, "X = 2\n") == []


@pytest.fixture
def pins(tmp_path, upstream):
    repo = tmp_path / "upstream-git"
    v1 = git_commit(repo, {**SOURCE, "vllm/scheduler.py": SCHED}, "v1")
    upstream.add_patch("0001-hook.patch", file_patch("vllm/scheduler.py", SCHED, HOOKED, "hook schedule"))
    old_lock = tmp_path / "old.lock"
    pin_git(upstream, str(repo), v1)
    old_lock.write_bytes((upstream.root / "upstream.lock").read_bytes())
    return repo, old_lock


def test_check_drift_from_flags_a_clean_patch(upstream, pins):
    repo, old_lock = pins
    v2 = git_commit(repo, {"vllm/scheduler.py": SCHED.replace("budget -= 1\n", "budget -= req.cost\n")}, "v2")
    pin_git(upstream, str(repo), v2)
    code, out = run_json("check", *upstream.args())
    assert code == errors.OK and out["patches"][0]["status"] == "applied"  # it applies: check alone passes
    code, out = run_json("check", *upstream.args(), "--drift-from", str(old_lock))
    assert code == errors.PATCH_FAILED and not out["ok"]
    patch = out["patches"][0]
    assert patch["status"] == "applied"
    assert [(d["function"], d["hunk"]) for d in patch["drift"]] == [("Scheduler.schedule", 1)]


def test_check_drift_from_without_drift_passes(upstream, pins):
    repo, old_lock = pins
    v2 = git_commit(repo, {"vllm/scheduler.py": SCHED.replace("return 1\n", "return 11\n")}, "v2")
    pin_git(upstream, str(repo), v2)
    code, out = run_json("check", *upstream.args(), "--drift-from", str(old_lock))
    assert code == errors.OK and out["patches"][0]["drift"] == [], out
