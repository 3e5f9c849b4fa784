"""Speculative decoding inside multi-step windows (patch 0008), against upstream.

The oracle is upstream vLLM 0.32.0 *without* speculative decoding: with greedy
sampling, drafts may only change speed, never tokens. The overlay runs
``--num-scheduler-steps N`` with drafts from ngram (non-uniform: requests
without a match get none), a draft model equal to the target (every draft
accepted) and a noisy draft model (its weights perturbed: some drafts accepted,
most rejected, so every window has steps whose rejected positions must be
given back). Each run must show drafts proposed and accepted (not vacuous),
far fewer engine steps than upstream (windows ran) and an empty KV cache after
it; one run forces preemption, and a served request is aborted mid-window.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from support.cli import ROOT
from support.engines import generate
from support.parity import BASE, CASES, ENGINES, PROMPTS, REPETITIVE, assert_same_outputs
from support.serve_cases import GREEDY, assert_disconnect_frees_the_request, assert_same, completion, server_pair

SPEC_CASES = [
    {"prompts": REPETITIVE + PROMPTS, "params": {**CASES["greedy"], "max_tokens": 48}},
    {"prompts": PROMPTS, "params": CASES["stop_ids"]},  # stops inside windows, inside accepted drafts
    {"prompts": PROMPTS, "params": CASES["max3"]},  # fewer tokens than a window
    {"prompts": PROMPTS, "params": {**CASES["logprobs"], "prompt_logprobs": None}},  # rows per accepted token
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# name: (drafter, steps, engine overrides, cases)
RUNS = {
    "ngram-N2": ("ngram", 2, {}, SPEC_CASES),
    "ngram-N4": ("ngram", 4, {}, SPEC_CASES),
    "self-N4": ("self", 4, {}, SPEC_CASES),
    "noisy-N2": ("noisy", 2, {}, SPEC_CASES),
    "noisy-N4": ("noisy", 4, {}, SPEC_CASES),
    "noisy-N4-preempt": ("noisy", 4, ENGINES["preempt"][1], ENGINES["preempt"][2][:1]),
}
STEPS = "vllm:iteration_tokens_total_count"


@pytest.fixture(scope="module")
def drafters(tiny_llama, upstream_python, tmp_path_factory):
    noisy = tmp_path_factory.mktemp("models") / "tiny-llama-noisy"
    build = [upstream_python, ROOT / "tests/support/tiny_model.py", noisy, "--perturb", "0.05"]
    subprocess.run([str(c) for c in build], check=True, capture_output=True)
    return {
        "ngram": NGRAM,
        "self": {"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3},
        "noisy": {"method": "draft_model", "model": str(noisy), "num_speculative_tokens": 3},
    }


@pytest.fixture(scope="module")
def spec_run(tiny_llama, upstream_python, overlay_python, drafters, tmp_path_factory):
    """spec_run(name) -> (overlay outputs, upstream outputs without drafts), each run once."""
    tmp = tmp_path_factory.mktemp("spec")
    done: dict = {}

    def _run(name: str):
        drafter, steps, overrides, cases = RUNS[name]
        llm = {**BASE, **overrides, "model": str(tiny_llama)}
        oracle_key = repr((overrides, cases))
        if oracle_key not in done:
            done[oracle_key], _ = generate(upstream_python, {"llm": llm, "cases": cases}, tmp, f"up-{len(done)}")
        if name not in done:
            spec = {**llm, "num_scheduler_steps": steps, "speculative_config": drafters[drafter]}
            done[name], done[name + "-log"] = generate(overlay_python, {"llm": spec, "cases": cases}, tmp, name)
        return done[name], done[oracle_key], done[name + "-log"]

    return _run


@pytest.mark.parametrize("name", list(RUNS))
def test_spec_windows_match_upstream_without_drafts(spec_run, name):
    ours, theirs, log = spec_run(name)
    assert_same_outputs(ours, theirs, cases=RUNS[name][3])
    counters = ours["counters"]
    assert counters["vllm:spec_decode_num_draft_tokens"] > 0
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0
    assert counters["vllm:kv_cache_usage_perc"] == 0, "a window leaked KV blocks"
    assert ours["async_scheduling"] is False
    assert "runs with async scheduling off" in log or RUNS[name][0] == "ngram"  # upstream turns it off for ngram
    if "preempt" in name:
        assert counters["vllm:num_preemptions"] > 0
    else:
        # Windows ran: N steps per schedule, each generating 1 + accepted tokens.
        assert counters[STEPS] < 0.6 * theirs["counters"][STEPS], (counters[STEPS], theirs["counters"][STEPS])


def test_drafts_are_partly_rejected_with_the_noisy_drafter(spec_run):
    """The noisy drafter's windows have rejections (the positions to give back) and acceptances."""
    counters = spec_run("noisy-N4")[0]["counters"]
    drafted, accepted = counters["vllm:spec_decode_num_draft_tokens"], counters["vllm:spec_decode_num_accepted_tokens"]
    assert 0.05 < accepted / drafted < 0.9, (accepted, drafted)
    assert (
        spec_run("self-N4")[0]["counters"]["vllm:spec_decode_num_accepted_tokens"]
        == (spec_run("self-N4")[0]["counters"]["vllm:spec_decode_num_draft_tokens"])
    )  # the target as its own draft: every draft accepted


@pytest.fixture(scope="module")
def spec_servers(upstream_python, overlay_python, tiny_llama, tmp_path_factory):
    logs = tmp_path_factory.mktemp("servers-spec")
    args = ["--num-scheduler-steps", "4", "--speculative-config", json.dumps(NGRAM)]
    with server_pair(upstream_python, overlay_python, tiny_llama, logs, args) as pair:
        yield pair


@pytest.mark.parametrize("stream", [False, True])
def test_served_spec_windows_match_upstream(spec_servers, stream):
    params = {**GREEDY, "max_tokens": 40}
    theirs = completion(spec_servers["upstream"], stream, **params)
    assert_same(completion(spec_servers["overlay"], stream, **params), theirs)
    assert spec_servers["overlay"].metric("vllm:spec_decode_num_draft_tokens_total") > 0


def test_abort_during_spec_windows(spec_servers):
    assert_disconnect_frees_the_request(spec_servers["overlay"], spec_servers["upstream"], REPETITIVE[0])
