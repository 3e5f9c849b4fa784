# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode with speculative decoding: windows and token tracking.

Scheduler side (vllm/v1/core/sched/multi_step.py): a window with k drafts
plans W * (1 + k) positions per request and keeps, after the window, one
position per generated token. Worker side
(vllm/v1/worker/model_runner_v1_multi_step/spec_window.py):
each inner step starts where the previous one's accepted tokens end, per
request. The values expected of the real functions are ones the two
token-tracking bugs found in the review of the V1 multi-step proposal would not
give.
"""

import pytest

from vllm.v1.core.sched.multi_step import DecodeWindowPlanner
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.worker.model_runner_v1_multi_step.spec_window import (
    SpecDecodeWindow,
    advance_requests,
    next_num_computed,
)
from vllm.v1.worker.model_runner_v1_multi_step.steps import follow_up_step

from .utils import create_requests, create_scheduler

pytestmark = pytest.mark.cpu_test

TOKEN = 1
K = 3  # drafts per step


def _scheduler(num_steps: int, method: str = "ngram", **kwargs):
    scheduler = create_scheduler(
        num_speculative_tokens=K, speculative_method=method, **kwargs
    )
    scheduler.scheduler_config.num_scheduler_steps = num_steps
    scheduler.multi_step = DecodeWindowPlanner.create(scheduler)
    return scheduler


def _output(
    sched_output: SchedulerOutput,
    tokens: dict[str, list[int]],
    spec_counts: dict[str, list[tuple[int, int]]] | None = None,
) -> ModelRunnerOutput:
    req_ids = list(sched_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=[tokens[r] for r in req_ids],
        multi_step_spec_counts=spec_counts,
    )


def _decoding(scheduler, num_requests: int = 2, max_tokens: int = 32):
    """Requests past their prefill, each holding K drafts for the next step."""
    requests = create_requests(
        num_requests=num_requests, num_tokens=10, max_tokens=max_tokens
    )
    for request in requests:
        scheduler.add_request(request)
    prefill = scheduler.schedule()
    assert not prefill.multi_step_window
    scheduler.update_from_output(
        prefill, _output(prefill, {r.request_id: [TOKEN] for r in requests})
    )
    for request in requests:
        request.spec_token_ids = [5, 6, 7]  # as update_draft_token_ids sets them
    return requests


def _num_slots(scheduler, request: Request) -> int:
    (block_ids,) = scheduler.kv_cache_manager.get_block_ids(request.request_id)
    return len(block_ids) * scheduler.block_size


def test_spec_window_plans_the_worst_case_positions():
    scheduler = _scheduler(4)
    req0, req1 = _decoding(scheduler)
    start = req0.num_computed_tokens

    window = scheduler.schedule()

    assert window.multi_step_window == 4
    # Each of 4 steps may process the last token and 3 drafts.
    assert window.num_scheduled_tokens == {req0.request_id: 16, req1.request_id: 16}
    assert window.scheduled_spec_decode_tokens[req0.request_id] == [5, 6, 7]
    assert _num_slots(scheduler, req0) >= start + 16


def test_window_leaves_room_for_each_requests_drafting_slots(monkeypatch):
    """A draft model needs one more input slot per request, which schedule()
    charges to max_num_batched_tokens; windows must fit with it (issue 18:
    k = 3, N = 4, 64 tokens, four requests tripped `input_budget >= 0`)."""
    from vllm.config import SpeculativeConfig

    monkeypatch.setattr(
        SpeculativeConfig, "max_num_new_slots_for_drafting", property(lambda _: 1)
    )
    scheduler = _scheduler(4, max_num_batched_tokens=64)
    requests = _decoding(scheduler, num_requests=4)

    window = scheduler.schedule()

    # 4 steps would need 4 * (16 + 1) = 68 > 64; 3 steps need 52.
    assert window.multi_step_window == 3
    assert set(window.num_scheduled_tokens.values()) == {3 * (1 + K)}
    assert sum(window.num_scheduled_tokens.values()) + len(requests) <= 64


def test_spec_window_capped_by_max_tokens_plus_drafts():
    scheduler = _scheduler(4)
    (req,) = _decoding(scheduler, num_requests=1, max_tokens=3)  # 2 tokens left

    window = scheduler.schedule()

    # The last step starts before the 3rd token and writes at most K + 1.
    assert window.num_scheduled_tokens == {req.request_id: 2 + K}


def test_window_keeps_one_position_per_generated_token():
    """Review bug 1 at the scheduler: count processed positions, then settle.

    A window of 2 steps plans 8 positions; step 1 accepts 1 of 3 drafts (2
    tokens), step 2 all 3 (4 tokens). num_computed_tokens must end 6 past the
    start. Upstream's single-step rollback (num_computed -= drafts - accepted,
    with the window's 6 tokens taken for one step: 3 - 5 = -2) would leave it
    at start + 8, two positions whose KV holds rejected drafts.
    """
    scheduler = _scheduler(2)
    (req,) = _decoding(scheduler, num_requests=1)
    start = req.num_computed_tokens
    window = scheduler.schedule()
    assert window.num_scheduled_tokens == {req.request_id: 8}

    tokens = [11, 12, 21, 22, 23, 24]
    counts = {req.request_id: [(3, 1), (3, 3)]}
    outputs = scheduler.update_from_output(
        window, _output(window, {req.request_id: tokens}, counts)
    )

    assert req.num_computed_tokens == start + 6 == req.num_tokens - 1
    assert list(req.output_token_ids)[-6:] == tokens
    stats = next(iter(outputs.values())).scheduler_stats.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens) == (2, 6)
    assert stats.num_accepted_tokens == 4


def test_stop_inside_accepted_drafts_ends_the_request():
    scheduler = _scheduler(2)
    (req,) = _decoding(scheduler, num_requests=1)
    req.sampling_params.stop_token_ids = [99]
    window = scheduler.schedule()

    tokens = [11, 99, 12, 13]  # step 1 accepted 3 drafts, the 2nd token stops
    scheduler.update_from_output(
        window, _output(window, {req.request_id: tokens}, {req.request_id: [(3, 3)]})
    )

    assert req.is_finished()
    assert list(req.output_token_ids)[-2:] == [11, 99]
    assert req.request_id not in scheduler.requests  # blocks freed


# --- Worker side: where each inner step starts -------------------------------


@pytest.mark.parametrize(
    "num_processed, num_rejected, start",
    [
        (4, 2, 102),  # 3 drafts, 1 accepted: 2 tokens generated
        (4, 0, 104),  # every draft accepted, plus the bonus token
        (4, 3, 101),  # none accepted: the bonus token alone
        (1, 0, 101),  # no drafts
    ],
)
def test_next_step_starts_after_the_generated_tokens(
    num_processed, num_rejected, start
):
    """A step at 100 processed its last token and its drafts; the next starts after
    the tokens it generated. Review bug 1 (advance by the accepted drafts: the bonus
    token is lost) gives 101 for the first row, re-feeding a position; advancing by
    what was processed gives 104, a hole whose KV holds rejected drafts."""
    assert next_num_computed(100, num_processed, num_rejected) == start


def test_each_request_advances_once_by_its_own_result():
    """Two requests with 2 drafts each (3 token rows each), rows reordered.

    a (at 100) accepts both drafts: 3 tokens -> 103; b (at 50) none: 1 token
    -> 51. Review bug 2 (the update applied once per token row) gives 109 and
    53; reading rows by position instead of req_id_to_index mixes a and b up.
    """
    output = ModelRunnerOutput(
        req_ids=["b", "a"],
        req_id_to_index={"b": 0, "a": 1},
        sampled_token_ids=[[7], [4, 5, 6]],
    )
    num_computed = {"a": 100, "b": 50}
    counts = advance_requests(
        output, ["a", "b"], {"a": [4, 5], "b": [8, 9]}, num_computed
    )
    assert num_computed == {"a": 103, "b": 51}
    assert counts == {"a": (2, 2), "b": (2, 0)}  # (drafts, accepted) per request


class _Req:
    def __init__(self, num_outputs: int) -> None:
        self.output_token_ids = [TOKEN] * num_outputs


class _Runner:
    num_spec_tokens = K

    def __init__(self) -> None:
        self.requests = {"a": _Req(5), "b": _Req(2)}

    def take_draft_token_ids(self) -> DraftTokenIds:
        return DraftTokenIds(["b", "a"], [[], [31, 32, 33]])


def test_next_inner_step_carries_the_new_drafts_from_the_new_start():
    window = SchedulerOutput.make_empty()
    window.num_spec_tokens_to_schedule = K
    runner = _Runner()
    spec = SpecDecodeWindow(runner)
    num_computed = {"a": 103, "b": 51}
    end = {"a": 116, "b": 104}
    steps_left = {"a": 2, "b": 2}

    drafts = spec._next_drafts(steps_left, num_computed, end)
    step = follow_up_step(
        runner.requests, num_computed, drafts, window.num_spec_tokens_to_schedule
    )

    assert step.num_scheduled_tokens == {"a": 4, "b": 1}  # b got no ngram match
    assert step.scheduled_spec_decode_tokens == {"a": [31, 32, 33]}
    assert step.scheduled_cached_reqs.num_computed_tokens == [103, 51]
    assert step.scheduled_cached_reqs.num_output_tokens == [5, 2]
    assert step.num_spec_tokens_to_schedule == K  # the drafter proposes again
    # Near the end of a request's positions the drafts are trimmed to fit.
    assert spec._next_drafts(steps_left, num_computed, {"a": 105, "b": 104})["a"] == [
        31
    ]


# --- Async scheduling: windows planned before the last one's output ----------


def test_async_windows_settle_to_the_generated_tokens():
    """Window 2 is planned while window 1 runs, as if window 1 had used all its
    positions (16), with placeholder drafts. Window 1 generates 6 tokens and
    window 2 5: the counters must end one position per generated token, with
    no placeholder left."""
    # ngram_gpu: a drafter vLLM runs under async scheduling (ngram it does not).
    scheduler = _scheduler(4, "ngram_gpu", async_scheduling=True)
    (req,) = _decoding(scheduler, num_requests=1)
    start = req.num_computed_tokens
    first = scheduler.schedule()
    assert first.num_scheduled_tokens == {req.request_id: 16}
    assert req.num_output_placeholders == 16  # the most window 1 can produce

    second = scheduler.schedule()  # window 1 still in flight
    assert second.multi_step_window == 4
    assert second.num_scheduled_tokens == {req.request_id: 16}
    assert second.scheduled_spec_decode_tokens[req.request_id] == [-1] * K

    first_counts = {req.request_id: [(3, 1), (3, 0), (3, 0), (3, 0)]}
    first_tokens = {req.request_id: [11, 12, 13, 14, 15, 16]}
    scheduler.update_from_output(first, _output(first, first_tokens, first_counts))
    second_counts = {req.request_id: [(3, 0), (3, 0), (3, 0), (3, 1)]}
    second_tokens = {req.request_id: [21, 22, 23, 24, 25]}
    scheduler.update_from_output(second, _output(second, second_tokens, second_counts))

    assert req.num_computed_tokens == start + 11 == req.num_tokens - 1
    assert req.num_output_placeholders == 0


class _State:
    def __init__(self, num_prompt: int, num_outputs: int) -> None:
        self.output_token_ids = [TOKEN] * num_outputs
        self.num_tokens = num_prompt + num_outputs


class _AsyncRunner:
    """a and b decode (b absent from the last step: no drafts for it), c is
    part-way through its prompt, d was preempted and resumes."""

    def __init__(self) -> None:
        self.requests = {
            "a": _State(10, 6),
            "b": _State(10, 3),
            "c": _State(40, 0),
            "d": _State(10, 8),
        }

    def take_draft_token_ids(self) -> DraftTokenIds:
        return DraftTokenIds(["a", "c"], [[31, 32, 33], [0, 0, 0]])


def _planned(num_scheduled: dict[str, int], window: int) -> SchedulerOutput:
    """What the async scheduler sent: optimistic starts, placeholder drafts."""
    planned = follow_up_step(_AsyncRunner().requests, dict.fromkeys("abcd", 0))
    cached = planned.scheduled_cached_reqs
    cached.num_computed_tokens = [19, 15, 16, 0]
    cached.num_output_tokens = [2, 2, 0, 8]
    cached.resumed_req_ids = {"d"}
    planned.num_scheduled_tokens = num_scheduled
    planned.total_num_scheduled_tokens = sum(num_scheduled.values())
    planned.scheduled_spec_decode_tokens = {"a": [-1] * K, "b": [-1] * K}
    planned.multi_step_window = window
    return planned


def test_optimistic_step_starts_at_the_last_sampled_token():
    spec = SpecDecodeWindow(_AsyncRunner())
    planned = _planned({"a": 1 + K, "b": 1 + K, "c": 16, "d": 18}, window=0)

    step = spec.correct_optimistic_step(planned)

    cached = step.scheduled_cached_reqs
    # Decoding requests start at their last token; the prompt chunk and the
    # resumed request keep the scheduler's start (it is exact for them).
    assert cached.num_computed_tokens == [15, 12, 16, 0]
    assert cached.num_output_tokens == [6, 3, 0, 8]
    # a gets the drafts the last step proposed; b was not in it: no drafts,
    # one token fewer per missing draft.
    assert step.scheduled_spec_decode_tokens == {"a": [31, 32, 33]}
    assert step.num_scheduled_tokens == {"a": 1 + K, "b": 1, "c": 16, "d": 18}
    assert step.total_num_scheduled_tokens == 1 + K + 1 + 16 + 18
    # The scheduler's own output is left as it planned it.
    assert planned.scheduled_cached_reqs.num_computed_tokens == [19, 15, 16, 0]
    assert planned.scheduled_spec_decode_tokens["a"] == [-1] * K


def test_optimistic_window_keeps_its_positions():
    spec = SpecDecodeWindow(_AsyncRunner())
    planned = _planned({"a": 4 * (1 + K), "b": 4 * (1 + K), "c": 16, "d": 18}, 4)

    step = spec.correct_optimistic_step(planned)

    assert step.num_scheduled_tokens == planned.num_scheduled_tokens
    assert step.scheduled_spec_decode_tokens == {"a": [31, 32, 33]}
