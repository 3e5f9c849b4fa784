# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The frontend's check of what Model Runner V2 can hold per request
(vllm/v1/engine/device_state_limits.py): the same widths and conditions as the
runners' `add_request`, which kills the engine when they are exceeded."""

import ast
import importlib.util

import pytest

from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import device_state_limits as limits

RUNNER_MODULES = (
    "vllm.v1.worker.gpu.sample.logit_bias",
    "vllm.v1.worker.cpu.logits_processors",
)


def module_constants(name: str) -> dict[str, object]:
    """A module's top-level constants, read from its source (the GPU runner's
    module imports Triton, which a CPU test environment may lack)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    return {
        target.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


@pytest.mark.parametrize("module", RUNNER_MODULES)
def test_the_widths_are_the_runners(module: str):
    constants = module_constants(module)
    assert constants["MAX_NUM_ALLOWED_TOKEN_IDS"] == limits.MAX_ALLOWED_TOKEN_IDS
    assert constants["MAX_NUM_LOGIT_BIAS_TOKENS"] == limits.MAX_LOGIT_BIAS_TOKENS
    assert (
        constants["MAX_NUM_STOP_TOKEN_IDS"] == limits.MAX_STOP_TOKEN_IDS_WITH_MIN_TOKENS
    )


def params(**kwargs) -> SamplingParams:
    sampling_params = SamplingParams(max_tokens=16, **kwargs)
    # as the frontend does before the check: the EOS joins the stop ids
    sampling_params.update_from_generation_config({}, eos_token_id=2)
    return sampling_params


def refusal(sampling_params: SamplingParams) -> VLLMValidationError:
    with pytest.raises(VLLMValidationError) as info:
        limits.check_device_state_limits(sampling_params)
    return info.value


def test_at_the_widths_a_request_passes():
    limits.check_device_state_limits(params(allowed_token_ids=list(range(1024))))
    limits.check_device_state_limits(params(logit_bias=dict.fromkeys(range(1024), 1.0)))
    # 127 stop ids and the EOS
    stop_ids = list(range(3, 130))
    limits.check_device_state_limits(params(min_tokens=1, stop_token_ids=stop_ids))


def test_past_a_width_the_request_is_refused_naming_the_parameter():
    error = refusal(params(allowed_token_ids=list(range(1025))))
    assert error.parameter == "allowed_token_ids" and error.value == 1025
    assert "at most 1024" in str(error)
    error = refusal(params(logit_bias=dict.fromkeys(range(1025), 1.0)))
    assert error.parameter == "logit_bias" and error.value == 1025
    # 128 stop ids and the EOS: one past the table
    error = refusal(params(min_tokens=1, stop_token_ids=list(range(3, 131))))
    assert error.parameter == "stop_token_ids" and error.value == 129
    assert "min_tokens" in str(error)


def test_stop_ids_count_only_while_min_tokens_holds_them():
    # the runner keeps no stop-id table for a request without min_tokens
    limits.check_device_state_limits(params(stop_token_ids=list(range(3, 1000))))
