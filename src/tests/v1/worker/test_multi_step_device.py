# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The device window's per-step state
(vllm/v1/worker/model_runner_v1_multi_step/device_window.py).

Engine-level parity with upstream is tested end to end (the overlay's
tests/real); these pin the pieces whose exactness the engine runs could only
show by luck: the penalties over the device history equal upstream's over
the token lists, min_tokens masks exactly while a row is short, stops and
step budgets end rows (and freeze them) as the scheduler would, and the
merged logprob rows keep each request's rows together in step order.
"""

import numpy as np
import pytest
import torch

from vllm.model_executor.layers.utils import apply_penalties
from vllm.v1.outputs import LogprobsLists
from vllm.v1.sample.ops.penalties import apply_all_penalties
from vllm.v1.worker.model_runner_v1_multi_step.device_window import (
    _Arrays,
    _HostResults,
    _merged_logprobs,
    _MinTokensMask,
    _WindowState,
)

pytestmark = pytest.mark.cpu_test

VOCAB = 32


def _arrays(on_host: bool) -> _Arrays:
    # Both kinds run on a CPU: the tensors path is what other devices take.
    return _Arrays(torch.device("cpu"), on_host=on_host)


def _state(arrays, last, budget, min_tokens, num_output, stop_ids):
    return _WindowState(
        arrays,
        last=torch.tensor(last, dtype=torch.int32),
        positions=arrays.zeros((len(last),), torch.int64),
        start_positions=[10] * len(last),
        budget=budget,
        min_tokens=min_tokens,
        num_output=num_output,
        stop_ids=stop_ids,
    )


KINDS = pytest.mark.parametrize("on_host", [True, False], ids=["numpy", "torch"])


@KINDS
def test_penalties_over_the_device_history_equal_upstreams(on_host):
    torch.manual_seed(0)
    # Row 0's step-1 token is still an async placeholder in the lists.
    lists = [[3, 5, -1], [7], [1, 1, 2, 9]]
    s = _state(_arrays(on_host), [4, 7, 9], [4, 4, 4], [0, 0, 0], [3, 1, 4], [[]] * 3)
    s.start_history(lists, vocab_size=VOCAB)
    sampled = [torch.tensor(t, dtype=torch.int32) for t in ([5, 5, 0], [6, 7, 0])]
    truth = [[3, 5, 4], [7], [1, 1, 2, 9]]
    prompt = torch.tensor([[1, 2, VOCAB], [3, VOCAB, VOCAB], [4, 4, 4]])
    presence = torch.tensor([0.5, 0.0, 0.2])
    frequency = torch.tensor([0.3, 0.1, 0.0])
    repetition = torch.tensor([1.2, 1.0, 1.5])
    for step, tokens in enumerate(sampled, start=1):
        s.advance(step, tokens)
        for row, token in enumerate(tokens.tolist()):
            truth[row].append(token)
        logits = torch.randn(3, VOCAB)
        ours = apply_penalties(logits.clone(), prompt, s.history, presence,
                               frequency, repetition)  # fmt: skip
        theirs = apply_all_penalties(logits.clone(), prompt, presence, frequency,
                                     repetition, truth)  # fmt: skip
        assert torch.equal(ours, theirs)


def test_min_tokens_masks_while_a_row_is_short():
    mask = _MinTokensMask(
        rows=torch.tensor([0, 0, 1]),
        tokens=torch.tensor([2, 3, 2]),
        missing=torch.tensor([2, 2, 1], dtype=torch.int32),
    )
    masked = []
    for _ in range(3):
        logits = mask.apply(torch.zeros(2, 4))
        masked.append(torch.isinf(logits).nonzero().tolist())
    assert masked == [[[0, 2], [0, 3], [1, 2]], [[0, 2], [0, 3]], []]


@KINDS
def test_rows_stop_at_stop_tokens_after_min_tokens_and_at_their_budget(on_host):
    # Row 0: stop token 9 at step 1 but min_tokens 3 (has 1 output): goes on.
    # Row 1: budget 2 (a cut window). Row 2: samples 9 at inner step 2.
    s = _state(_arrays(on_host), [9, 4, 4], [5, 2, 5], [3, 0, 0], [1, 1, 1], [[9]] * 3)
    assert s.alive.tolist() == [True, True, True]
    s.advance(1, torch.tensor([9, 5, 6], dtype=torch.int32))  # row 0: 2 outputs < 3
    assert s.alive.tolist() == [True, False, True]
    s.advance(2, torch.tensor([9, 5, 9], dtype=torch.int32))  # row 0 has 3: stops
    assert s.alive.tolist() == [False, False, False]
    assert s.stopped.tolist() == [True, False, True]
    # Rows freeze at the position of their last step (no KV slot after it).
    assert s.positions.tolist() == [11, 10, 11]
    inner = s.host_results(num_steps=3)
    assert inner.valid.tolist() == [[True, True, True], [True, False, True]]
    assert inner.tokens.tolist() == [[9, 5, 6], [9, 5, 9]]
    assert inner.num_tokens.tolist() == [3, 2, 3]


def test_merged_logprob_rows_are_request_major_in_step_order():
    def lists(tag):
        return LogprobsLists(
            np.array([[tag, tag + 1], [tag + 10, tag + 11]], dtype=np.int32),
            np.full((2, 2), -float(tag), dtype=np.float32),
            np.array([tag, tag + 10], dtype=np.int32),
        )

    inner = _HostResults(
        tokens=np.zeros((2, 2), np.int32),
        valid=np.array([[True, True], [False, True]]),  # row 0 stopped at step 2
        stopped=np.array([True, False]),
        num_tokens=np.array([2, 3]),
        budget=np.array([3, 3]),
        last_positions=np.array([0, 0]),
    )

    class _OnHost:
        def __init__(self, lists):
            self.lists = lists

        def to_cpu_nonblocking(self):
            return self

        def tolists(self):
            return self.lists

    inner_steps = [_OnHost(lists(200)), _OnHost(lists(300))]
    merged = _merged_logprobs(lists(100), inner, inner_steps, [0, 1])
    assert merged.sampled_token_ranks.tolist() == [100, 200, 110, 210, 310]
    assert merged.cu_num_generated_tokens == [0, 2, 5]
    assert merged.logprob_token_ids[:, 0].tolist() == [100, 200, 110, 210, 310]
