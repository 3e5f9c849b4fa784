# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Sample logprobs scored only for the rows that ask (cpu/requested_logprobs.py):
which rows ask, with the sampler's own request states, and that those rows get
exactly what scoring the whole batch gives them. The engine-level comparison
with upstream is the parity tests' and the fuzzer's."""

from types import SimpleNamespace

import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.worker.cpu.logprob import LogprobTokenIdsState, compute_topk_scores
from vllm.v1.worker.cpu.requested_logprobs import (
    compute_topk_scores_of_rows,
    rows_that_want_logprobs,
)
from vllm.v1.worker.cpu.sampler import CPUSamplingStates

VOCAB = 64
DEVICE = torch.device("cpu")

# What each request asks for: nothing, top-5, the whole vocabulary (-1), only
# the sampled token (0), scores of chosen token ids, nothing.
PARAMS = [
    SamplingParams(),
    SamplingParams(logprobs=5),
    SamplingParams(logprobs=-1),
    SamplingParams(logprobs=0),
    SamplingParams(logprob_token_ids=[3, 9, 27]),
    SamplingParams(),
]
ASKING = [1, 2, 3, 4]


def sampler(params: list[SamplingParams]) -> SimpleNamespace:
    """The two request states of CPUSampler that say who wants logprobs."""
    states = SimpleNamespace(
        sampling_states=CPUSamplingStates(len(params), VOCAB, DEVICE),
        logprob_token_ids_state=LogprobTokenIdsState(len(params), DEVICE),
    )
    for req_idx, p in enumerate(params):
        states.sampling_states.add_request(req_idx, p)
        states.logprob_token_ids_state.add_request(req_idx, p)
    return states


def test_the_rows_that_ask_are_found_from_the_samplers_request_states():
    states = sampler(PARAMS)
    rows = rows_that_want_logprobs(states, torch.arange(len(PARAMS)))
    assert rows.tolist() == ASKING
    # Rows follow the expanded mapping (speculative steps: several per request).
    rows = rows_that_want_logprobs(states, torch.tensor([5, 1, 1, 0, 4]))
    assert rows.tolist() == [1, 2, 4]


def test_a_batch_where_every_row_asks_is_scored_whole():
    states = sampler(PARAMS[1:5])
    assert rows_that_want_logprobs(states, torch.arange(4)) is None


@pytest.mark.parametrize("logits_mode", [False, True])
@pytest.mark.parametrize("num_logprobs", [0, 5, VOCAB])
@pytest.mark.parametrize("expanded", [False, True])
def test_the_asking_rows_get_what_scoring_the_whole_batch_gives_them(
    logits_mode: bool, num_logprobs: int, expanded: bool
):
    states = sampler(PARAMS)
    generator = torch.Generator().manual_seed(7)
    mapping = torch.tensor([0, 1, 1, 2, 3, 4, 4, 5]) if expanded else torch.arange(6)
    num_rows = mapping.shape[0]
    logits = torch.randn(num_rows, VOCAB, generator=generator)
    sampled = torch.randint(0, VOCAB, (num_rows,), generator=generator)
    cu_num_logits = [0, 1, 3, 4, 5, 7, 8] if expanded else None
    kwargs = dict(
        num_per_req_token_ids=states.logprob_token_ids_state.num_token_ids,
        per_req_token_ids=states.logprob_token_ids_state.token_ids,
        expanded_idx_mapping=mapping,
        max_per_req_token_ids=3,
        logits_mode=logits_mode,
    )
    whole = compute_topk_scores(logits, num_logprobs, sampled, cu_num_logits, **kwargs)

    rows = rows_that_want_logprobs(states, mapping)
    part = compute_topk_scores_of_rows(
        rows, logits, num_logprobs, sampled, cu_num_logits, **kwargs
    )

    assert part.logprob_token_ids.shape == whole.logprob_token_ids.shape
    assert part.logprobs.shape == whole.logprobs.shape
    assert part.selected_token_ranks.shape == whole.selected_token_ranks.shape
    assert part.cu_num_generated_tokens == whole.cu_num_generated_tokens
    index = torch.from_numpy(rows)
    assert torch.equal(part.logprob_token_ids[index], whole.logprob_token_ids[index])
    assert torch.equal(part.logprobs[index], whole.logprobs[index])
    assert torch.equal(
        part.selected_token_ranks[index], whole.selected_token_ranks[index]
    )
    others = torch.ones(num_rows, dtype=torch.bool)
    others[index] = False
    assert torch.all(part.logprob_token_ids[others] == 0)
    assert torch.all(part.logprobs[others] == float("-inf"))
    assert torch.all(part.selected_token_ranks[others] == 0)
