# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode's share of generated tokens (vllm:multi_step_* metrics):
the scheduler's counts by the kind of step that made each token, and the stat
logger that puts them on /metrics and in the periodic log; and the arrival
count each window carries (the worker yields to later arrivals:
tests/v1/worker/test_multi_step_window.py)."""

from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from tests.v1.core.test_multi_step_scheduler import _output, _prefill, _scheduler
from tests.v1.core.utils import create_requests
from vllm.v1.core.sched.arrivals import ArrivalReader
from vllm.v1.metrics import multi_step_logger
from vllm.v1.metrics.multi_step_logger import MultiStepStatLogger, describe
from vllm.v1.metrics.multi_step_stats import MultiStepStats, SingleStepReason
from vllm.v1.metrics.stats import SchedulerStats

pytestmark = pytest.mark.cpu_test


class Counts:
    """The multi-step counts the scheduler sends with its stats, step by step
    (each step's outputs carry what the steps since the last stats made)."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.stats = MultiStepStats()

    def step(self, tokens=None, yielded: bool = False):
        sched_output = self.scheduler.schedule()
        output = _output(sched_output, tokens)
        output.multi_step_yielded = yielded
        engine_outputs = self.scheduler.update_from_output(sched_output, output)
        for outputs in engine_outputs.values():
            if outputs.scheduler_stats is not None:
                self.stats.merge(outputs.scheduler_stats.multi_step)
        return sched_output


def test_tokens_are_counted_by_the_step_that_made_them():
    scheduler = _scheduler(4)
    counts = Counts(scheduler)
    for request in create_requests(num_requests=2, num_tokens=10, max_tokens=16):
        scheduler.add_request(request)
    counts.step()  # admits both: 2 tokens
    for _ in range(2):  # two windows of 4 steps: 16 tokens
        assert counts.step().multi_step_window == 4
    # a request arrives: its prompt and the others' next tokens in one step
    (late,) = create_requests(
        num_requests=1, num_tokens=10, max_tokens=16, req_ids=["late"]
    )
    scheduler.add_request(late)
    counts.step()
    assert counts.stats.num_generated_tokens == {"arrival": 2 + 3, "window": 16}
    assert (counts.stats.num_windows, counts.stats.num_windows_yielded) == (2, 0)
    # handed over with the step's stats: the next stats start from zero
    assert scheduler.make_stats().multi_step == MultiStepStats()


def test_a_yielded_window_is_counted():
    scheduler = _scheduler(4)
    _prefill(scheduler, create_requests(num_requests=1, num_tokens=10, max_tokens=16))
    counts = Counts(scheduler)
    counts.step({"0": [1, 1]}, yielded=True)
    assert counts.stats.num_generated_tokens == {"window": 2}
    assert (counts.stats.num_windows, counts.stats.num_windows_yielded) == (1, 1)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (
            {"max_num_batched_tokens": 8, "max_num_seqs": 8},
            SingleStepReason.TOKEN_BUDGET,
        ),
        ({}, SingleStepReason.RESUMABLE),
    ],
)
def test_single_steps_say_why(kwargs, reason):
    scheduler = _scheduler(4, **kwargs)
    requests = create_requests(
        num_requests=8 if kwargs else 1, num_tokens=1, max_tokens=16
    )
    if reason is SingleStepReason.RESUMABLE:
        requests[0].resumable = True  # a streaming-input session
    _prefill(scheduler, requests)
    counts = Counts(scheduler)
    assert not counts.step().multi_step_window
    assert counts.stats.num_generated_tokens == {reason.value: len(requests)}


def test_windows_carry_the_arrivals_the_engine_core_had_seen():
    scheduler = _scheduler(4)
    _prefill(scheduler, create_requests(num_requests=1, num_tokens=10, max_tokens=16))
    arrivals = scheduler.multi_step.arrivals
    arrivals.arrived()
    arrivals.seen()
    sched_output = scheduler.schedule()
    assert sched_output.multi_step_arrivals == (arrivals.name, 1)
    reader = ArrivalReader()
    assert not reader.since(*sched_output.multi_step_arrivals)
    arrivals.arrived()  # the input thread received one more
    assert reader.since(*sched_output.multi_step_arrivals)


def _config(num_steps: int):
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(num_scheduler_steps=num_steps),
        model_config=SimpleNamespace(served_model_name="tiny"),
    )


def _sample(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(
        name, {"model_name": "tiny", "engine": "0", **labels}
    )


def test_the_logger_publishes_counters_and_logs_the_share(monkeypatch):
    assert MultiStepStatLogger.create(_config(1), [0]) == []
    (stat_logger,) = MultiStepStatLogger.create(_config(8), [0])
    stats = MultiStepStats()
    stats.add_window(30, yielded=True)
    stats.add_window(30, yielded=False)
    stats.add_single_step(SingleStepReason.ARRIVAL, 20)
    stats.add_single_step(SingleStepReason.STRUCTURED_OUTPUT, 20)
    stat_logger.record(SchedulerStats(multi_step=stats), None)
    stat_logger.record(SchedulerStats(), None)  # a step without windows' counts
    tokens = "vllm:multi_step_generation_tokens_total"
    assert _sample(tokens, reason="window") == 60
    assert _sample(tokens, reason="arrival") == 20
    assert _sample(tokens, reason="prefill") == 0
    assert _sample("vllm:multi_step_windows_total") == 2
    assert _sample("vllm:multi_step_windows_yielded_total") == 1
    lines: list[str] = []
    monkeypatch.setattr(
        multi_step_logger.logger, "info", lambda msg, *args: lines.append(msg % args)
    )
    stat_logger.log()
    stat_logger.log()  # nothing new: no line
    assert lines == [
        "Engine 000: Multi-step decode: 60.0% of generated tokens in windows "
        "(2 windows, 1 yielded to arrivals); single steps: structured_output "
        "20.0%, arrival 20.0%"
    ]
    # A second engine in this process starts its counters from zero.
    MultiStepStatLogger.create(_config(8), [0])
    assert _sample(tokens, reason="window") == 0


def test_describe_says_nothing_without_tokens():
    assert describe(MultiStepStats()) == ""
