# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Refuse at the frontend a request whose sampling state Model Runner V2
cannot hold.

Model Runner V2 keeps each request's allowed token ids, logit bias and, while
min_tokens holds them back, stop token ids in fixed-width per-request tables
(vllm/v1/worker/gpu/sample/logit_bias.py; the standalone CPU runner's
vllm/v1/worker/cpu/logits_processors.py has the same widths). A request wider
than a table raises in the worker when the request is added, after the
frontend accepted it, and the engine dies with every request it holds (vLLM
0.34.0, on a GPU as on a CPU). Checked here against the same widths, such a
request is refused alone, before it reaches the engine, with the reason
(`VLLMValidationError`: HTTP 400 through the server).
"""

from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams

# The widths of Model Runner V2's tables (MAX_NUM_ALLOWED_TOKEN_IDS,
# MAX_NUM_LOGIT_BIAS_TOKENS, MAX_NUM_STOP_TOKEN_IDS in both runners' modules;
# tests/v1/engine/test_device_state_limits.py checks they still agree).
MAX_ALLOWED_TOKEN_IDS = 1024
MAX_LOGIT_BIAS_TOKENS = 1024
MAX_STOP_TOKEN_IDS_WITH_MIN_TOKENS = 128


def check_device_state_limits(params: SamplingParams) -> None:
    """Raise `VLLMValidationError` for a request Model Runner V2 would fail to
    add: the same conditions as its `add_request`, on the params as they reach
    the engine (stop ids include the EOS ids the generation config adds)."""
    _check_width(
        "allowed_token_ids",
        len(params.allowed_token_ids or ()),
        MAX_ALLOWED_TOKEN_IDS,
        "allowed token ids",
    )
    _check_width(
        "logit_bias",
        len(params.logit_bias or ()),
        MAX_LOGIT_BIAS_TOKENS,
        "logit bias entries",
    )
    if params.min_tokens > 0:
        _check_width(
            "stop_token_ids",
            len(params.all_stop_token_ids),
            MAX_STOP_TOKEN_IDS_WITH_MIN_TOKENS,
            "stop token ids (EOS included) with min_tokens > 0",
        )


def _check_width(parameter: str, count: int, limit: int, what: str) -> None:
    if count > limit:
        raise VLLMValidationError(
            f"{count} {what}: the model runner holds at most {limit} per request.",
            parameter=parameter,
            value=count,
        )
