# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Merging a decode window's step outputs (vllm/v1/worker/window_output.py), on
either model runner.

A window's batch shrinks as requests leave it, so later steps may lack what
earlier ones had: issue 18's crash was a window whose logprobs requests all
finished before the others, leaving steps with no logprobs at all.
"""

import dataclasses

import numpy as np
import pytest

from vllm.v1.outputs import AsyncModelRunnerOutput, LogprobsLists, ModelRunnerOutput
from vllm.v1.worker.window_output import merge_step_outputs, returned_like

pytestmark = pytest.mark.cpu_test


def _step(tokens: dict[str, int], logprobs: dict[str, float] | None):
    req_ids = list(tokens)
    lists = None
    if logprobs is not None:  # one logprob asked: sampled token + 1 column
        lists = LogprobsLists(
            np.array([[tokens[r], 7] for r in req_ids], dtype=np.int32),
            np.array([[logprobs.get(r, 0.0), -9.0] for r in req_ids], np.float32),
            np.array([1 for _ in req_ids], dtype=np.int32),
        )
    return _output(req_ids, [[tokens[r]] for r in req_ids], lists)


def _output(req_ids, sampled_token_ids, logprobs):
    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    # vLLM 0.34.0 dropped req_id_to_index (outputs are found by req_ids)
    by_index = {r: i for i, r in enumerate(req_ids)}
    extra = {"req_id_to_index": by_index} if "req_id_to_index" in fields else {}
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=sampled_token_ids,
        logprobs=logprobs,
        **extra,
    )


def test_steps_after_the_last_logprobs_request_left():
    steps = [
        _step({"a": 10, "b": 20}, {"a": -0.5, "b": -1.5}),  # "a" asked for logprobs
        _step({"a": 11, "b": 21}, {"a": -0.25, "b": -1.0}),  # "a" stops here
        _step({"b": 22}, None),  # no logprobs request left
        _step({"b": 23}, None),
    ]

    merged = merge_step_outputs(steps)

    assert merged.sampled_token_ids == [[10, 11], [20, 21, 22, 23]]
    a = merged.logprobs.slice_request(0, 2)
    assert a.logprob_token_ids.tolist() == [[10, 7], [11, 7]]
    assert a.logprobs.tolist() == [[-0.5, -9.0], [-0.25, -9.0]]
    # "b" keeps one row per token so that "a"'s rows stay where cu says.
    assert merged.logprobs.cu_num_generated_tokens == [0, 2, 6]
    assert merged.logprobs.logprob_token_ids.dtype == np.int32
    assert len(merged.logprobs.sampled_token_ranks) == 6


def test_rows_stay_request_major_in_step_order():
    steps = [
        _step({"a": 1, "b": 2}, {"a": -1.0, "b": -2.0}),
        _step({"a": 3}, {"a": -3.0}),
    ]
    merged = merge_step_outputs(steps)
    assert merged.sampled_token_ids == [[1, 3], [2]]
    assert merged.logprobs.cu_num_generated_tokens == [0, 2, 3]
    assert merged.logprobs.logprobs[:, 0].tolist() == [-1.0, -3.0, -2.0]
    assert merged.logprobs.slice_request(1, 1).logprobs.tolist() == [[-2.0, -9.0]]


def test_a_window_without_logprobs_has_none():
    merged = merge_step_outputs([_step({"a": 1}, None), _step({"a": 2}, None)])
    assert merged.logprobs is None and merged.sampled_token_ids == [[1, 2]]


def test_a_step_a_request_sampled_nothing_in_adds_nothing():
    # Every step ran the same requests; "b" sampled nothing in step 2.
    steps = [_step({"a": 1, "b": 2}, None), _step({"a": 3, "b": 4}, None)]
    steps[1].sampled_token_ids[1] = []
    steps.append(_step({"a": 5, "b": 6}, None))
    merged = merge_step_outputs(steps)
    assert merged.sampled_token_ids == [[1, 3, 5], [2, 6]]
    # the same requests in another order in one step: merged by request
    steps[2] = _step({"b": 6, "a": 5}, None)
    assert merge_step_outputs(steps).sampled_token_ids == [[1, 3, 5], [2, 6]]


def _reference_rows(steps, req_id, width):
    """A request's merged logprob rows, one token at a time from each step."""
    ids, lps = [], []
    for step in steps:
        if req_id not in step.req_ids:
            continue
        i = step.req_ids.index(req_id)
        n = len(step.sampled_token_ids[i])
        if step.logprobs is None:
            ids += [[0] * width] * n
            lps += [[-np.inf] * width] * n
            continue
        rows = step.logprobs.slice_request(i, n)
        pad = width - rows.logprob_token_ids.shape[1]
        ids += [list(r) + [0] * pad for r in rows.logprob_token_ids.tolist()]
        lps += [list(r) + [-np.inf] * pad for r in rows.logprobs.tolist()]
    return ids, lps


def test_random_windows_merge_as_row_by_row():
    """Requests leaving, rows of several tokens (drafts: cu_num_generated_tokens),
    steps of other widths and steps without logprobs: each request's merged
    rows are its rows of every step, in step order."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        req_ids = [f"r{i}" for i in range(int(rng.integers(1, 7)))]
        steps = []
        for s in range(int(rng.integers(1, 6))):
            ids = [r for r in req_ids if rng.random() < 0.8] or req_ids[:1]
            tokens = [list(rng.integers(1, 99, int(rng.integers(0, 4)))) for _ in ids]
            tokens[0] = tokens[0] or [1]  # a step runs while a request samples
            lists = None
            if s == 0 or rng.random() < 0.7:
                cu = np.cumsum([0] + [len(t) for t in tokens]).tolist()
                n, w = cu[-1], int(rng.integers(1, 4))
                lists = LogprobsLists(
                    rng.integers(0, 99, (n, w)).astype(np.int32),
                    rng.random((n, w)).astype(np.float32),
                    rng.integers(0, 9, n).astype(np.int32),
                    cu,
                )
            steps.append(_output(ids, tokens, lists))
        merged = merge_step_outputs(steps)
        width = merged.logprobs.logprob_token_ids.shape[1]
        for i, req_id in enumerate(merged.req_ids):
            num_tokens = len(merged.sampled_token_ids[i])
            rows = merged.logprobs.slice_request(i, num_tokens)
            ids, lps = _reference_rows(steps, req_id, width)
            assert rows.logprob_token_ids.tolist() == ids
            assert rows.logprobs.tolist() == lps


class _AsyncStep(AsyncModelRunnerOutput):
    """A first step as the async runner returns it."""

    def __init__(self, output: ModelRunnerOutput) -> None:
        self.output = output

    def get_output(self) -> ModelRunnerOutput:
        return self.output

    def get_kv_connector_output(self):
        return None


def test_a_window_after_an_async_first_step_comes_back_async():
    # Every abstract method of the release's AsyncModelRunnerOutput is defined
    # (0.33.0 added get_kv_connector_output): the wrapper can be made at all.
    merged = merge_step_outputs([_step({"a": 1}, None), _step({"a": 2}, None)])
    returned = returned_like(_AsyncStep(merged), merged)
    assert isinstance(returned, AsyncModelRunnerOutput)
    assert returned.get_output() is merged
    assert returned.get_kv_connector_output() is merged.kv_connector_output
    assert returned_like(merged, merged) is merged
