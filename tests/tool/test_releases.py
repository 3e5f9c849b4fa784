"""Several supported releases from one commit (overlay/releases.py, docs/releases.md).

A synthetic project pinned to 1.0.0 with two patches gains 2.0.0 by `rebase --to 2.0.0 --add`.
2.0.0 moves every line of engine.py (offsets for both patches) and edits the line beside "ten"'s
hunk (its change differs there), so 1.0.0 keeps its own text of "ten" and none of "twenty".
"""

import shutil

import pytest
from support.cli import run_json, run_tool
from support.synthetic import ENGINE, SOURCE, LocalIndex, file_patch, make_sdist, snapshot

from overlay import errors, releases

HEADER = "# 2.0.0\n" * 5
V2_ENGINE = HEADER + ENGINE.replace("def step_11(x):\n", "def step_11(x):  # 2.0.0\n")
V2 = {
    **SOURCE,
    "vllm/engine.py": V2_ENGINE,
    "vllm/_version.py": "__version__ = version = '2.0.0'\n__commit_id__ = commit_id = 'g2222222abc'\n",
}
TEN = ("x + 10\n", "x + 1000\n")
TWENTY = ("x + 20\n", "x + 2000\n")


@pytest.fixture
def two_releases(tmp_path, upstream):
    """The project after `rebase --to 2.0.0 --add`: 2.0.0 primary, 1.0.0 kept."""
    e = ENGINE
    upstream.add_patch("0001-ten.patch", file_patch("vllm/engine.py", e, e.replace(*TEN), "ten"))
    upstream.add_patch("0002-twenty.patch", file_patch("vllm/engine.py", e, e.replace(*TWENTY), "twenty"))
    (tmp_path / "v2").mkdir()
    release = make_sdist(tmp_path / "v2", V2, version="2.0.0")
    index = LocalIndex(tmp_path / "index", [upstream.sdist, release])
    try:
        code, out = run_json("rebase", *upstream.args(), "--to", "2.0.0", "--add", "--tree", str(tmp_path / "t"),
                             env=index.env)  # fmt: skip
    finally:
        index.close()
    assert code == errors.OK and out["completed"], out
    return upstream


def _releases(upstream) -> dict:
    code, out = run_json("releases", *upstream.args())
    assert code == errors.OK, out
    return {r["version"]: r for r in out["releases"]}


def test_add_keeps_the_old_primary_with_its_own_text_only_where_the_change_differs(two_releases):
    root = two_releases.root
    found = _releases(two_releases)
    assert list(found) == ["2.0.0", "1.0.0"] and found["2.0.0"]["primary"] and not found["1.0.0"]["primary"]
    assert found["1.0.0"]["own_patches"] == ["0001-ten.patch"]  # "twenty" only moved: shared
    assert found["2.0.0"]["wheels"] == [] and "cpu" in found["2.0.0"]["wheels_missing"]
    assert 'version = "1.0.0"' in (root / "releases" / "1.0.0" / "upstream.lock").read_text()
    own = (root / "releases" / "1.0.0" / "patches" / "0001-ten.patch").read_text()
    assert "def step_11(x):\n" in own and "# 2.0.0" not in own  # 1.0.0's context, as before
    # each release checks: the shared "twenty" at 1.0.0's offsets, the rest exactly
    code, out = run_json("check", *two_releases.args(), "--upstream", "1.0.0")
    assert code == errors.OK, out
    status = {p["patch"]: (p["status"], p["shared"]) for p in out["patches"]}
    assert status["0001-ten.patch"] == ("applied", False) and status["0002-twenty.patch"] == ("offset", True)
    code, out = run_json("check", *two_releases.args())
    assert code == errors.OK and out["upstream"] == "2.0.0", out
    assert {p["status"] for p in out["patches"]} == {"applied"}


