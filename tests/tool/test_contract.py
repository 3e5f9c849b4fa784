"""The upstream contract (overlay/contract.py): names our modules use, checked against a tree."""

from support.cli import ROOT, run_json
from support.synthetic import ENGINE, file_patch

from overlay import contract, errors, modules

CONTRACT = """\
[receivers]
engine = "vllm/engine.py:Engine"

[classes."vllm/engine.py:Engine"]
names = ["step"]
"""


def test_every_upstream_name_our_modules_read_is_declared():
    """Each `runner.x`, `scheduler.x`, ... in src/vllm/ is listed in contract.toml: the list keeps up."""
    declared = contract.load(ROOT / contract.CONTRACT_FILE)
    ours = modules.load_modules(ROOT / "src")
    assert declared is not None and ours
    assert contract.undeclared(declared, ours) == []
    assert len(declared.classes["vllm/v1/worker/gpu_model_runner.py:GPUModelRunner"]) >= 30


def test_undeclared_finds_a_name_our_code_reads():
    declared = contract.Contract(
        {"vllm/scheduler.py:Scheduler": ("queue",)}, {"scheduler": "vllm/scheduler.py:Scheduler"}
    )
    code = modules.Module(
        "vllm/ours.py", b"def f(self, scheduler):\n    return scheduler.queue, self.scheduler.budget\n"
    )
    assert contract.undeclared(declared, [code]) == ["vllm/ours.py:2: scheduler.budget (vllm/scheduler.py:Scheduler)"]


def test_renames_and_removals_upstream_are_named():
    upstream = {
        "vllm/scheduler.py": (
            "class Scheduler:\n    def __init__(self):\n        self.queue = []\n\n    def plan(self): ...\n"
        ),
        "vllm/outputs.py": "from dataclasses import dataclass\nOut = int\n",
        "vllm/config/__init__.py": "",
        "vllm/config/model.py": "class ModelConfig: ...\n",
    }
    declared = contract.Contract(
        {"vllm/scheduler.py:Scheduler": ("schedule", "queue"), "vllm/gone.py:Gone": ("x",)}, {}
    )
    code = modules.Module(
        "vllm/ours.py",
        b"from vllm.outputs import Out, Renamed\nfrom vllm.config import model\n"
        b"from vllm.ours2 import Y\nimport vllm.nope\n",
    )
    found = contract.problems(declared, [code, modules.Module("vllm/ours2.py", b"Y = 1\n")], upstream.get)
    assert found == [
        "vllm/scheduler.py: Scheduler.schedule is gone",
        "vllm/gone.py: class Gone is gone (our modules use x)",
        "vllm/ours.py:1: imports Renamed from vllm.outputs, which no longer defines it",
        "vllm/ours.py:4: imports vllm.nope, which is gone",
    ]  # `model` is a submodule, `vllm.ours2` one of ours


def test_a_new_field_of_a_class_we_build_by_keyword_is_reported():
    upstream = {"vllm/state.py": "class State(NamedTuple):\n    a: int\n    b: int\n    c: int | None\n"}
    declared = contract.Contract({"vllm/state.py:State": ("a", "b")}, {}, frozenset({"vllm/state.py:State"}))
    assert contract.problems(declared, [], upstream.get) == [
        "vllm/state.py: State has new fields c (our modules build it by keyword)"
    ]


def test_check_reports_a_broken_contract(upstream):
    upstream.add_patch("0001-e.patch", file_patch("vllm/engine.py", ENGINE, ENGINE + "# hook\n", "e"))
    (upstream.root / contract.CONTRACT_FILE).write_text(CONTRACT)
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED and not out["ok"]
    assert out["contract"] == ["vllm/engine.py: class Engine is gone (our modules use step)"], out


def test_every_family_module_is_a_file_of_src():
    """contract.toml's [families] name real src/ files or folders of them: a renamed module cannot
    slip out of its family."""
    declared = contract.load(ROOT / contract.CONTRACT_FILE)
    assert declared is not None and declared.families
    ours = {m.path for m in modules.load_modules(ROOT / "src")}
    for family in declared.families:
        named = {entry for entry in family.modules if any(contract.Family("", "", (entry,)).holds(p) for p in ours)}
        assert family.modules and named == set(family.modules), (family.name, set(family.modules) - named)
