# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The rejection sampler's sampling constraints on CPU.

The CPU build's expand kernel wrote into an int64 copy of its output, so every
expansion but an int64 one came back uninitialized: a random request with top-k
under speculative decoding killed the engine (a top-k index out of bounds). And
a step whose requests all got zero drafts (the last step before max_tokens)
left the rejection sampler no rows, on which the top-k-only path failed.
"""

import pytest
import torch

from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

pytestmark = pytest.mark.cpu_test


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_batch_to_tokens_on_cpu(dtype):
    x = torch.tensor([5, 0, 7], dtype=dtype)
    cu_num_tokens = torch.tensor([2, 5, 6], dtype=torch.int32)

    expanded = expand_batch_to_tokens(x, cu_num_tokens, 6)

    assert expanded.dtype == dtype
    assert expanded.tolist() == [5, 5, 0, 0, 0, 7]


def test_expand_replaces_the_greedy_marker():
    temperature = torch.tensor([0.0, 0.5])  # 0: a greedy request (GREEDY_TEMPERATURE)
    cu_num_tokens = torch.tensor([1, 3], dtype=torch.int32)

    expanded = expand_batch_to_tokens(
        temperature, cu_num_tokens, 3, replace_from=0, replace_to=1
    )

    assert expanded.tolist() == [1.0, 0.5, 0.5]


@pytest.mark.parametrize("with_top_p", [False, True])
def test_top_k_on_no_rows(with_top_p):
    logits = torch.empty(0, 512)
    k = torch.empty(0, dtype=torch.int32)
    p = torch.empty(0) if with_top_p else None

    assert apply_top_k_top_p(logits, k, p).shape == (0, 512)
