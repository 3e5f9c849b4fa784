# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode windows in the scheduler (vllm/v1/core/sched/multi_step.py).

A fake worker answers each window with one token per planned step, so these
tests check the scheduler's bookkeeping alone: window sizes, KV slots for the
whole window, num_computed_tokens by processed positions, stop checks token by
token, and the async placeholders.
"""

import dataclasses
from collections import deque

import pytest

from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.core.sched.multi_step import MODEL_RUNNER_V2, DecodeWindowPlanner
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from .utils import EOS_TOKEN_ID, create_requests, create_scheduler

pytestmark = pytest.mark.cpu_test

TOKEN = 1  # never a stop token here


def _scheduler(num_steps: int, joins: bool = False, **kwargs):
    """A scheduler planning windows of up to `num_steps`; where `joins`, a
    schedule that admits requests is a window too wherever the budget allows
    (Model Runner V2 only; `multi_step_join: "always"`), else a single step,
    as the tests of running requests' windows assume."""
    scheduler = create_scheduler(**kwargs)
    scheduler.scheduler_config.num_scheduler_steps = num_steps
    scheduler.multi_step = DecodeWindowPlanner.create(scheduler)
    scheduler.multi_step.join_mode = "always" if joins else "off"
    return scheduler


def _output(
    sched_output: SchedulerOutput, tokens: dict[str, list[int]] | None = None
) -> ModelRunnerOutput:
    """A worker's answer: one token per window step (prefill steps: one token)."""
    req_ids = list(sched_output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        steps = (
            sched_output.num_scheduled_tokens[req_id]
            if sched_output.multi_step_window
            else 1
        )
        sampled.append((tokens or {}).get(req_id, [TOKEN] * steps))
    # vLLM 0.34.0 finds a request's row by req_ids alone (req_id_to_index is gone)
    index = {"req_id_to_index": {req_id: i for i, req_id in enumerate(req_ids)}}
    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=sampled,
        **{k: v for k, v in index.items() if k in fields},
    )


def _num_slots(scheduler, request: Request) -> int:
    (block_ids,) = scheduler.kv_cache_manager.get_block_ids(request.request_id)
    return len(block_ids) * scheduler.block_size


def _prefill(scheduler, requests: list[Request]) -> None:
    for request in requests:
        scheduler.add_request(request)
    sched_output = scheduler.schedule()
    assert not sched_output.multi_step_window
    scheduler.update_from_output(sched_output, _output(sched_output))


def test_window_for_a_pure_decode_batch():
    scheduler = _scheduler(4)
    requests = create_requests(num_requests=2, num_tokens=10, max_tokens=16)
    _prefill(scheduler, requests)

    sched_output = scheduler.schedule()
    assert sched_output.multi_step_window
    assert sched_output.num_scheduled_tokens == {r.request_id: 4 for r in requests}
    for request in requests:
        # Positions 10..13 are processed in the window; their KV slots exist
        # before the worker runs it.
        assert request.num_computed_tokens == 14
        assert _num_slots(scheduler, request) >= 14

    scheduler.update_from_output(sched_output, _output(sched_output))
    for request in requests:
        assert list(request.output_token_ids) == [TOKEN] * 5
        assert request.num_computed_tokens == request.num_tokens - 1


def test_stop_inside_a_window_discards_the_tokens_after_it():
    scheduler = _scheduler(4)
    req0, req1 = create_requests(num_requests=2, num_tokens=10, max_tokens=16)
    _prefill(scheduler, [req0, req1])

    sched_output = scheduler.schedule()
    tokens = {req0.request_id: [TOKEN, EOS_TOKEN_ID, TOKEN, TOKEN]}
    outputs = scheduler.update_from_output(sched_output, _output(sched_output, tokens))

    assert req0.status == RequestStatus.FINISHED_STOPPED
    assert list(req0.output_token_ids) == [TOKEN, TOKEN, EOS_TOKEN_ID]
    (engine_outputs,) = outputs.values()
    by_id = {o.request_id: o for o in engine_outputs.outputs}
    assert by_id[req0.request_id].new_token_ids == [TOKEN, EOS_TOKEN_ID]
    assert by_id[req1.request_id].new_token_ids == [TOKEN] * 4
    assert req0.request_id not in scheduler.requests  # blocks freed
    assert req1.num_computed_tokens == req1.num_tokens - 1


