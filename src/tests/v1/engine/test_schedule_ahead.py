# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Async scheduling on a CPU waits for a step in flight that prefills long
prompts before it schedules the next (vllm/v1/engine/schedule_ahead.py), so a
request arriving meanwhile is not made to wait for one more step."""

from collections import deque
from concurrent.futures import Future
from types import SimpleNamespace
from unittest import mock

import pytest

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import schedule_ahead
from vllm.v1.engine.core import EngineCore
from vllm.v1.engine.schedule_ahead import ScheduleAhead, prompt_tokens
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

from ..core.utils import create_requests, create_scheduler

BUDGET = 256


def chunked_scheduler(prompt_len: int = 600):
    """An async scheduler holding one prompt that prefills in chunks of 256."""
    scheduler = create_scheduler(
        max_num_batched_tokens=BUDGET, async_scheduling=True, max_model_len=2048
    )
    (request,) = create_requests(num_requests=1, num_tokens=prompt_len)
    scheduler.add_request(request)
    return scheduler


def in_flight(output: SchedulerOutput) -> deque:
    return deque([(Future(), output, Future())])


def test_prompt_tokens_of_each_chunk_and_none_after():
    scheduler = chunked_scheduler()
    counts = [
        prompt_tokens(scheduler, scheduler.schedule(), enough=10**6) for _ in range(4)
    ]
    # Three chunks (256, 256, 88), then the first decode step (async: no
    # output needed to schedule it).
    assert counts == [256, 256, 88, 0]


def test_prompt_tokens_stop_counting_at_enough():
    scheduler = create_scheduler(async_scheduling=True)
    for request in create_requests(num_requests=2, num_tokens=300):
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert prompt_tokens(scheduler, output, enough=10**6) == 600
    assert prompt_tokens(scheduler, output, enough=10) == 300


@pytest.mark.parametrize(
    ("limit", "expected"), [(None, False), (256, True), (257, False), (88, True)]
)
def test_waits_for_a_step_that_prefills_at_least_the_limit(limit, expected):
    scheduler = chunked_scheduler()
    policy = ScheduleAhead(limit)
    assert policy.waits(scheduler, in_flight(scheduler.schedule())) is expected


def test_never_waits_with_nothing_or_two_steps_in_flight():
    scheduler = chunked_scheduler()
    policy = ScheduleAhead(1)
    first, second = scheduler.schedule(), scheduler.schedule()
    assert not policy.waits(scheduler, deque())
    assert not policy.waits(scheduler, in_flight(first) + in_flight(second))


def test_never_waits_while_a_request_waits_to_be_admitted():
    scheduler = chunked_scheduler()
    output = scheduler.schedule()
    policy = ScheduleAhead(1)
    assert policy.waits(scheduler, in_flight(output))
    (late,) = create_requests(num_requests=1, num_tokens=8, req_ids=["late"])
    scheduler.add_request(late)
    assert not policy.waits(scheduler, in_flight(output))


def test_never_waits_after_a_decode_step():
    scheduler = chunked_scheduler(prompt_len=100)
    policy = ScheduleAhead(1)
    assert policy.waits(scheduler, in_flight(scheduler.schedule()))
    assert not policy.waits(scheduler, in_flight(scheduler.schedule()))


def config(additional=None, async_scheduling=True, pipeline_parallel_size=1):
    return SimpleNamespace(
        additional_config=additional if additional is not None else {},
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        parallel_config=SimpleNamespace(pipeline_parallel_size=pipeline_parallel_size),
    )


def test_the_limit_from_additional_config():
    key = schedule_ahead.PROMPT_TOKENS_KEY
    assert schedule_ahead.prompt_tokens_limit(config()) == 256
    assert schedule_ahead.prompt_tokens_limit(config({key: 1024})) == 1024
    assert schedule_ahead.prompt_tokens_limit(config({key: False})) is None


@pytest.mark.parametrize("value", [0, -5, True, "256", 2.5, None])
def test_a_bad_limit_is_refused_with_the_key(value):
    key = schedule_ahead.PROMPT_TOKENS_KEY
    with pytest.raises(ValueError, match=key):
        schedule_ahead.prompt_tokens_limit(config({key: value}))


@pytest.mark.parametrize(
    ("is_cpu", "kwargs", "expected"),
    [
        (True, {}, 256),
        (False, {}, None),  # no accelerator has run it
        (True, {"async_scheduling": False}, None),
        (True, {"pipeline_parallel_size": 2}, None),
    ],
)
def test_only_the_async_queue_on_a_cpu(is_cpu, kwargs, expected, monkeypatch):
    monkeypatch.setattr(schedule_ahead.current_platform, "is_cpu", lambda: is_cpu)
    assert ScheduleAhead.create(config(**kwargs)).prompt_tokens == expected


def finished(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def engine_core(scheduler, limit: int | None):
    """An EngineCore with only what step_with_batch_queue reads: a real
    scheduler, an executor whose steps finish at once, a queue of two."""
    core = mock.MagicMock(spec=EngineCore)
    core.scheduler = scheduler
    core.batch_queue = deque(maxlen=2)
    core.batch_queue_size = 2
    core.is_mm_encoder_only = core.is_pooling_model = False
    core.check_for_draft_tokens = False
    core.schedule_ahead = ScheduleAhead(limit)
    core._should_throttle_prefills.return_value = False
    core.model_executor = mock.MagicMock()
    core.model_executor.execute_model.side_effect = lambda *a, **k: finished(None)
    core.model_executor.sample_tokens.side_effect = lambda *a, **k: finished(
        EMPTY_MODEL_RUNNER_OUTPUT
    )
    core._wait_for_output.side_effect = lambda future: future.result()
    scheduler.update_from_output = mock.MagicMock(return_value={})
    return core


@pytest.mark.parametrize(("limit", "scheduled"), [(None, 2), (BUDGET, 1)])
def test_step_with_batch_queue_asks_before_it_schedules(limit, scheduled):
    """The hook in core.py: with a chunk of 256 prompt tokens in flight, the
    engine core schedules the next step at once (upstream) or first takes the
    step in flight's output (a request arriving then joins the next step)."""
    scheduler = chunked_scheduler()
    core = engine_core(scheduler, limit)
    with mock.patch.object(scheduler, "schedule", wraps=scheduler.schedule) as schedule:
        EngineCore.step_with_batch_queue(core)  # schedules the first chunk
        EngineCore.step_with_batch_queue(core)
    assert schedule.call_count == scheduled
    # Either way the step in flight's output was taken in the second call.
    assert scheduler.update_from_output.call_count == 1
