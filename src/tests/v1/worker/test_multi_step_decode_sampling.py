# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A window's decode steps sampled on the kept batch
(gpu/multi_step/decode_sampling.py): grammar masks that set what the runner's
CPUStructuredOutputsWorker sets, and logprobs scored once a window that are
each step's own, against what the sampler's `__call__` scores per step. The
engine-level comparison with upstream is the parity tests' and the fuzzer's."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.v1.worker.test_multi_step_kept_batch import decode_batch
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.cpu.logprob import LogprobTokenIdsState
from vllm.v1.worker.cpu.requested_logprobs import (
    compute_topk_scores_of_rows,
    rows_that_want_logprobs,
)
from vllm.v1.worker.cpu.sampler import CPUSampler, CPUSamplingStates
from vllm.v1.worker.cpu.structured_outputs import CPUStructuredOutputsWorker
from vllm.v1.worker.gpu.multi_step import decode_sampling
from vllm.v1.worker.gpu.multi_step.decode_sampling import DecodeSampling

VOCAB = 300  # not a multiple of 32: the bitmask's last word is partly padding
DEVICE = torch.device("cpu")

# top-5, nothing, the whole vocabulary (-1), only the sampled token (0),
# chosen token ids, top-2.
PARAMS = [
    SamplingParams(logprobs=5),
    SamplingParams(),
    SamplingParams(logprobs=-1),
    SamplingParams(logprobs=0),
    SamplingParams(logprob_token_ids=[3, 9, 270]),
    SamplingParams(logprobs=2),
]


class Sampler(CPUSampler):
    """CPUSampler's request states and dimensions; `sample` draws the
    largest of its processed logits (the logits halved, a new tensor)."""

    def __init__(self, logprobs_mode: str) -> None:
        self.compute_nans = False
        self.trace_replay_state = None
        self.return_sampling_mask = False
        self.logprobs_mode = logprobs_mode
        self.sampling_states = CPUSamplingStates(len(PARAMS), VOCAB, DEVICE)
        self.logprob_token_ids_state = LogprobTokenIdsState(len(PARAMS), DEVICE)
        for req_idx, params in enumerate(PARAMS):
            self.sampling_states.add_request(req_idx, params)
            self.logprob_token_ids_state.add_request(req_idx, params)

    def sample(self, logits, return_logprobs=False, **kwargs):
        processed = logits / 2
        return processed.argmax(dim=-1), processed


def runner(logprobs_mode: str = "raw_logprobs") -> SimpleNamespace:
    return SimpleNamespace(
        sampler=Sampler(logprobs_mode),
        model=SimpleNamespace(compute_logits=lambda hidden: hidden.clone()),
        structured_outputs_worker=CPUStructuredOutputsWorker(
            len(PARAMS), VOCAB, DEVICE, mask_stride=1
        ),
    )


def batch_of(slots: list[int]) -> SimpleNamespace:
    """A decode step of the requests in `slots` of the sampler's states."""
    batch = decode_batch([f"r{slot}" for slot in slots])
    batch.idx_mapping = batch.expanded_idx_mapping = torch.tensor(slots)
    batch.idx_mapping_np = np.array(slots)
    batch.cu_num_logits = torch.arange(len(slots) + 1, dtype=torch.int32)
    return batch


def scored_per_step(sampler: Sampler, logits: torch.Tensor, batch) -> tuple:
    """What the sampler's `__call__` scores for the step (patch 0018's
    hunk), as the step's output lists take it."""
    sampled, processed = sampler.sample(logits)
    if sampler.logprobs_mode in ("processed_logprobs", "processed_logits"):
        logits = processed
    num_logprobs, max_token_ids = sampler.get_logprobs_dims(batch.idx_mapping_np)
    state = sampler.logprob_token_ids_state
    return compute_topk_scores_of_rows(
        rows_that_want_logprobs(sampler, batch.expanded_idx_mapping),
        logits,
        num_logprobs,
        sampled,
        None,
        num_per_req_token_ids=state.num_token_ids,
        per_req_token_ids=state.token_ids,
        expanded_idx_mapping=batch.expanded_idx_mapping,
        max_per_req_token_ids=max_token_ids,
        logits_mode=sampler.logprobs_mode in ("raw_logits", "processed_logits"),
    ).tolists()