def test_short_window_gives_back_unprocessed_positions():
    """num_computed_tokens follows what the worker processed, not the plan.

    The bug this guards against (seed review: counting per plan, not per
    processed position) would leave req at 14 computed tokens after processing
    two positions, and the next window would read KV that was never written.
    """
    scheduler = _scheduler(4)
    (req,) = create_requests(num_requests=1, num_tokens=10, max_tokens=16)
    _prefill(scheduler, [req])
    sched_output = scheduler.schedule()
    assert req.num_computed_tokens == 14
    tokens = {req.request_id: [TOKEN, TOKEN]}
    scheduler.update_from_output(sched_output, _output(sched_output, tokens))
    assert req.num_computed_tokens == 12 == req.num_tokens - 1
    assert scheduler.schedule().num_scheduled_tokens == {req.request_id: 4}


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("num_steps", [2, 3, 8])
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 17])
def test_windows_stop_exactly_at_max_tokens(
    max_tokens: int, num_steps: int, async_scheduling: bool
):
    """Pipelined like the async engine: the next schedule runs before the
    previous output arrives, and no position past max_tokens is scheduled."""
    scheduler = _scheduler(num_steps, async_scheduling=async_scheduling)
    requests = create_requests(num_requests=3, num_tokens=7, max_tokens=max_tokens)
    for request in requests:
        scheduler.add_request(request)
    in_flight: deque[SchedulerOutput] = deque([scheduler.schedule()])
    total_scheduled = 0
    while in_flight:
        if async_scheduling:
            nxt = scheduler.schedule()
            if nxt.num_scheduled_tokens:
                in_flight.append(nxt)
        sched_output = in_flight.popleft()
        total_scheduled += sched_output.total_num_scheduled_tokens
        scheduler.update_from_output(sched_output, _output(sched_output))
        if not async_scheduling or not in_flight:
            nxt = scheduler.schedule()
            if nxt.num_scheduled_tokens:
                in_flight.append(nxt)

    assert scheduler.get_num_unfinished_requests() == 0
    for request in requests:
        assert list(request.output_token_ids) == [TOKEN] * max_tokens
        assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert total_scheduled == 3 * (7 + max_tokens - 1)


def test_window_capped_by_max_model_len():
    scheduler = _scheduler(8, max_model_len=14)
    (req,) = create_requests(num_requests=1, num_tokens=10, max_tokens=100)
    _prefill(scheduler, [req])
    sched_output = scheduler.schedule()
    # 11 tokens exist; the window may sample tokens 12, 13 and 14.
    assert sched_output.num_scheduled_tokens == {req.request_id: 3}
    scheduler.update_from_output(sched_output, _output(sched_output))
    assert req.num_tokens == 14
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_waiting_request_turns_the_step_into_a_single_step():
    scheduler = _scheduler(4)
    req0, req1 = create_requests(num_requests=2, num_tokens=10, max_tokens=16)
    _prefill(scheduler, [req0])
    scheduler.add_request(req1)
    sched_output = scheduler.schedule()
    assert not sched_output.multi_step_window
    assert sched_output.num_scheduled_tokens == {
        req0.request_id: 1,
        req1.request_id: 10,
    }
    scheduler.update_from_output(sched_output, _output(sched_output))
    assert scheduler.schedule().multi_step_window


