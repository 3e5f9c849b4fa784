"""Speculative decoding inside multi-step windows on Model Runner V2 (vllm/v1/worker/gpu/multi_step/).

From vLLM 0.34.0 windows run on Model Runner V2, whose drafters run only in its GPU runner's code
(the standalone CPU runner has none): this file runs on the interpreter base (tests/support/
cpu_bases.py), Model Runner V2's own Python with its Triton kernels interpreted. Each inner step of a
window verifies the drafts the runner's speculator proposed after the step before and starts where
that step's accepted tokens end.

Oracle: unpatched upstream on the same base with the same drafter and no windows (its CPU default,
async scheduling off). Windows must give the same tokens (seeded random sampling with a penalty
included: Model Runner V2 keys its draws, rejection sampling's too, by seed and position),
logprobs, finish and stop reasons, and
the same number of drafts proposed and accepted: a window that handed its drafter a wrong start, a
stale token or the wrong hidden-state rows would change those counts even where greedy tokens stay
right. The overlay runs its CPU default, async scheduling on, with N = 4; each run must show drafts
accepted (not vacuous), far fewer engine steps than upstream (windows ran) and an empty KV cache.

Upstream agrees with itself here: two runs of upstream with the noisy draft model (greedy) and with
the EAGLE head (seeded and unseeded random, penalties) on this base gave the same tokens, logprobs
and counts (docs/testing.md). Slow (about a minute an engine run): the suite
runs the EAGLE head (drafts from the target's hidden states; about one in five accepted) and the
noisy draft model; `OVERLAY_SPEC_MRV2=all` adds MTP and ngram (ngram accepts nothing on this
model's text: it checks only that drafting never changes a token).
"""

from __future__ import annotations

import os

import pytest
from support.engines import generate, script_result
from support.parity import BASE, SPEC_CASES, assert_same_outputs
from support.venvs import draft_models, windows_runner

from overlay.fuzz.configs import speculative_config

pytestmark = pytest.mark.every_release

STEPS = 4
LLM = {**BASE, "max_num_seqs": 8, "max_num_batched_tokens": 1024}
# Four prompts (two repetitive ones first), at most 12 tokens each: the interpreter takes
# 100-300 ms a step, and these runs are in the suite's 45 minutes.
CASES = [
    {"prompts": case["prompts"][:4], "params": {**case["params"], "max_tokens": min(case["params"]["max_tokens"], 12)}}
    for case in SPEC_CASES
] + [
    # Random draws keyed by (seed, position), rejection sampling's included: a window that
    # verified other drafts, or at other positions, than single steps would change them.
    {"prompts": SPEC_CASES[0]["prompts"][:4],
     "params": {"temperature": 0.7, "top_p": 0.9, "seed": 3, "presence_penalty": 0.5, "logprobs": 2, "max_tokens": 12}},
]  # fmt: skip
SUITE_DRAFTERS = ("eagle", "noisy")
DRAFTERS = (*SUITE_DRAFTERS, "mtp", "ngram")
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
ITERATIONS = "vllm:iteration_tokens_total_count"


@pytest.fixture(scope="module")
def built(upstream_python, tiny_llama) -> dict:
    """The drafters' models, built once for this file (where windows run on Model Runner V2)."""
    if windows_runner() != "mrv2":
        pytest.skip("windows run on Model Runner V1 here (tests/real/test_multi_step_spec.py)")
    return draft_models(upstream_python, tiny_llama)


