"""Module families (overlay/families.py): a tree takes our modules only for the runners it has."""

from support.cli import run_json, run_tool
from support.synthetic import ENGINE, file_patch, snapshot

from overlay import contract, errors

CONTRACT = """\
[families.engine-runner]
serves = "vllm/engine.py"
modules = ["vllm/ours_engine.py"]

[families.gone-runner]
serves = "vllm/gone_runner.py"
modules = ["vllm/ours_gone.py", "tests/test_ours_gone.py"]

[classes."vllm/gone_runner.py:GoneRunner"]
family = "gone-runner"
names = ["step"]
"""


def _project(upstream):
    upstream.add_patch("0001-e.patch", file_patch("vllm/engine.py", ENGINE, ENGINE + "# hook\n", "e"))
    (upstream.root / contract.CONTRACT_FILE).write_text(CONTRACT)
    files = {
        "vllm/ours_engine.py": "ENGINE_SIDE = 1\n",
        "vllm/ours_gone.py": "from vllm.gone_runner import GoneRunner\n",
        "tests/test_ours_gone.py": "def test_gone(): ...\n",
        "vllm/common.py": "COMMON = 1\n",
    }
    for path, text in files.items():
        (upstream.root / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (upstream.root / "src" / path).write_text(text)


def test_a_tree_takes_only_the_families_whose_runner_it_has(upstream, tmp_path):
    _project(upstream)
    # check: the gone runner's class and our module importing it are not checked on this tree
    code, out = run_json("check", *upstream.args())
    assert code == errors.OK and out["contract"] == [], out
    tree = tmp_path / "tree"
    assert run_tool("apply", *upstream.args(), "--tree", str(tree)).returncode == errors.OK
    assert (tree / "vllm/ours_engine.py").exists() and (tree / "vllm/common.py").exists()
    assert not (tree / "vllm/ours_gone.py").exists() and not (tree / "tests/test_ours_gone.py").exists()
    # export from that tree leaves the other family's files in src/ as they are
    src_before = {k: v for k, v in snapshot(upstream.root).items() if k.startswith("src/")}
    code, out = run_json("export", *upstream.args(), "--tree", str(tree))
    assert code == errors.OK, out
    assert {k: v for k, v in snapshot(upstream.root).items() if k.startswith("src/")} == src_before


def test_a_family_names_a_folder_by_a_path_ending_in_a_slash(upstream, tmp_path):
    _project(upstream)
    folder = CONTRACT.replace('"vllm/ours_gone.py", "tests', '"vllm/gone/", "tests')
    (upstream.root / contract.CONTRACT_FILE).write_text(folder)
    for path in ("vllm/gone/__init__.py", "vllm/gone/step.py", "vllm/gone_sibling.py"):
        (upstream.root / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (upstream.root / "src" / path).write_text("X = 1\n")
    tree = tmp_path / "tree"
    assert run_tool("apply", *upstream.args(), "--tree", str(tree)).returncode == errors.OK
    assert not (tree / "vllm/gone/step.py").exists() and not (tree / "vllm/gone/__init__.py").exists()
    assert (tree / "vllm/gone_sibling.py").exists()  # beside the folder, not in it


def test_a_family_whose_runner_is_there_is_laid_and_checked(upstream):
    _project(upstream)
    (upstream.root / contract.CONTRACT_FILE).write_text(CONTRACT.replace("vllm/gone_runner.py", "vllm/engine.py"))
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED, out
    assert "vllm/engine.py: class GoneRunner is gone (our modules use step)" in out["contract"], out


def test_a_class_naming_an_undeclared_family_is_refused(upstream):
    _project(upstream)
    (upstream.root / contract.CONTRACT_FILE).write_text(CONTRACT.replace('family = "gone-runner"', 'family = "x"'))
    code, out = run_json("check", *upstream.args())
    assert code == errors.BAD_INPUT and "families with no [families] entry: x" in out["error"], out


def test_a_rebase_onto_an_upstream_without_the_runner_keeps_its_family_in_src(upstream, tmp_path):
    """The new upstream dropped the runner a family serves: the rebased series lays no module of
    it, and src/ still holds the family's files for the releases that have that runner."""
    from support.synthetic import SOURCE, git_commit, pin_git

    repo = tmp_path / "upstream-git"
    v1 = git_commit(repo, {**SOURCE, "vllm/gone_runner.py": "class GoneRunner:\n    def step(self): ...\n"}, "v1")
    pin_git(upstream, str(repo), v1)
    _project(upstream)
    v2 = git_commit(repo, {"vllm/gone_runner.py": None}, "v2: the runner is removed")
    src_before = {k: v for k, v in snapshot(upstream.root).items() if k.startswith("src/")}
    code, out = run_json("rebase", *upstream.args(), "--to-commit", v2, "--git-url", str(repo),
                         "--upstream-version", "2.0.0", "--tree", str(tmp_path / "t"))  # fmt: skip
    assert out["completed"] and out["contract"] == [], out
    assert {k: v for k, v in snapshot(upstream.root).items() if k.startswith("src/")} == src_before


def test_names_a_family_adds_to_a_shared_class_are_checked_only_where_it_is_laid(tmp_path):
    """A class every tree has (the scheduler's output) may gain a name only one family's modules
    read: it is checked on the trees that lay that family, not on the others."""
    path = tmp_path / contract.CONTRACT_FILE
    path.write_text(
        CONTRACT
        + '\n[classes."vllm/output.py:Output"]\nnames = ["tokens"]\nfamily_names = { gone-runner = ["skip"] }\n'
    )
    declared = contract.load(path)
    source = {"vllm/output.py": "class Output:\n    tokens: list\n"}
    assert contract.problems(declared, [], source.get) == []
    source["vllm/gone_runner.py"] = "class GoneRunner:\n    def step(self): ...\n"
    assert contract.problems(declared, [], source.get) == ["vllm/output.py: Output.skip is gone"]
    source["vllm/output.py"] += "    skip: bool\n"
    assert contract.problems(declared, [], source.get) == []
