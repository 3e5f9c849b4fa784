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
    """
    present = [s.logprobs for req_rows in rows for s, _ in req_rows if s.logprobs]
    like = present[0]
    width = max(lists.logprob_token_ids.shape[1] for lists in present)
    token_ids, logprobs, ranks, cu = [], [], [], [0]
    for req_rows in rows:
        num_rows = 0
        for step, index in req_rows:
            # One row per generated token: several when drafts were accepted.
            num_tokens = len(step.sampled_token_ids[index])
            if step.logprobs is None:
                lists = LogprobsLists(
                    np.zeros((num_tokens, 0), like.logprob_token_ids.dtype),
                    np.zeros((num_tokens, 0), like.logprobs.dtype),
                    np.zeros(num_tokens, like.sampled_token_ranks.dtype),
                )
            else:
                lists = step.logprobs.slice_request(index, num_tokens)
            pad = ((0, 0), (0, width - lists.logprob_token_ids.shape[1]))
            token_ids.append(np.pad(lists.logprob_token_ids, pad))
            logprobs.append(np.pad(lists.logprobs, pad, constant_values=-np.inf))
            ranks.append(lists.sampled_token_ranks)
            num_rows += num_tokens
        cu.append(cu[-1] + num_rows)
    return LogprobsLists(
        np.concatenate(token_ids),
        np.concatenate(logprobs),
        np.concatenate(ranks),
        cu,
    )
