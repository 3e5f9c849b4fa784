"""bisect: the first upstream commit that breaks the series, one patch, or a test command,
found in a local git repository with synthetic commits."""

import pytest
from support.cli import run_json
from support.synthetic import ENGINE, GIT, SOURCE, file_patch, git_commit

from overlay import errors


def _edit(text, old, new):
    assert old in text
    return text.replace(old, new, 1)


@pytest.fixture
def history(tmp_path):
    """c0 .. c8 on main; c3 adds a marker the test rejects, c4 breaks patch 0002, c6 breaks patch 0001.
    A side branch merged at c5 (first-parent history skips its inner commit)."""
    import subprocess

    repo = tmp_path / "upstream-git"
    engine = ENGINE
    commits = [git_commit(repo, dict(SOURCE), "c0")]
    commits.append(git_commit(repo, {"README.md": "c1\n"}, "c1"))
    commits.append(git_commit(repo, {"docs.md": "c2\n"}, "c2"))
    engine = _edit(engine, "x + 38\n", "x + 38  # BROKEN for the test\n")
    commits.append(git_commit(repo, {"vllm/engine.py": engine}, "c3: upstream breaks behaviour"))
    engine = _edit(engine, "x + 20\n", "x + 21\n")
    commits.append(git_commit(repo, {"vllm/engine.py": engine}, "c4: upstream rewrites step_20"))
    subprocess.run([*GIT, "checkout", "-q", "-b", "side", "HEAD~2"], cwd=repo, check=True)
    git_commit(repo, {"side.md": "side\n"}, "side work")
    subprocess.run([*GIT, "checkout", "-q", "main"], cwd=repo, check=True)
    subprocess.run([*GIT, "merge", "-q", "--no-edit", "side", "-m", "c5: merge side"], cwd=repo, check=True)
    commits.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                  check=True).stdout.strip())  # fmt: skip
    engine = _edit(engine, "x + 5\n", "x + 6\n")
    commits.append(git_commit(repo, {"vllm/engine.py": engine}, "c6: upstream rewrites step_5"))
    commits.append(git_commit(repo, {"README.md": "c7\n"}, "c7"))
    commits.append(git_commit(repo, {"README.md": "c8\n"}, "c8"))
    return repo, commits


@pytest.fixture
def series(upstream):
    e = ENGINE
    upstream.add_patch("0001-five.patch", file_patch("vllm/engine.py", e, _edit(e, "x + 5\n", "x + 500\n"), "five"))
    upstream.add_patch("0002-twenty.patch",
                       file_patch("vllm/engine.py", e, _edit(e, "x + 20\n", "x + 2000\n"), "twenty"))  # fmt: skip
    return upstream


def _bisect(upstream, repo, good, bad, *extra):
    return run_json("bisect", *upstream.args(), "--git-url", str(repo), "--good", good, "--bad", bad, *extra)


def test_first_commit_breaking_the_series(series, history):
    repo, c = history
    code, out = _bisect(series, repo, c[0], c[8])
    assert code == errors.OK, out
    assert out["first_bad"] == c[4] and out["subject"] == "c4: upstream rewrites step_20"
    assert out["why"].startswith("0002-twenty.patch: conflict (vllm/engine.py hunk #1")
    # binary search: good and bad, then about log2(8) probes, not all eight
    assert len(out["tested"]) <= 2 + 4


def test_first_commit_breaking_one_patch(series, history):
    repo, c = history
    code, out = _bisect(series, repo, c[0], c[8], "--patch", "0001-five.patch")
    assert code == errors.OK, out
    assert out["first_bad"] == c[6] and "0001-five.patch: conflict" in out["why"]


def test_first_commit_failing_the_test_command(series, history):
    repo, c = history
    test = "grep -q 'x + 500' vllm/engine.py && ! grep -q BROKEN vllm/engine.py"
    code, out = _bisect(series, repo, c[0], c[4], "--test", test)
    assert code == errors.OK, out
    assert out["first_bad"] == c[3] and "the test failed (exit 1)" in out["why"]


def test_skipped_commits_are_stepped_over(series, history):
    repo, c = history
    # c1 cannot be tested (exit 125): its neighbour decides, the search still finds c3
    test = "if [ ! -f docs.md ] && grep -q c1 README.md; then exit 125; fi; ! grep -q BROKEN vllm/engine.py"
    code, out = _bisect(series, repo, c[0], c[3], "--test", test)
    assert code == errors.OK, out
    assert out["first_bad"] == c[3]
    assert [t["commit"] for t in out["tested"] if t["skipped"]] == [c[1]]


def test_only_skipped_commits_left_names_the_candidates(series, history):
    repo, c = history
    # c1 and c2 cannot be tested: the first bad commit is c1, c2 or c3, and bisect says so
    unbroken = "! grep -q BROKEN vllm/engine.py"
    test = f"if {unbroken} && grep -q c1 README.md; then exit 125; fi; {unbroken}"
    code, out = _bisect(series, repo, c[0], c[4], "--test", test)
    assert code == errors.BAD_INPUT
    assert all(x[:12] in out["error"] for x in c[1:4]) and c[4][:12] not in out["error"]


def test_good_that_is_bad_and_bad_that_is_good_are_refused(series, history):
    repo, c = history
    code, out = _bisect(series, repo, c[4], c[8])
    assert code == errors.BAD_INPUT and "is not good" in out["error"]
    code, out = _bisect(series, repo, c[0], c[2])
    assert code == errors.BAD_INPUT and "is not bad" in out["error"]
    code, out = _bisect(series, repo, c[8], c[0])
    assert code == errors.BAD_INPUT and "not an ancestor" in out["error"]
    code, out = _bisect(series, repo, c[0], c[8], "--patch", "0009-none.patch")
    assert code == errors.BAD_INPUT and "not in the series" in out["error"]


def test_modules_from_src_are_laid_in_first(series, history):
    """src/'s files travel with every probe: a commit that adds one of them upstream is first bad."""
    repo, c = history
    (series.root / "src" / "docs.md").parent.mkdir(parents=True, exist_ok=True)
    (series.root / "src" / "docs.md").write_text("ours\n")  # upstream's c2 adds docs.md
    code, out = _bisect(series, repo, c[0], c[8], "--patch", "0001-five.patch")
    assert code == errors.OK, out
    assert out["first_bad"] == c[2] and out["why"].startswith("0000-our-modules-from-src.patch: conflict"), out
