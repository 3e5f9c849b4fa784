# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Sampling a window's decode steps on StandaloneCPUModelRunner's kept batch.

A decode step (one logit per request: no prompt chunk, no drafts) is sampled
by the sampler's own `sample`: logits processors, temperature, min_p,
top-k/top-p, Gumbel draws keyed by seed and position. What the runner's
`sample` and the sampler's `__call__` do around it is done here to the same
values, with less work per step:

- Its other results are fixed for such a step: one token per request, none
  rejected. `__call__` spent 29 of its 73 us finding that out in an inner
  step, in-process.
- Grammar masks set the logits of the tokens a request's grammar forbids to
  -inf. The runner's CPUStructuredOutputsWorker does it with about fifteen
  torch operations a step; xgrammar's CPU kernel (a dependency of vLLM) sets
  the same logits to the same -inf. On 2 cores of an AMD EPYC, 16 masked rows
  of 128 at a 512-token vocabulary: 161 us against 31 us.
- Sample logprobs are scored by the sampler's `compute_topk_scores`, for the
  rows that ask (patch 0018), once for the window rather than once a step.
  Each step keeps what scoring reads (the asking rows' logits, copied right
  after sampling, where `__call__` scores them, and their sampled tokens).
  When the window ends, the steps are scored together and each step's output
  gets its rows. Each row's scores depend on that row alone; one call a window
  saves the per-call cost (90 us for 16 rows, 223 us for 128, same host).

