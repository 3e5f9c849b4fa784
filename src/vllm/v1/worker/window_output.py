# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode, worker side, on either model runner: a window's stop tokens
and its one output.

A window (vllm/v1/core/sched/multi_step.py) runs several decode steps before
the scheduler sees any of them; the worker sides on Model Runner V1
(model_runner_v1_multi_step/) and on Model Runner V2 (gpu/multi_step/) stop a
request at the same tokens the scheduler stops it at, and hand the scheduler
one output with each request's tokens (and logprob rows) of every step, in
step order.
"""

from dataclasses import replace
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from vllm.v1.outputs import (
    AsyncModelRunnerOutput,
    KVConnectorOutput,
    LogprobsLists,
    ModelRunnerOutput,
)

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams


def stop_token_ids(params: "SamplingParams | None") -> frozenset[int]:
    """The token ids that end a request as soon as it samples one.

    The scheduler's check_stop stops on these before any other check; the
    sampler's min_tokens handling keeps them from being sampled too early.
    """
    if params is None:
        return frozenset()
    stops = frozenset(params.stop_token_ids or ())
    return stops if params.eos_token_id is None else stops | {params.eos_token_id}


class ReadyOutput(AsyncModelRunnerOutput):
    """A window's merged output, in the async wrapper the caller expects."""

    def __init__(self, output: ModelRunnerOutput) -> None:
        self.output = output

    def get_output(self) -> ModelRunnerOutput:
        return self.output

    def get_kv_connector_output(self) -> KVConnectorOutput | None:
        # Abstract from vLLM 0.33.0 on (the executor's salvage path after a
        # failed get_output); a merged output is already on the host.
        return self.output.kv_connector_output


def resolve_output(
    output: ModelRunnerOutput | AsyncModelRunnerOutput,
) -> ModelRunnerOutput:
    if isinstance(output, AsyncModelRunnerOutput):
        return output.get_output()
    return output


def returned_like(
    first: ModelRunnerOutput | AsyncModelRunnerOutput, merged: ModelRunnerOutput
) -> ModelRunnerOutput | AsyncModelRunnerOutput:
    """The window's output in the wrapper its first step came in."""
    if isinstance(first, AsyncModelRunnerOutput):
        return ReadyOutput(merged)
    return merged


def merge_step_outputs(steps: list[ModelRunnerOutput]) -> ModelRunnerOutput:
    """One output with each request's tokens (and logprob rows) in step order.

    Requests keep step 1's order; a step a request is not in, or sampled
    nothing in, adds nothing for it.
    """
    first = steps[0]
    num_nans: dict[str, int] = {}
    prompt_logprobs = {}
    for step in steps:
        num_nans.update(step.num_nans_in_logits or {})
        prompt_logprobs.update(step.prompt_logprobs_dict)
    logprobs = None
    if first.logprobs is None and all(s.req_ids == first.req_ids for s in steps):
        # Every step ran the same requests in the same order (the common case):
        # each request's tokens are its rows of every step, in step order.
        sampled_token_ids = [
            list(chain.from_iterable(request_rows))
            for request_rows in zip(*(s.sampled_token_ids for s in steps))
        ]
    else:
        rows = _request_rows(steps)
        sampled_token_ids = [
            [tok for step, i in req_rows for tok in step.sampled_token_ids[i]]
            for req_rows in rows
        ]
        if first.logprobs is not None:
            logprobs = _merge_logprobs(rows)
    return replace(
        first,
        sampled_token_ids=sampled_token_ids,
        logprobs=logprobs,
        prompt_logprobs_dict=prompt_logprobs,
        num_nans_in_logits=num_nans or first.num_nans_in_logits,
    )


def _request_rows(
    steps: list[ModelRunnerOutput],
) -> list[list[tuple[ModelRunnerOutput, int]]]:
    """For each request of step 1, each step's output and its row there,
    where it sampled something in that step."""
    indices = [{req_id: i for i, req_id in enumerate(s.req_ids)} for s in steps]
    return [
        [
            (step, index[req_id])
            for step, index in zip(steps, indices, strict=True)
            if req_id in index and step.sampled_token_ids[index[req_id]]
        ]
        for req_id in steps[0].req_ids
    ]


def _merge_logprobs(
    rows: list[list[tuple[ModelRunnerOutput, int]]],
) -> LogprobsLists:
    """Concatenate per-step logprob rows per request.

    Each step's arrays are as wide as that step's largest logprobs request;
    narrower rows are padded on the right (readers use a request's own count).
    A step after the last logprobs request left the window has no logprobs;
    the requests still in it did not ask for any (a request that asks is in
    every step it runs), so they get empty rows that keep each request's rows
    where `cu_num_generated_tokens` says, and that nothing reads.

    Each step's arrays are padded once and stacked, and the rows are gathered
    by one index: per request and step a slice and two pads cost 6 ms a window
    of 25 requests by 8 steps, as much as the window's forwards here.
    """
    steps = list({id(step): step for req_rows in rows for step, _ in req_rows}.values())
    present = [step.logprobs for step in steps if step.logprobs is not None]
    like = present[0]
    width = max(lists.logprob_token_ids.shape[1] for lists in present)
    blocks = [_padded_rows(step, like, width) for step in steps]
    # each request's first row in the stacked arrays, by step
    first_rows: dict[int, np.ndarray] = {}
    num_rows = 0
    for step, block in zip(steps, blocks, strict=True):
        first_rows[id(step)] = num_rows + _first_rows(step)
        num_rows += len(block[2])
    index: list[int] = []
    cu = [0]
    for req_rows in rows:
        for step, i in req_rows:
            start = int(first_rows[id(step)][i])
            index.extend(range(start, start + len(step.sampled_token_ids[i])))
        cu.append(len(index))
    token_ids, logprobs, ranks = (
        np.concatenate([block[k] for block in blocks])[index] for k in range(3)
    )
    return LogprobsLists(token_ids, logprobs, ranks, cu)


def _padded_rows(
    step: ModelRunnerOutput, like: LogprobsLists, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step's logprob rows `width` wide (empty rows where it has none: one
    per token it sampled)."""
    lists = step.logprobs
    if lists is None:
        num_rows = sum(map(len, step.sampled_token_ids))
        return (
            np.zeros((num_rows, width), like.logprob_token_ids.dtype),
            np.full((num_rows, width), -np.inf, like.logprobs.dtype),
            np.zeros(num_rows, like.sampled_token_ranks.dtype),
        )
    pad = ((0, 0), (0, width - lists.logprob_token_ids.shape[1]))
    return (
        np.pad(lists.logprob_token_ids, pad),
        np.pad(lists.logprobs, pad, constant_values=-np.inf),
        lists.sampled_token_ranks,
    )


def _first_rows(step: ModelRunnerOutput) -> np.ndarray:
    """Each request's first row in a step's logprob rows: its index, or where
    its tokens start (several rows where drafts were accepted; one per token
    in a step without logprobs)."""
    lists = step.logprobs
    cu = lists.cu_num_generated_tokens if lists is not None else None
    if cu is not None:
        return np.asarray(cu[: len(step.req_ids)])
    if lists is not None:
        return np.arange(len(step.req_ids))
    return np.cumsum([0] + [len(t) for t in step.sampled_token_ids[:-1]])