@pytest.mark.skipif(
    not MODEL_RUNNER_V2, reason="new requests join windows on Model Runner V2 only"
)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_admitted_requests_join_the_window(async_scheduling):
    scheduler = _scheduler(4, joins=True, async_scheduling=async_scheduling)
    req0, req1, req2 = create_requests(num_requests=3, num_tokens=10, max_tokens=16)
    req2.max_tokens = 2  # its window ends at max_tokens
    _prefill_and_settle(scheduler, [req0])
    scheduler.add_request(req1)
    scheduler.add_request(req2)
    window = scheduler.schedule()
    assert window.multi_step_window == 4
    # the running request's 4 steps; each prompt, then its later steps
    assert window.num_scheduled_tokens == {"0": 4, "1": 10 + 3, "2": 10 + 1}
    assert _num_slots(scheduler, req1) >= 13
    if async_scheduling:  # the most tokens the window can make for each
        assert [r.num_output_placeholders for r in (req0, req1, req2)] == [4, 4, 2]
    # req1 leaves at its 3rd step (a stop): its 4th position is given back
    tokens = {"0": [TOKEN] * 4, "1": [TOKEN, TOKEN, EOS_TOKEN_ID], "2": [TOKEN] * 2}
    scheduler.update_from_output(window, _output(window, tokens))
    assert req1.status == RequestStatus.FINISHED_STOPPED
    assert req2.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert list(req0.output_token_ids) == [TOKEN] * 5
    assert req0.num_computed_tokens == req0.num_tokens - 1
    assert req0.num_output_placeholders == 0


@pytest.mark.skipif(
    not MODEL_RUNNER_V2, reason="new requests join windows on Model Runner V2 only"
)
def test_admitted_requests_join_where_enough_requests_run_beside_them():
    """By default (`multi_step_join: true`) m admitted requests join a window
    of n where their first tokens' wait, m * (n - 1) steps, is less than the
    step boundary a single step adds for all r + m requests."""
    scheduler = _scheduler(4, joins=True, max_num_seqs=16)
    scheduler.multi_step.join_mode = "auto"
    running = create_requests(num_requests=5, num_tokens=6, max_tokens=64)
    waiting = create_requests(
        num_requests=3, num_tokens=6, max_tokens=64, req_ids=["a", "b", "c"]
    )
    # each a single step, its first tokens out after it: an idle server's
    # request; 1 running beside 4 admitted; 5 beside 3 (3 * 3 < 5 + 3 fails)
    for admitted in (running[:1], running[1:], waiting):
        for request in admitted:
            scheduler.add_request(request)
        single = scheduler.schedule()
        assert not single.multi_step_window
        scheduler.update_from_output(single, _output(single))
    # 8 running beside 1 admitted: 1 * 3 < 8 + 1; it joins a window of 4
    (late,) = create_requests(num_requests=1, num_tokens=6, req_ids=["late"])
    scheduler.add_request(late)
    window = scheduler.schedule()
    assert window.multi_step_window == 4
    assert window.num_scheduled_tokens["late"] == 6 + 3


@pytest.mark.skipif(
    not MODEL_RUNNER_V2, reason="new requests join windows on Model Runner V2 only"
)
def test_waiting_prompts_keep_their_budget_beside_a_window():
    scheduler = _scheduler(8, joins=True, max_num_seqs=4, max_num_batched_tokens=16)
    req0, req1 = create_requests(num_requests=2, num_tokens=6, max_tokens=30)
    (long,) = create_requests(
        num_requests=1, num_tokens=20, max_tokens=30, req_ids=["long"]
    )
    _prefill_and_settle(scheduler, [req0])
    scheduler.add_request(req1)
    window = scheduler.schedule()
    # the prompt's 6 tokens first; then 5 steps each in the 10 left (4 after
    # the prompt's own step)
    assert window.multi_step_window == 5
    assert window.num_scheduled_tokens == {"0": 5, "1": 6 + 4}
    scheduler.update_from_output(
        window, _output(window, {"0": [TOKEN] * 5, "1": [TOKEN] * 5})
    )
    # each kept one position per token (the prompt's last sampled the first)
    assert req0.num_computed_tokens == req0.num_tokens - 1
    assert req1.num_computed_tokens == req1.num_tokens - 1
    # a prompt longer than the budget: a single step, a chunk of it, as upstream
    scheduler.add_request(long)
    single = scheduler.schedule()
    assert not single.multi_step_window
    assert single.num_scheduled_tokens == {"0": 1, "1": 1, "long": 14}