@pytest.mark.parametrize(
    "logprobs_mode",
    ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"],
)
def test_a_windows_logprobs_scored_at_its_end_are_each_steps_own(logprobs_mode):
    standalone = runner(logprobs_mode)
    sampling = DecodeSampling(standalone)
    generator = torch.Generator().manual_seed(11)
    whole, rest = batch_of([0, 1, 2, 3, 4, 5]), batch_of([1, 3, 4, 5])
    # Two steps of every request, then one without the widest askers (other
    # dimensions: scored apart), then every request again.
    batches = [whole, whole, rest, whole]
    outputs, expected = [], []
    for batch in batches:
        hidden = torch.randn(batch.num_reqs, VOCAB, generator=generator)
        expected.append(scored_per_step(standalone.sampler, hidden.clone(), batch))
        sampled, _, _ = sampling.sample(hidden, batch, None)
        assert sampled.logprobs_tensors is None
        outputs.append(ModelRunnerOutput(req_ids=batch.req_ids))
        sampling.claim(outputs[-1])
    assert all(output.logprobs is None for output in outputs)  # not yet scored

    sampling.score()

    assert sampling.num_direct_steps == sampling.num_sampled_steps == 4
    for output, want in zip(outputs, expected, strict=True):
        got = output.logprobs
        assert got.cu_num_generated_tokens is None
        for got_array, want_array in zip(got[:3], want[:3], strict=True):
            assert got_array.dtype == want_array.dtype
            np.testing.assert_array_equal(got_array, want_array)


def test_a_window_that_keeps_too_many_logits_has_them_scored_at_once(monkeypatch):
    monkeypatch.setattr(decode_sampling, "MAX_DEFERRED_ELEMENTS", 5 * VOCAB)
    sampling = DecodeSampling(runner())
    batch = batch_of([0, 1, 2, 3, 4, 5])  # 5 rows ask
    outputs = []
    for _ in range(2):
        sampling.sample(torch.randn(6, VOCAB), batch, None)
        outputs.append(ModelRunnerOutput(req_ids=batch.req_ids))
        sampling.claim(outputs[-1])
    assert outputs[0].logprobs is not None and outputs[1].logprobs is not None


def test_a_step_without_logprobs_keeps_nothing_for_the_windows_end():
    standalone = runner()
    standalone.sampler.sampling_states.num_logprobs[:] = -1
    standalone.sampler.logprob_token_ids_state.num_token_ids_np[:] = 0
    sampling = DecodeSampling(standalone)
    batch = batch_of([0, 1])
    sampled, num_sampled, num_rejected = sampling.sample(
        torch.eye(VOCAB)[[4, 7]], batch, None
    )
    output = ModelRunnerOutput(req_ids=batch.req_ids)
    sampling.claim(output)
    sampling.score()
    assert output.logprobs is None
    assert sampled.sampled_token_ids.tolist() == [[4], [7]]
    assert num_sampled.tolist() == [1, 1] and num_rejected.tolist() == [0, 0]


@pytest.mark.parametrize("with_xgrammar", [True, False])
def test_a_grammar_mask_sets_the_logits_the_runners_worker_sets(
    monkeypatch, with_xgrammar
):
    if not with_xgrammar:
        monkeypatch.setattr(decode_sampling, "xgrammar", None)
    standalone = runner()
    batch = batch_of([0, 1, 2, 3, 4, 5])
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, VOCAB, generator=generator)
    words = (VOCAB + 31) // 32
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (3, words), dtype=torch.int32, generator=generator
    ).numpy()
    grammar = GrammarOutput(["r4", "r0", "r2"], bitmask)  # not in batch order
    want = logits.clone()
    standalone.structured_outputs_worker.apply_grammar_bitmask(
        want, batch, grammar.structured_output_request_ids, bitmask
    )
    got = logits.clone()
    DecodeSampling(standalone)._mask(got, batch, grammar)
    assert torch.equal(got, want)
    assert torch.isinf(got[[0, 2, 4]]).any() and not torch.isinf(got[[1, 3, 5]]).any()


def test_a_step_of_another_kind_goes_to_the_runners_sample():
    standalone = runner()
    calls = []
    standalone.sample = lambda *args: calls.append(args) or "runner's"
    sampling = DecodeSampling(standalone)
    prefill = batch_of([0, 1])
    prefill.has_prefill = True
    assert sampling.sample(torch.zeros(2, VOCAB), prefill, None) == "runner's"
    standalone.sampler.compute_nans = True  # a sampler that counts NaNs
    sampling = DecodeSampling(standalone)
    assert sampling.sample(torch.zeros(2, VOCAB), batch_of([0, 1]), None) == "runner's"
    assert len(calls) == 2 and sampling.num_direct_steps == 0
