"""Multi-step windows with tensor parallelism: tensor_parallel_size = 2 against upstream with the
same parallel configuration, through ``vllm.LLM`` and ``vllm serve``.

On a CPU, TP = 2 runs two worker processes (the multiprocessing executor), one core each
(``VLLM_CPU_OMP_THREADS_BIND="0|1"``: a single NUMA node has no second node to bind to). Both ranks
run every window's inner steps and sample the same tokens; the oracle is upstream with TP = 2 (a
sharded matmul rounds differently from TP = 1, so TP = 1 is no oracle). On Model Runner V2 the
ranks must also end a window at the same step when a request arrives mid-window: they agree by a
CPU all-reduce per inner step (vllm/v1/worker/gpu/multi_step/window_yield.py), which the served
test's arrivals exercise (a rank that cut alone would hang the engine or change the tokens).
On Model Runner V2 a structured-output case runs in windows too (each rank masks with its own
copy of the grammar).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.engines import generate
from support.parity import BASE, CASES, PROMPTS, STRUCTURED_CASE, assert_same_outputs
from support.serve_cases import GREEDY, SEEDED, assert_same, completion, overlay_server, upstream_server
from support.venvs import windows_runner

pytestmark = [pytest.mark.every_release, pytest.mark.usefixtures("windows")]

TP = {"tensor_parallel_size": 2}
TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
STEPS = 8
TP_CASES = [
    {"prompts": PROMPTS, "params": CASES[name]} for name in ("greedy", "seeded", "penalties", "logprobs", "stop_ids")
] + [STRUCTURED_CASE]
STEPS_METRIC = "vllm:iteration_tokens_total_count"
LONG = {**GREEDY, "max_tokens": 200, "extra_body": {"ignore_eos": True}}
ARRIVALS = (GREEDY, SEEDED, {**GREEDY, "logprobs": 3})


@pytest.fixture(scope="module")
def tp_runs(upstream_python, overlay_python, tiny_llama, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp")
    llm = {**BASE, **TP, "model": str(tiny_llama)}
    runs = {}
    builds = (("upstream", upstream_python, {}), ("overlay", overlay_python, {"num_scheduler_steps": STEPS}))
    for build, python, extra in builds:
        job = {"llm": {**llm, **extra}, "cases": TP_CASES, "env": TP_ENV}
        runs[build], runs[f"{build}_log"] = generate(python, job, tmp, f"tp-{build}", timeout=900)
    return runs


def test_tp2_windows_match_upstream_tp2(tp_runs):
    assert_same_outputs(tp_runs["overlay"], tp_runs["upstream"], cases=TP_CASES)


def test_tp2_windows_ran(tp_runs):
    """Windows ran (far fewer engine steps than upstream's) on two ranks."""
    ours, theirs = tp_runs["overlay"], tp_runs["upstream"]
    assert ours["counters"][STEPS_METRIC] < 0.45 * theirs["counters"][STEPS_METRIC]
    assert "tensor_parallel_size=2" in tp_runs["overlay_log"]


@pytest.fixture(scope="module")
def tp_servers(upstream_python, overlay_python, tiny_llama, tmp_path_factory):
    logs = tmp_path_factory.mktemp("tp-servers")
    args = ["--tensor-parallel-size", "2"]
    windows = [*args, "--num-scheduler-steps", str(STEPS)]
    with (
        upstream_server(upstream_python, tiny_llama, logs / "up.log", args, TP_ENV) as up,
        overlay_server(overlay_python, tiny_llama, logs / "ours.log", windows, TP_ENV) as ours,
    ):
        yield {"upstream": up, "overlay": ours}


def test_tp2_server_with_arrivals_matches_upstream_tp2(tp_servers):
    """Requests that arrive while others' windows run (on Model Runner V2 the windows yield to
    them: both ranks cut the same window at the same step) get upstream's answers, and so do
    the requests whose windows they cut."""

    def wave(server):
        with ThreadPoolExecutor(8) as pool:
            first = [pool.submit(completion, server, False, **LONG) for _ in range(2)]
            time.sleep(0.5)  # their windows are running
            later = [pool.submit(completion, server, False, **dict(p)) for p in ARRIVALS]
            return [f.result() for f in first + later]

    overlay = tp_servers["overlay"]
    yielded_before = overlay.metric("vllm:multi_step_windows_yielded_total")
    ours, theirs = wave(overlay), wave(tp_servers["upstream"])
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b)
    if windows_runner() == "mrv2":
        yielded = overlay.metric("vllm:multi_step_windows_yielded_total") - yielded_before
        assert yielded >= 1, "no window yielded to the arrivals"
