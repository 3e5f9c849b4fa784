"""Token parity on Model Runner V2's own code path (vllm/v1/worker/gpu/), where a release runs it.

From vLLM 0.34.0 an x86 CPU runs `CPUModelRunner`, a subclass of the GPU's Model Runner V2, with
its Triton kernels compiled by triton-cpu, which the package registries here do not carry. The
suite's main CPU base for such a release (the standalone base) runs upstream's runner for CPUs
without Triton instead. This file runs a parity slice on the interpreter base
(tests/support/cpu_bases.py): the same Python as a triton-cpu install, every Triton kernel run by
Triton's interpreter, so the overlay's patches meet the runner GPU users run. Slow (100-300 ms a
decode step): a few cases, short outputs, one engine start per build. The oracle is the unpatched
release on the same base (async scheduling off, upstream's CPU default); the overlay runs its CPU
default, async on, once with single steps and once with multi-step windows (N = 8: every inner
step is GPUModelRunner's own execute_model + sample_tokens, vllm/v1/worker/gpu/multi_step/).
"""

from __future__ import annotations

import re

import pytest
from support.engines import generate
from support.parity import BASE, CASES, PROMPTS, STRUCTURED_CASE, assert_same_outputs
from support.venvs import windows_runner

pytestmark = pytest.mark.every_release

SHORT = 12  # output tokens per request
MRV2_CASES = [
    {"prompts": PROMPTS, "params": {**CASES[name], "max_tokens": SHORT}}
    for name in ("greedy", "seeded", "penalties", "stop_ids", "min_tokens")
] + [
    {"prompts": PROMPTS[:4], "params": {**CASES["logprobs"], "max_tokens": 6}},
    {"prompts": PROMPTS[:4], "params": {**CASES["n2"], "max_tokens": 8}},
    # structured output: windows mask each inner step with the worker's copy of the grammar,
    # applied by the runner's own bitmask kernel (test_multi_step_structured.py has the rest)
    {"prompts": PROMPTS[:4], "params": {**STRUCTURED_CASE["params"], "max_tokens": SHORT}},
]
LLM = {**BASE, "max_num_seqs": 8, "max_num_batched_tokens": 1024}
RUNNER = "CPUModelRunner"  # vllm/v1/worker/cpu_model_runner.py: Model Runner V2 on a CPU
WINDOW, WINDOWED = 8, "overlay-N8"


@pytest.fixture(scope="module")
def mrv2_runs(interpreter_pythons, tiny_llama, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mrv2")
    job = {"llm": {**LLM, "model": str(tiny_llama)}, "cases": MRV2_CASES}
    runs = {}
    for build, python in interpreter_pythons.items():
        runs[build], runs[f"{build}_log"] = generate(python, job, tmp, build, timeout=1200)
    if windows_runner() == "mrv2":
        windowed = {**job, "llm": {**job["llm"], "num_scheduler_steps": WINDOW}}
        runs[WINDOWED], runs[f"{WINDOWED}_log"] = generate(
            interpreter_pythons["overlay"], windowed, tmp, WINDOWED, timeout=1200
        )
    return runs


def test_overlay_matches_upstream_on_model_runner_v2(mrv2_runs):
    ours, theirs = mrv2_runs["overlay"], mrv2_runs["upstream"]
    assert theirs["async_scheduling"] is False and ours["async_scheduling"] is True
    assert_same_outputs(ours, theirs, cases=MRV2_CASES)


def test_both_ran_model_runner_v2(mrv2_runs):
    """Not vacuous: both engines went through Model Runner V2's GPU code, not the standalone runner."""
    for build in ("upstream", "overlay"):
        log = mrv2_runs[f"{build}_log"]
        assert RUNNER in log and "StandaloneCPUModelRunner" not in log, log[-3000:]


def test_windows_match_upstream_on_model_runner_v2(mrv2_runs):
    """Multi-step windows on GPUModelRunner's code: upstream's tokens, with windows really run."""
    if WINDOWED not in mrv2_runs:
        pytest.skip("windows run on Model Runner V1 here")
    ours, theirs = mrv2_runs[WINDOWED], mrv2_runs["upstream"]
    assert ours["async_scheduling"] is True
    assert_same_outputs(ours, theirs, cases=MRV2_CASES)
    log = mrv2_runs[f"{WINDOWED}_log"]
    windows = re.findall(r"Multi-step decode on Model Runner V2 \((\w+), \w+\): (\d+) windows, ([\d.]+) steps", log)
    assert windows and windows[-1][0] == RUNNER and float(windows[-1][2]) > 2, windows or log[-3000:]