@pytest.mark.skipif(
    not MODEL_RUNNER_V2, reason="new requests join windows on Model Runner V2 only"
)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_joined_requests_run_to_max_tokens(async_scheduling):
    """Admitted in a window, then windows planned while the one before is in
    flight (async scheduling: its output comes back after the next schedule),
    every request gets its max_tokens, the placeholders back to zero."""
    scheduler = _scheduler(8, joins=True, async_scheduling=async_scheduling)
    requests = create_requests(num_requests=8, num_tokens=10, max_tokens=32)
    for request in requests:
        scheduler.add_request(request)
    in_flight: deque[SchedulerOutput] = deque()
    for _ in range(100):
        if scheduler.has_requests():
            in_flight.append(scheduler.schedule())
        if len(in_flight) > async_scheduling or not scheduler.has_requests():
            if not in_flight:
                break
            sched_output = in_flight.popleft()
            scheduler.update_from_output(sched_output, _worker_output(sched_output))
    assert [len(r.output_token_ids) for r in requests] == [32] * 8
    assert [r.num_output_placeholders for r in requests] == [0] * 8


def _worker_output(sched_output: SchedulerOutput) -> ModelRunnerOutput:
    """A worker's answer to a window with admitted requests: a prompt's step 1
    samples one token, then one per later step."""
    tokens = {}
    for new_req in sched_output.scheduled_new_reqs:
        num_prompt = len(new_req.prefill_token_ids) - new_req.num_computed_tokens
        num_scheduled = sched_output.num_scheduled_tokens[new_req.req_id]
        tokens[new_req.req_id] = [TOKEN] * (num_scheduled - num_prompt + 1)
    return _output(sched_output, tokens)


def _prefill_and_settle(scheduler, requests: list[Request]) -> None:
    """Admit `requests` in a step of their own and take its tokens in."""
    for request in requests:
        scheduler.add_request(request)
    sched_output = scheduler.schedule()
    tokens = {r.request_id: [TOKEN] for r in requests}
    scheduler.update_from_output(sched_output, _output(sched_output, tokens))


def test_partial_prefill_in_the_batch_keeps_single_steps():
    scheduler = _scheduler(
        4, max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=True
    )
    req0, req1 = create_requests(num_requests=2, num_tokens=6, max_tokens=16)
    req1.prompt_token_ids.extend([5] * 20)  # a long prompt: prefilled in chunks
    _prefill(scheduler, [req0])
    scheduler.add_request(req1)
    while req1.num_computed_tokens < req1.num_prompt_tokens:
        sched_output = scheduler.schedule()
        assert not sched_output.multi_step_window
        assert sched_output.num_scheduled_tokens[req0.request_id] == 1
        scheduler.update_from_output(sched_output, _output(sched_output))
    assert scheduler.schedule().multi_step_window


def test_async_placeholders_cover_the_whole_window():
    scheduler = _scheduler(4, async_scheduling=True)
    (req,) = create_requests(num_requests=1, num_tokens=10, max_tokens=16)
    scheduler.add_request(req)
    prefill = scheduler.schedule()
    window = scheduler.schedule()  # planned while the prefill is in flight
    assert window.multi_step_window
    assert window.num_scheduled_tokens == {req.request_id: 4}
    assert req.num_output_placeholders == 5
    scheduler.update_from_output(prefill, _output(prefill))
    scheduler.update_from_output(window, _output(window))
    assert req.num_output_placeholders == 0
    assert list(req.output_token_ids) == [TOKEN] * 5
    assert req.num_computed_tokens == req.num_tokens - 1


