"""A request Model Runner V2 cannot hold is refused alone, and the engine keeps serving (patch 0012).

Upstream 0.34.0's runners keep min_tokens' stop ids in a table 128 wide per request (allowed ids and
logit bias: 1024, beyond the tiny model's vocabulary, so src/tests/v1/engine's unit test covers
them); a request past it passes the frontend and raises in the worker, which kills the engine with
every request in it (docs/fuzzing.md). The overlay refuses it at the frontend with the reason.
"""

from __future__ import annotations

import pytest
from support.engines import script_result
from support.venvs import windows_runner

pytestmark = pytest.mark.every_release

SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], max_model_len=512, max_num_seqs=8, seed=0)
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    before = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    # 129 ids and the EOS: two past the table
    wide = SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=list(range(3, 132)))
    try:
        llm.generate([prompt], wide, use_tqdm=False)
        refused = None
    except Exception as e:  # what the caller sees
        refused = {"type": type(e).__name__, "message": str(e)}
    # at the width (127 ids and the EOS) the request runs
    narrow = SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=list(range(3, 130)))
    ran = llm.generate([prompt], narrow, use_tqdm=False)[0].outputs[0].token_ids
    after = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    print("RESULT" + json.dumps({"refused": refused, "before": list(before), "after": list(after),
                                 "narrow": list(ran)}))
"""


def test_a_request_past_a_runner_table_is_refused_alone(overlay_python, tiny_llama, tmp_path):
    if windows_runner() != "mrv2":
        pytest.skip("Model Runner V1 (this release's CPU runner) keeps no fixed-width tables")
    got = script_result(overlay_python, SCRIPT, tiny_llama, tmp_path=tmp_path, timeout=400)
    refused = got["refused"]
    assert refused is not None and refused["type"] == "VLLMValidationError", got
    assert "130 stop token ids" in refused["message"] and "at most 128" in refused["message"], got
    assert "parameter=stop_token_ids" in refused["message"], got
    # the engine lived on: the same greedy tokens before and after, and the request at the width ran
    assert len(got["before"]) == 8 and got["after"] == got["before"], got
    assert 2 <= len(got["narrow"]) <= 8, got
