# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Sample logprobs scored only for the rows whose request asks for them.

The standalone CPU sampler scores every logits row of a step (the top-k over
the vocabulary, the log-normalizer, the sampled token's rank) as soon as one
request in the batch wants logprobs, and the scheduler then drops the rows of
the requests that did not ask. It is paid at every step and grows with the
vocabulary: with 160 rows, 16 asking for top-5 and a 128,256-token vocabulary,
42 ms on one CPU core for every row against 6 ms for the asking ones
(benchmarks/logprob_rows.py in the vllm-overlay repository).

Each row's scores depend on that row's logits alone, so scoring the asking rows
apart gives them the values the whole batch gives them. The other rows get
placeholders (token id 0, logprob -inf, rank 0) so that the tensors keep the
shapes, and every row its index, that the rest of the engine expects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.v1.outputs import LogprobsTensors
from vllm.v1.worker.cpu.logprob import compute_topk_scores

if TYPE_CHECKING:
    from vllm.v1.worker.cpu.sampler import CPUSampler


def rows_that_want_logprobs(
    sampler: CPUSampler, expanded_idx_mapping: torch.Tensor
) -> np.ndarray | None:
    """The logits rows whose request wants sample logprobs or the scores of
    chosen token ids, or None when every row does."""
    req_indices = expanded_idx_mapping.numpy()
    # The sampler keeps -1 (NO_LOGPROBS) for a request without logprobs, and a
    # request's -1 ("the whole vocabulary") as the vocabulary size.
    wants = sampler.sampling_states.num_logprobs[req_indices] >= 0
    wants |= sampler.logprob_token_ids_state.num_token_ids_np[req_indices] > 0
    if wants.all():
        return None
    return np.flatnonzero(wants)


def compute_topk_scores_of_rows(
    rows: np.ndarray | None,
    logits: torch.Tensor,
    num_logprobs: int,
    sampled_token_ids: torch.Tensor,
    cu_num_logits: list[int] | torch.Tensor | None = None,
    *,
    expanded_idx_mapping: torch.Tensor,
    **kwargs,
) -> LogprobsTensors:
    """`compute_topk_scores` for `rows` of the batch only (all when None)."""
    if rows is None:
        return compute_topk_scores(
            logits,
            num_logprobs,
            sampled_token_ids,
            cu_num_logits,
            expanded_idx_mapping=expanded_idx_mapping,
            **kwargs,
        )
    index = torch.from_numpy(rows).to(logits.device)
    scored = compute_topk_scores(
        logits[index],
        num_logprobs,
        sampled_token_ids[index],
        cu_num_logits,
        expanded_idx_mapping=expanded_idx_mapping[index],
        **kwargs,
    )
    return spread_scores(scored, index, logits.shape[0])


def spread_scores(
    scored: LogprobsTensors, index: torch.Tensor, num_rows: int
) -> LogprobsTensors:
    """`scored` (the rows `index` of a batch) at their rows of a `num_rows`-row
    batch, the other rows placeholders (token id 0, logprob -inf, rank 0)."""
    return scored._replace(
        logprob_token_ids=_spread(scored.logprob_token_ids, index, num_rows, 0),
        logprobs=_spread(scored.logprobs, index, num_rows, float("-inf")),
        selected_token_ranks=_spread(scored.selected_token_ranks, index, num_rows, 0),
    )


def _spread(
    values: torch.Tensor, index: torch.Tensor, num_rows: int, fill: float
) -> torch.Tensor:
    """`values` at rows `index` of a `num_rows`-row tensor filled with `fill`."""
    out = values.new_full((num_rows, *values.shape[1:]), fill)
    out[index] = values
    return out