def test_token_budget_shrinks_every_window_alike():
    """No request gets a window cut short by the budget (it would leave the
    worker's batch early without finishing) and none is starved."""
    scheduler = _scheduler(8, max_num_seqs=4, max_num_batched_tokens=16)
    requests = create_requests(num_requests=4, num_tokens=3, max_tokens=30)
    _prefill(scheduler, requests)
    sched_output = scheduler.schedule()
    assert sched_output.multi_step_window
    assert sched_output.num_scheduled_tokens == {r.request_id: 4 for r in requests}


def test_no_position_past_max_tokens_while_a_window_is_in_flight():
    """Upstream's async check allows one more step when one token is in
    flight; with a window in flight, the next (single) step must not schedule
    a position past max_tokens either."""
    scheduler = _scheduler(4, async_scheduling=True)
    req0, req1 = create_requests(num_requests=2, num_tokens=10, max_tokens=3)
    scheduler.add_request(req0)
    prefill = scheduler.schedule()
    window = scheduler.schedule()
    assert window.num_scheduled_tokens == {req0.request_id: 2}  # tokens 2 and 3
    scheduler.add_request(req1)
    single = scheduler.schedule()  # a prefill arrives: a single step
    assert not single.multi_step_window
    assert single.num_scheduled_tokens == {req1.request_id: 10}
    for sched_output in (prefill, window, single):
        scheduler.update_from_output(sched_output, _output(sched_output))
    assert list(req0.output_token_ids) == [TOKEN] * 3


