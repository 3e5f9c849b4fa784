"""Multi-step decode's options on Model Runner V2 (vLLM 0.34.0 on): what windows there run,
and what they refuse at startup, with the reason, before a model loads.

Windows on Model Runner V2 (vllm/v1/worker/gpu/multi_step/, patch 0011) take the option and
its alias; what they do not run yet is refused by name: sampling masks (a per-step output the
merge does not carry). Drafts meet upstream's own answer: this base's standalone CPU runner has no
drafters, with windows or without (windows with drafts, and the drafts they refuse, are
test_spec_mrv2.py's, on the interpreter base). N = 1 (the default) starts as upstream does. On
Model Runner V1 (0.32.0, 0.33.0) test_multi_step.py's test_option_and_refusals checks that
runner's options.
"""

from __future__ import annotations

import pytest
from support.engines import script_result
from support.venvs import windows_runner

pytestmark = pytest.mark.every_release

CHECKS = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs

def resolve(**kw):
    try:
        cfg = EngineArgs(model=sys.argv[1], max_model_len=512, **kw).create_engine_config()
        return {"steps": cfg.scheduler_config.num_scheduler_steps,
                "async": cfg.scheduler_config.async_scheduling}
    except Exception as e:  # the message is what a user sees
        return {"error": f"{type(e).__name__}: {e}"}
ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
print("RESULT" + json.dumps({
    "flag": resolve(num_scheduler_steps=8),
    "flag_sync": resolve(num_scheduler_steps=8, async_scheduling=False),
    "alias": resolve(additional_config={"multi_step": 4}),
    "disagree": resolve(num_scheduler_steps=2, additional_config={"multi_step": 4}),
    "plain": resolve(),
    "one": resolve(num_scheduler_steps=1),
    "ngram": resolve(num_scheduler_steps=4, speculative_config=ngram),
    "ngram_single": resolve(speculative_config=ngram),
    "sampling_mask": resolve(num_scheduler_steps=4, return_sampling_mask=True,
                             logprobs_mode="processed_logprobs"),
    "sampling_mask_single": resolve(return_sampling_mask=True, logprobs_mode="processed_logprobs"),
    "yield_off": resolve(num_scheduler_steps=4, additional_config={"multi_step_yield": False}),
    "yield_bad": resolve(num_scheduler_steps=4, additional_config={"multi_step_yield": "no"}),
    "grammar_off": resolve(num_scheduler_steps=4, additional_config={"multi_step_structured_output": False}),
    "grammar_bad": resolve(num_scheduler_steps=4, additional_config={"multi_step_structured_output": 1}),
    "join_always": resolve(num_scheduler_steps=4, additional_config={"multi_step_join": "always"}),
    "join_bad": resolve(num_scheduler_steps=4, additional_config={"multi_step_join": "sometimes"}),
    "join_one": resolve(num_scheduler_steps=4, additional_config={"multi_step_join": 1}),
}))
"""


def test_options_on_model_runner_v2(overlay_python, tiny_llama, tmp_path):
    if windows_runner() != "mrv2":
        pytest.skip("windows run on Model Runner V1 here (test_multi_step.py checks its options)")
    got = script_result(overlay_python, CHECKS, tiny_llama, tmp_path=tmp_path, timeout=300)
    # async scheduling on by default on CPU (patch 0003), windows under it
    assert got["flag"] == {"steps": 8, "async": True}, got
    assert got["flag_sync"] == {"steps": 8, "async": False}, got
    assert got["alias"]["steps"] == 4, got
    assert "disagree" in got["disagree"]["error"], got
    assert got["plain"]["steps"] == 1 and got["one"]["steps"] == 1, got
    # drafts, with windows or without: upstream's own answer (the standalone CPU runner has none)
    assert "speculative decoding" in got["ngram_single"]["error"], got
    assert got["ngram"] == got["ngram_single"], got
    assert "return_sampling_mask" in got["sampling_mask"]["error"], got
    assert got["sampling_mask_single"]["steps"] == 1, got
    # windows yield to arrivals unless told not to; a wrong value is named at startup
    assert got["yield_off"]["steps"] == 4, got
    assert "multi_step_yield'] must be true or false" in got["yield_bad"]["error"], got
    # structured output runs in windows unless told not to; a wrong value is named at startup
    assert got["grammar_off"]["steps"] == 4, got
    assert "multi_step_structured_output'] must be true or false" in got["grammar_bad"]["error"], got
    # admitted requests join windows by the default policy, "always" or not at all; a wrong value
    # (1 included, though it equals True) is named at startup
    assert got["join_always"]["steps"] == 4, got
    for bad in ("join_bad", "join_one"):
        assert "multi_step_join'] must be true, false or \"always\"" in got[bad]["error"], got
