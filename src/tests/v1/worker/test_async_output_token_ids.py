# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""InputBatch.update_async_output_token_ids under async scheduling.

Each sampled step appends a -1 placeholder to every request's output token
ids; the placeholders are replaced by the sampled ids only in steps where some
request needs output token ids (penalties, bad words). A request without such
parameters that ran alone for a while holds one placeholder per step; when a
penalties request joins, only the previous step's placeholder may be replaced,
or the request's output looks shorter and min_tokens masks its stop tokens for
too long.
"""

from types import SimpleNamespace

import torch

from vllm.v1.worker.gpu_input_batch import InputBatch


def _batch(output_token_ids: list[list[int]], sampled: list[list[int]]):
    return SimpleNamespace(
        sampling_metadata=SimpleNamespace(output_token_ids=output_token_ids),
        sampled_token_ids_cpu=torch.tensor(sampled),
        async_copy_ready_event=SimpleNamespace(synchronize=lambda: None),
        req_ids=[f"r{i}" for i in range(len(output_token_ids))],
        prev_req_id_to_index={f"r{i}": i for i in range(len(output_token_ids))},
    )


def test_earlier_steps_placeholders_keep_their_count():
    # r0 ran five steps alone (no request needed its ids); r1 (penalties) joins.
    alone, joined = [-1] * 5, [7, -1]
    batch = _batch([alone, joined], [[42], [43]])
    InputBatch.update_async_output_token_ids(batch)
    assert alone == [-1, -1, -1, -1, 42]  # five tokens, the last one known
    assert joined == [7, 43]


def test_optimistic_draft_placeholders_are_still_trimmed():
    # Async spec decode: the previous step planned 1 + 3 tokens, 2 were accepted.
    out = [5, -1, -1, -1, -1]
    batch = _batch([out], [[8, 9, -1, -1]])
    InputBatch.update_async_output_token_ids(batch)
    assert out == [5, 8, 9]