@pytest.fixture(scope="module")
def spec_runs(interpreter_pythons, built, tiny_llama, tmp_path_factory):
    """drafter -> {"upstream": outputs, "overlay": outputs}, each engine run once, when first asked."""
    tmp = tmp_path_factory.mktemp("spec-mrv2")
    done: dict[str, dict] = {}

    def _run(drafter: str) -> dict:
        if drafter not in done:
            if drafter == "noisy":
                config = {"method": "draft_model", "model": str(built["noisy"]), "num_speculative_tokens": 3}
            else:
                config = speculative_config(drafter, str(tiny_llama), built)
            target = built["mimo"] if drafter == "mtp" else tiny_llama
            llm = {**LLM, "model": str(target), "speculative_config": config}
            done[drafter] = {
                "upstream": generate(interpreter_pythons["upstream"], {"llm": llm, "cases": CASES}, tmp,
                                     f"up-{drafter}", timeout=1200)[0],
                "overlay": generate(interpreter_pythons["overlay"],
                                    {"llm": {**llm, "num_scheduler_steps": STEPS}, "cases": CASES}, tmp,
                                    f"ov-{drafter}", timeout=1200)[0],
            }  # fmt: skip
        return done[drafter]

    return _run


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_spec_windows_match_upstream_with_the_same_drafter(spec_runs, drafter):
    if drafter not in SUITE_DRAFTERS and os.environ.get("OVERLAY_SPEC_MRV2") != "all":
        pytest.skip(f"{drafter}: run with OVERLAY_SPEC_MRV2=all (the suite runs {', '.join(SUITE_DRAFTERS)})")
    runs = spec_runs(drafter)
    ours, theirs = runs["overlay"], runs["upstream"]
    assert theirs["async_scheduling"] is False and ours["async_scheduling"] is True
    assert_same_outputs(ours, theirs, cases=CASES)
    counted = {name: (ours["counters"][name], theirs["counters"][name]) for name in COUNTERS}
    assert all(a == b for a, b in counted.values()), counted
    assert ours["counters"]["vllm:kv_cache_usage_perc"] == 0, "a window leaked KV blocks"
    assert ours["counters"]["vllm:spec_decode_num_draft_tokens"] > 0
    if drafter != "ngram":
        assert ours["counters"]["vllm:spec_decode_num_accepted_tokens"] > 0
    # Windows ran: N steps per schedule.
    steps = ours["counters"][ITERATIONS], theirs["counters"][ITERATIONS]
    assert steps[0] < 0.6 * steps[1], steps


REFUSALS = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs

def resolve(**kw):
    try:
        cfg = EngineArgs(model=sys.argv[1], max_model_len=512, **kw).create_engine_config()
        return {"steps": cfg.scheduler_config.num_scheduler_steps}
    except Exception as e:  # the message is what a user sees
        return {"error": f"{type(e).__name__}: {e}"}
eagle = {"method": "eagle", "num_speculative_tokens": 3, "model": sys.argv[2]}
per_batch = {**eagle, "num_speculative_tokens_per_batch_size": [[1, 8, 2], [9, 256, 1]]}
print("RESULT" + json.dumps({
    "eagle": resolve(num_scheduler_steps=4, speculative_config=eagle),
    "per_batch": resolve(num_scheduler_steps=4, speculative_config=per_batch),
    "per_batch_single": resolve(speculative_config=per_batch),
    "adaptive": resolve(num_scheduler_steps=4, speculative_config={**eagle, "enable_adaptive_verification": True}),
    "suffix": resolve(num_scheduler_steps=4, speculative_config={"method": "suffix", "num_speculative_tokens": 3}),
}))
"""


def test_windows_refuse_the_drafts_they_cannot_keep_as_single_steps(interpreter_pythons, built, tiny_llama, tmp_path):
    """Speculative settings that change a step's drafts from what was scheduled (and drafters not
    run in windows) are refused at startup, by name, before a model loads; N = 1 keeps upstream's
    answer."""
    got = script_result(interpreter_pythons["overlay"], REFUSALS, tiny_llama, built["eagle"], tmp_path=tmp_path,
                        timeout=300)  # fmt: skip
    assert got["eagle"] == {"steps": 4}, got
    refused = "--num-scheduler-steps 4 cannot be combined with"
    assert f"{refused} speculative_config num_speculative_tokens_per_batch_size" in got["per_batch"]["error"], got
    assert got["per_batch_single"] == {"steps": 1}, got
    assert f"{refused} speculative_config enable_adaptive_verification=True" in got["adaptive"]["error"], got
    assert f"{refused} suffix speculative decoding" in got["suffix"]["error"], got