A step of another kind, or on a sampler whose `__call__` does more per step
(NaN counts, trace replay, sampling masks, a subclass's own), goes to the
runner's `sample`.
"""

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.config.model import PROCESSED_LOGPROBS_MODES
from vllm.v1.outputs import LogprobsLists, LogprobsTensors, ModelRunnerOutput
from vllm.v1.worker.cpu.logprob import compute_topk_scores
from vllm.v1.worker.cpu.requested_logprobs import (
    rows_that_want_logprobs,
    spread_scores,
)
from vllm.v1.worker.cpu.sampler import CPUSampler, SamplerOutput

try:
    import xgrammar
except ImportError:  # not a dependency of vLLM on every platform
    xgrammar = None

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import GrammarOutput
    from vllm.v1.worker.cpu.input_batch import InputBatch
    from vllm.v1.worker.cpu.standalone_model_runner import StandaloneCPUModelRunner

# Logits elements kept for a window's logprobs before they are scored anyway:
# 64 MiB of float32 (16 asking rows over 8 steps at a 128k vocabulary).
MAX_DEFERRED_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class _StepFacts:
    """What is the same for every step on a batch: its requests and their
    parameters are fixed."""

    # (num_logprobs, max_per_req_token_ids) as `__call__` computes them, or
    # None where no request wants logprobs.
    dims: tuple[int, int] | None
    # The rows whose request wants logprobs (None: every row), and as an index.
    rows: np.ndarray | None
    index: torch.Tensor | None


@dataclass(frozen=True)
class _Deferred:
    """One step's logprobs, until the window's are scored."""

    dims: tuple[int, int]
    num_rows: int
    rows: np.ndarray | None
    logits: torch.Tensor  # the asking rows, as scoring reads them
    sampled: torch.Tensor
    # the asking rows' logprob token ids, where requests name them
    num_token_ids: torch.Tensor | None
    token_ids: torch.Tensor | None


def decodes(cpu_batch: "InputBatch") -> bool:
    """Whether `cpu_batch` is a decode step of running requests: no prompt
    tokens, one token (so one logit) per request."""
    return not cpu_batch.has_prefill and cpu_batch.num_tokens == cpu_batch.num_reqs


class DecodeSampling:
    """Samples the decode steps of the kept batch's windows."""

    def __init__(self, standalone: "StandaloneCPUModelRunner") -> None:
        self.standalone = standalone
        sampler = standalone.sampler
        # Whether the sampler does nothing per step beyond sampling but what
        # is done here (fixed by the model's config).
        self.direct = (
            sampler is not None
            and type(sampler).__call__ is CPUSampler.__call__
            and not sampler.compute_nans
            and sampler.trace_replay_state is None
            and not sampler.return_sampling_mask
        )
        self._facts: tuple[InputBatch, _StepFacts] | None = None
        # The step just sampled, until its output claims it; then the steps
        # of the window so far.
        self._unclaimed: _Deferred | None = None
        self._pending: list[tuple[ModelRunnerOutput, _Deferred]] = []
        self._num_pending_elements = 0
        # Steps sampled, and how many here (the window's log gives the share).
        self.num_sampled_steps = 0
        self.num_direct_steps = 0

    def sample(
        self,
        hidden_states: torch.Tensor,
        cpu_batch: "InputBatch",
        grammar_output: "GrammarOutput | None",
    ) -> tuple[SamplerOutput, torch.Tensor, torch.Tensor]:
        """The runner's `sample` of a step (see the module's docstring)."""
        standalone = self.standalone
        self.num_sampled_steps += 1
        if not self.direct or not decodes(cpu_batch):
            return standalone.sample(hidden_states, cpu_batch, grammar_output)
        self.num_direct_steps += 1
        sampler = standalone.sampler
        assert sampler is not None
        logits_indices = cpu_batch.logits_indices
        logits = standalone.model.compute_logits(hidden_states[logits_indices])
        if grammar_output is not None and logits.shape[0] > 0:
            self._mask(logits, cpu_batch, grammar_output)
        facts = self._step_facts(cpu_batch)
        sampled, processed_logits = sampler.sample(
            logits=logits,
            expanded_idx_mapping=cpu_batch.expanded_idx_mapping,
            idx_mapping=cpu_batch.idx_mapping,
            idx_mapping_np=cpu_batch.idx_mapping_np,
            pos=cpu_batch.positions[logits_indices],
            input_ids=cpu_batch.input_ids[logits_indices],
            expanded_local_pos=cpu_batch.expanded_local_pos,
            seq_lens_upper_bound_np=cpu_batch.seq_lens_cpu_upper_bound.numpy(),
            return_logprobs=facts.dims is not None,
        )
        if facts.dims is not None:
            processed = sampler.logprobs_mode in PROCESSED_LOGPROBS_MODES
            scored = processed_logits if processed else logits
            self._defer(facts, scored, sampled, cpu_batch)
        num_sampled = cpu_batch.seq_lens.new_ones(cpu_batch.num_reqs)
        num_rejected = cpu_batch.seq_lens.new_zeros(cpu_batch.num_reqs)
        output = SamplerOutput(
            sampled_token_ids=sampled.view(-1, 1),
            logprobs_tensors=None,  # the window's end fills the step's output
            num_nans=None,
            num_sampled=num_sampled,
            num_rejected=num_rejected,
            sampling_mask_tensors=None,
        )
        return output, num_sampled, num_rejected

    def claim(self, output: ModelRunnerOutput) -> None:
        """Give the step just sampled its output, whose logprobs `score`
        fills (scored at once where the window keeps too many logits)."""
        deferred, self._unclaimed = self._unclaimed, None
        if deferred is None:
            return
        self._pending.append((output, deferred))
        self._num_pending_elements += deferred.logits.numel()
        if self._num_pending_elements > MAX_DEFERRED_ELEMENTS:
            self.score()

    def score(self) -> None:
        """Score the logprobs of the steps claimed since the last call, and
        fill their outputs: once per window, when it ends."""
        assert self._unclaimed is None, "a step sampled without its output"
        pending, self._pending = self._pending, []
        self._num_pending_elements = 0
        groups: dict[tuple[int, int], list[tuple[ModelRunnerOutput, _Deferred]]]
        groups = defaultdict(list)
        for output, deferred in pending:
            groups[deferred.dims].append((output, deferred))
        for (num_logprobs, max_token_ids), group in groups.items():
            steps = [deferred for _, deferred in group]
            scored = self._score_rows(steps, num_logprobs, max_token_ids)
            start = 0
            for output, deferred in group:
                stop = start + deferred.logits.shape[0]
                output.logprobs = _step_rows(scored, start, stop, deferred)
                start = stop

    def _mask(
        self,
        logits: torch.Tensor,
        cpu_batch: "InputBatch",
        grammar_output: "GrammarOutput",
    ) -> None:
        """Mask the logits of `grammar_output`'s requests as the runner's
        CPUStructuredOutputsWorker does (the same -inf at the same tokens)."""
        masks_worker = self.standalone.structured_outputs_worker
        assert masks_worker is not None
        req_ids = grammar_output.structured_output_request_ids
        if xgrammar is None or masks_worker.mask_stride != 1 or not req_ids:
            masks_worker.apply_grammar_bitmask(
                logits, cpu_batch, req_ids, grammar_output.grammar_bitmask
            )
            return
        # One logit per request, one bitmask row per request.
        row_of = {req_id: i for i, req_id in enumerate(cpu_batch.req_ids)}
        rows = torch.tensor([row_of[req_id] for req_id in req_ids])
        masked = logits.index_select(0, rows)
        xgrammar.apply_token_bitmask_inplace(
            masked,
            torch.from_numpy(grammar_output.grammar_bitmask),
            vocab_size=logits.shape[1],
        )
        logits.index_copy_(0, rows, masked)

    def _step_facts(self, cpu_batch: "InputBatch") -> _StepFacts:
        known = self._facts
        if known is None or known[0] is not cpu_batch:
            sampler = self.standalone.sampler
            assert sampler is not None
            dims = sampler.get_logprobs_dims(cpu_batch.idx_mapping_np)
            rows = None
            if dims is not None:
                rows = rows_that_want_logprobs(sampler, cpu_batch.expanded_idx_mapping)
            index = torch.from_numpy(rows) if rows is not None else None
            known = self._facts = (cpu_batch, _StepFacts(dims, rows, index))
        return known[1]

    def _defer(
        self,
        facts: _StepFacts,
        logits: torch.Tensor,
        sampled: torch.Tensor,
        cpu_batch: "InputBatch",
    ) -> None:
        """Keep what scoring the step's logprobs reads: the asking rows of
        its logits (indexing copies them; every row is copied where every row
        asks, so that nothing later can change them) and of its tokens."""
        assert facts.dims is not None
        index = facts.index
        if index is not None:
            logits, sampled = logits[index], sampled[index]
        else:
            logits = logits.clone()
        num_token_ids = token_ids = None
        if facts.dims[1] > 0:
            # Requests that name their logprob token ids: their rows of the
            # sampler's state, which the scorer otherwise reads by request.
            state = self.standalone.sampler.logprob_token_ids_state
            mapping = cpu_batch.expanded_idx_mapping
            if index is not None:
                mapping = mapping[index]
            mapping = mapping.long()
            num_token_ids = state.num_token_ids[mapping]
            token_ids = state.token_ids[mapping]
        self._unclaimed = _Deferred(
            facts.dims,
            cpu_batch.num_reqs,
            facts.rows,
            logits,
            sampled,
            num_token_ids,
            token_ids,
        )

    def _score_rows(
        self, steps: list[_Deferred], num_logprobs: int, max_token_ids: int
    ) -> LogprobsTensors:
        """The scores of every kept row of `steps`, in order, as `__call__`
        scores a step's rows."""
        sampler = self.standalone.sampler
        assert sampler is not None
        logits = torch.cat([kept.logits for kept in steps])
        sampled = torch.cat([kept.sampled for kept in steps])
        named = {}
        if max_token_ids > 0:
            named = {
                "num_per_req_token_ids": torch.cat([k.num_token_ids for k in steps]),
                "per_req_token_ids": torch.cat([k.token_ids for k in steps]),
                "expanded_idx_mapping": torch.arange(logits.shape[0]),
            }
        return compute_topk_scores(
            logits,
            num_logprobs,
            sampled,
            None,
            max_per_req_token_ids=max_token_ids,
            logits_mode=sampler.logprobs_mode in ("raw_logits", "processed_logits"),
            **named,
        )


def _step_rows(
    scored: LogprobsTensors, start: int, stop: int, deferred: _Deferred
) -> LogprobsLists:
    """A step's logprob rows: its scored rows, where its asking rows are, and
    patch 0018's placeholders for the other rows."""
    own = scored._replace(
        logprob_token_ids=scored.logprob_token_ids[start:stop],
        logprobs=scored.logprobs[start:stop],
        selected_token_ranks=scored.selected_token_ranks[start:stop],
    )
    if deferred.rows is not None:
        own = spread_scores(own, torch.from_numpy(deferred.rows), deferred.num_rows)
    return own.tolists()