def test_window_drafts_are_counted_up_to_max_tokens():
    """A worker that cannot see a request's output count (Model Runner V2 under
    async scheduling) runs its window on past max_tokens; the steps a single
    step engine would not have run add no drafts to the metrics, nor do steps
    without drafts."""
    scheduler = _scheduler(4)
    (request,) = create_requests(num_requests=1, num_tokens=10, max_tokens=6)
    _prefill(scheduler, [request])
    # Only the metrics' width: a CPU base without Triton refuses a drafter.
    scheduler.num_spec_tokens = 3
    assert request.num_output_tokens == 1  # 5 tokens left
    # (drafts, accepted) per step: 1 token, 1 without drafts, 2, then 3 (the
    # 5th among them), then a step that started past max_tokens.
    counts = [(3, 0), (0, 0), (3, 1), (3, 2), (3, 3)]
    stats = scheduler.multi_step.settle(request, 11, [TOKEN] * 11, counts, None)
    counted = (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
    assert counted == (3, 9, 3)


class _Grammar:
    """A grammar that takes every token and records them (the engine core's
    copy, as update_from_output advances it)."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        self.accepted.extend(tokens)
        return True

    def is_terminated(self) -> bool:
        return False


def _structured_requests(num_requests: int, **kwargs) -> list[Request]:
    params = SamplingParams(
        max_tokens=16, structured_outputs=StructuredOutputsParams(regex="[0-9]+")
    )
    requests = create_requests(
        num_requests=num_requests, sampling_params=params, **kwargs
    )
    for request in requests:
        assert request.structured_output_request is not None
        request.structured_output_request.grammar = _Grammar()
    return requests


@pytest.mark.skipif(
    not MODEL_RUNNER_V2, reason="windows hold structured output on Model Runner V2"
)
@pytest.mark.parametrize("grammar_windows", [True, False])
def test_structured_output_requests_run_in_windows(grammar_windows):
    """A batch with a structured-output request runs windows (the worker masks
    their inner steps), and the engine core's grammar takes every window token;
    where windows do not hold them, single steps."""
    scheduler = _scheduler(4)
    scheduler.multi_step.grammar_windows = grammar_windows
    (plain,) = create_requests(num_requests=1, req_ids=["plain"])
    (structured,) = _structured_requests(1, req_ids=["structured"])
    _prefill(scheduler, [plain, structured])
    sched_output = scheduler.schedule()
    assert sched_output.has_structured_output_requests
    if not grammar_windows:
        assert not sched_output.multi_step_window
        return
    assert sched_output.multi_step_window == 4
    assert sched_output.num_scheduled_tokens == {"plain": 4, "structured": 4}
    scheduler.update_from_output(sched_output, _output(sched_output))
    grammar = structured.structured_output_request.grammar
    assert grammar.accepted == [TOKEN] * 5  # its first token, then the window's


@pytest.mark.skipif(
    not MODEL_RUNNER_V2, reason="windows hold structured output on Model Runner V2"
)
def test_the_worker_masks_step_one_once_its_copy_followed_a_window():
    """Under async scheduling a window whose structured request has tokens in
    flight is sampled only after the window before is processed, unless the
    worker's copy of its grammar followed it through a window: then the
    worker masks its step 1 and the engine core need not wait."""
    scheduler = _scheduler(4, async_scheduling=True)
    (plain,) = create_requests(num_requests=1, req_ids=["plain"])
    (structured,) = _structured_requests(1, req_ids=["structured"])
    _prefill(scheduler, [plain, structured])

    def followed(window, req_ids):
        output = _output(window)
        output.multi_step_grammars = req_ids
        scheduler.update_from_output(window, output)

    first = scheduler.schedule()  # nothing in flight: the engine core masks
    assert first.multi_step_window and not first.pending_structured_output_tokens
    assert first.multi_step_worker_masks is None
    second = scheduler.schedule()  # the first in flight, no copy known yet
    assert second.multi_step_window and second.pending_structured_output_tokens
    assert second.multi_step_worker_masks is None
    followed(first, ["structured"])
    third = scheduler.schedule()
    assert third.multi_step_window
    assert third.multi_step_worker_masks == ["structured"]
    assert not third.pending_structured_output_tokens
    followed(second, [])  # its copy did not follow the second window
    fourth = scheduler.schedule()
    assert fourth.multi_step_window and fourth.pending_structured_output_tokens
    assert fourth.multi_step_worker_masks is None


@pytest.mark.skipif(
    not MODEL_RUNNER_V2, reason="windows hold structured output on Model Runner V2"
)
def test_reasoning_state_goes_to_the_worker_with_a_new_request():
    """The worker's copy of a grammar starts where the engine core's request
    stands with reasoning (the frontend may have ended it already)."""
    scheduler = _scheduler(4, joins=True)
    (plain,) = create_requests(num_requests=1, req_ids=["plain"])
    ended, reasoning = _structured_requests(2, req_ids=["ended", "reasoning"])
    ended.structured_output_request.reasoning_ended = True
    reasoning.structured_output_request.reasoning_parser_kwargs = {"effort": "low"}
    _prefill_and_settle(scheduler, [plain])
    scheduler.add_request(ended)
    scheduler.add_request(reasoning)
    window = scheduler.schedule()
    assert window.multi_step_window  # the structured requests join it
    assert window.multi_step_reasoning == {
        "ended": (True, None),
        "reasoning": (None, {"effort": "low"}),
    }
    scheduler.update_from_output(window, _worker_output(window))
    assert scheduler.schedule().multi_step_reasoning is None


@pytest.mark.skipif(
    not MODEL_RUNNER_V2, reason="windows hold structured output on Model Runner V2"
)
def test_a_window_waits_for_grammar_tokens_only_in_flight():
    """Under async scheduling the engine core defers a step's grammar bitmask
    while tokens of a structured-output request are in flight, and it must
    find a step to wait for: a window's own placeholders are not such tokens
    (the engine died popping an empty batch queue when they were)."""
    scheduler = _scheduler(4, async_scheduling=True)
    (structured,) = _structured_requests(1)
    scheduler.add_request(structured)
    prefill = scheduler.schedule()
    scheduler.update_from_output(prefill, _output(prefill))
    window = scheduler.schedule()  # nothing in flight
    assert window.multi_step_window
    assert not window.pending_structured_output_tokens
    second = scheduler.schedule()  # planned while the first window is in flight
    assert second.pending_structured_output_tokens
    for sched_output in (window, second):
        scheduler.update_from_output(sched_output, _output(sched_output))
    assert structured.num_output_placeholders == 0
