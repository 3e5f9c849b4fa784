"""apply / check on a synthetic upstream: per-patch report, zero fuzz, drift, already-upstream."""

from support.cli import run_json, run_tool
from support.synthetic import ENGINE, file_patch

from overlay import errors

EDITED = ENGINE.replace("return x + 20\n", "return x + 2000\n")


def test_clean_series_applies_and_reports_each_patch(upstream):
    upstream.add_patch("0001-engine.patch", file_patch("vllm/engine.py", ENGINE, EDITED, "engine: edit"))
    upstream.add_patch("0002-new.patch", file_patch("vllm/new.py", None, "X = 1\n", "new module"))
    code, out = run_json("check", *upstream.args())
    assert code == errors.OK and out["ok"]
    assert [(p["patch"], p["status"], p["hunks"]) for p in out["patches"]] == [
        ("0001-engine.patch", "applied", 1),
        ("0002-new.patch", "applied", 1),
    ]
    proc = run_tool("check", *upstream.args())
    assert "0001-engine.patch" in proc.stdout and "applied" in proc.stdout


def test_fuzz_is_refused_naming_patch_file_and_hunk(upstream):
    # Upstream changed a context line of the hunk: GNU patch would apply it
    # with fuzz; we must not.
    drifted = ENGINE.replace("def step_21(x):\n", "def step_21(x):  # patch expects this\n")
    text = file_patch("vllm/engine.py", drifted, drifted.replace("x + 20\n", "x + 2000\n"), "engine: edit")
    upstream.add_patch("0001-engine.patch", text)
    upstream.add_patch("0002-later.patch", file_patch("vllm/later.py", None, "Y = 2\n", "later"))
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED and not out["ok"]
    first, second = out["patches"]
    assert first["status"] == "conflict"
    assert first["failed_file"] == "vllm/engine.py"
    assert first["failed_hunk"].startswith("vllm/engine.py hunk #1 (@@ -")
    assert second["status"] == "not-tried"
    # apply refuses too, and writes no tree
    tree = upstream.root / "tree"
    proc = run_tool("apply", *upstream.args(), "--tree", str(tree))
    assert proc.returncode == errors.PATCH_FAILED
    assert "0001-engine.patch" in proc.stdout and "hunk #1" in proc.stdout
    assert not tree.exists()


def test_offset_drift_applies_but_check_fails(upstream):
    # The patch was made against a file with 3 more lines at the top.
    shifted = "# one\n# two\n# three\n" + ENGINE
    text = file_patch("vllm/engine.py", shifted, shifted.replace("x + 20\n", "x + 2000\n"), "engine: edit")
    upstream.add_patch("0001-engine.patch", text)
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED
    assert out["patches"][0]["status"] == "offset"
    assert "offset -3 lines" in out["patches"][0]["offsets"][0]
    tree = upstream.root / "tree"
    code, out = run_json("apply", *upstream.args(), "--tree", str(tree))
    assert code == errors.OK, out
    assert "x + 2000" in (tree / "vllm/engine.py").read_text()


def test_patch_already_upstream_is_flagged(upstream):
    # The patch turns the edited file into upstream's: upstream already has
    # what it makes, so it reverse-applies.
    text = file_patch("vllm/engine.py", EDITED, ENGINE, "engine: x")
    upstream.add_patch("0001-engine.patch", text)
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED
    assert out["patches"][0]["status"] == "already-upstream"


def test_new_file_already_upstream_is_flagged(upstream):
    text = file_patch("README.md", None, "fake upstream\n", "add readme")
    upstream.add_patch("0001-readme.patch", text)
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED
    assert out["patches"][0]["status"] == "already-upstream"


def test_missing_target_file_is_named(upstream):
    text = file_patch("vllm/gone.py", "A = 1\n", "A = 2\n", "edit gone file")
    upstream.add_patch("0001-gone.patch", text)
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED
    assert out["patches"][0]["failed_file"] == "vllm/gone.py"
    assert "not in the upstream tree" in out["patches"][0]["problem"]


def test_apply_makes_one_commit_per_patch_and_keeps_existing_tree(upstream):
    import subprocess

    upstream.add_patch("0001-engine.patch", file_patch("vllm/engine.py", ENGINE, EDITED, "engine: edit"))
    upstream.add_patch("0002-new.patch", file_patch("vllm/new.py", None, "X = 1\n", "new module"))
    tree = upstream.root / "tree"
    assert run_tool("apply", *upstream.args(), "--tree", str(tree)).returncode == 0
    log = subprocess.run(
        ["git", "log", "--format=%s", "upstream..patched"], cwd=tree, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert log[:2] == ["new module", "engine: edit"]
    proc = run_tool("apply", *upstream.args(), "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT and "already exists" in proc.stderr
    assert run_tool("apply", *upstream.args(), "--tree", str(tree), "--force").returncode == 0