def test_build_takes_the_newest_release_with_a_wheel_for_the_target(two_releases, tmp_path):
    code, out = run_json("build", *two_releases.args(), "--target", "cpu", "--dist", str(tmp_path / "d"))
    assert code == errors.OK, out
    assert out["provenance"]["upstream"]["version"] == "1.0.0"  # 2.0.0 has no cpu wheel
    proc = run_tool("build", *two_releases.args(), "--upstream", "2.0.0", "--target", "cpu", "--dist",
                    str(tmp_path / "e"))  # fmt: skip
    assert proc.returncode == errors.BUILD_REFUSED and "no binary wheel for target 'cpu' at vLLM 2.0.0" in proc.stderr
    proc = run_tool("check", *two_releases.args(), "--upstream", "9.9.9")
    assert proc.returncode == errors.BAD_INPUT and "not a supported release (supported: 2.0.0, 1.0.0" in proc.stderr


def test_export_from_a_kept_release_writes_only_changes_that_differ(two_releases, tmp_path):
    from overlay.gitcmd import git

    tree = tmp_path / "tree1"
    assert run_tool("apply", *two_releases.args(), "--upstream", "1.0.0", "--tree", str(tree)).returncode == 0
    own = two_releases.root / "releases" / "1.0.0" / "patches"
    before = snapshot(two_releases.root)
    assert run_tool("export", *two_releases.args(), "--tree", str(tree)).returncode == 0
    assert snapshot(two_releases.root) == before  # the tree knows its release; nothing moves
    # a different change for "twenty" on 1.0.0 only: it becomes 1.0.0's own text
    engine = (tree / "vllm" / "engine.py").read_text()
    (tree / "vllm" / "engine.py").write_text(engine.replace("x + 2000\n", "x + 2001\n"))
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    proc = run_tool("export", *two_releases.args(), "--tree", str(tree))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in own.iterdir()) == ["0001-ten.patch", "0002-twenty.patch"]
    assert snapshot(two_releases.root)["patches/0002-twenty.patch"] == before["patches/0002-twenty.patch"]
    # back to the shared change: the own text goes again
    (tree / "vllm" / "engine.py").write_text(engine)
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    assert run_tool("export", *two_releases.args(), "--tree", str(tree)).returncode == 0
    assert sorted(p.name for p in own.iterdir()) == ["0001-ten.patch"]
    proc = run_tool("export", *two_releases.args(), "--upstream", "2.0.0", "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT and "was made for vLLM 1.0.0, not 2.0.0" in proc.stderr


def test_a_kept_release_adds_a_patch_of_its_own_after_its_series(two_releases, tmp_path):
    """A fix to a file the primary no longer has: committed on the kept release's tree, it
    joins that release's series under a number past every patch name; removing one still fails."""
    from overlay.gitcmd import git

    tree = tmp_path / "tree1"
    assert run_tool("apply", *two_releases.args(), "--upstream", "1.0.0", "--tree", str(tree)).returncode == 0
    engine = (tree / "vllm" / "engine.py").read_text()
    (tree / "vllm" / "engine.py").write_text(engine.replace("x + 30\n", "x + 3000\n"))
    git(tree, "commit", "-q", "-a", "-m", "thirty\n\nWhy.\n\nUpstream-Status: not-forwarded\nTests: none")
    before, folder = snapshot(two_releases.root), two_releases.root / "releases" / "1.0.0"
    proc = run_tool("export", *two_releases.args(), "--tree", str(tree))
    assert proc.returncode == 0, proc.stderr
    assert snapshot(two_releases.root) == before  # the primary is untouched
    series = (folder / "series").read_text()
    assert series.split("\n")[-4:-1] == ["0001-ten.patch", "0002-twenty.patch", "0003-thirty.patch"]
    assert "thirty" in (folder / "patches" / "0003-thirty.patch").read_text()
    assert run_tool("check", *two_releases.args(), "--upstream", "1.0.0").returncode == errors.OK
    own = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert run_tool("export", *two_releases.args(), "--tree", str(tree)).returncode == 0
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == own  # again: no byte moves
    git(tree, "rebase", "-q", "--onto", "HEAD~2", "HEAD~1")  # "twenty" removed on the kept release
    proc = run_tool("export", *two_releases.args(), "--tree", str(tree))
    assert proc.returncode == errors.BAD_INPUT and "removed or renamed on the primary" in proc.stderr
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == own
    # the primary's next patch is numbered past the kept release's own (git's 0003 is taken)
    primary = tmp_path / "tree2"
    assert run_tool("apply", *two_releases.args(), "--tree", str(primary)).returncode == 0
    engine = (primary / "vllm" / "engine.py").read_text()
    (primary / "vllm" / "engine.py").write_text(engine.replace("x + 40\n", "x + 4000\n"))
    git(primary, "commit", "-q", "-a", "-m", "forty\n\nWhy.\n\nUpstream-Status: not-forwarded\nTests: none")
    proc = run_tool("export", *two_releases.args(), "--tree", str(primary))
    assert proc.returncode == 0, proc.stderr
    assert (two_releases.root / "series").read_text().split("\n")[-2] == "0004-forty.patch"


def test_drop_the_oldest_in_one_command_but_never_the_primary(two_releases):
    proc = run_tool("releases", *two_releases.args(), "--drop", "2.0.0")
    assert proc.returncode == errors.BAD_INPUT and "is the primary release" in proc.stderr
    assert run_tool("releases", *two_releases.args(), "--drop", "1.0.0").returncode == errors.OK
    assert list(_releases(two_releases)) == ["2.0.0"] and not (two_releases.root / "releases" / "1.0.0").exists()


def test_a_kept_release_is_advanced_in_its_own_folder(two_releases, tmp_path):
    files = {
        **SOURCE,
        "vllm/engine.py": "# 1.0.1\n" + ENGINE,
        "vllm/_version.py": "__version__ = version = '1.0.1'\n__commit_id__ = commit_id = 'g1010101abc'\n",
    }
    (tmp_path / "v101").mkdir()
    shutil.copy(two_releases.sdist, tmp_path / "v101")
    v101 = make_sdist(tmp_path / "v101", files, version="1.0.1")
    index = LocalIndex(tmp_path / "index101", [two_releases.sdist, v101])
    try:
        code, out = run_json("rebase", *two_releases.args(), "--upstream", "1.0.0", "--to", "1.0.1", "--tree",
                             str(tmp_path / "t101"), env=index.env)  # fmt: skip
    finally:
        index.close()
    assert code == errors.OK and out["completed"], out
    found = _releases(two_releases)
    assert list(found) == ["2.0.0", "1.0.1"] and found["1.0.1"]["own_patches"] == ["0001-ten.patch"]
    assert run_tool("check", *two_releases.args(), "--upstream", "1.0.1").returncode == errors.OK


def test_a_patch_that_leaves_the_primary_stays_with_the_release_that_needs_it(two_releases, tmp_path):
    v3 = {
        **V2,
        "vllm/engine.py": V2_ENGINE.replace(*TWENTY),  # 3.0.0 has "twenty" already
        "vllm/_version.py": "__version__ = version = '3.0.0'\n__commit_id__ = commit_id = 'g3333333abc'\n",
    }
    (tmp_path / "v3").mkdir()
    release = make_sdist(tmp_path / "v3", v3, version="3.0.0")
    v2 = make_sdist(tmp_path / "v3", V2, version="2.0.0")
    kept_patch = (two_releases.root / "patches" / "0002-twenty.patch").read_bytes()
    index = LocalIndex(tmp_path / "index3", [two_releases.sdist, v2, release])
    try:
        code, out = run_json("rebase", *two_releases.args(), "--to", "3.0.0", "--tree", str(tmp_path / "t3"),
                             env=index.env)  # fmt: skip
    finally:
        index.close()
    # completed, with a patch dropped from the primary: a review, not a failure to finish
    assert out["completed"] and code == errors.PATCH_FAILED, out
    root = two_releases.root
    assert "0002-twenty.patch" not in (root / "series").read_text()
    assert not (root / "patches" / "0002-twenty.patch").exists()
    own_series = root / "releases" / "1.0.0" / "series"
    assert own_series.read_text().split("\n")[-3:-1] == ["0001-ten.patch", "0002-twenty.patch"]
    assert releases.same_change((root / "releases" / "1.0.0" / "patches" / "0002-twenty.patch").read_bytes(),
                                kept_patch)  # fmt: skip
    # 1.0.0 still builds its tree with both patches; the new primary with one
    for pick in (["--upstream", "1.0.0"], []):
        proc = run_tool("check", *two_releases.args(), *pick)
        assert proc.returncode == errors.OK, proc.stdout + proc.stderr
