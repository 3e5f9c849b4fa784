# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""With multi-step windows the engine core waits for a step's output parked."""

import collections
import queue
import threading
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from vllm.config.multi_step import ENGINE_CORE_PARK_KEY, engine_core_parks
from vllm.v1.engine import EngineCoreRequestType
from vllm.v1.engine.core import EngineCoreProc
from vllm.v1.engine.engine_core_park import waits_parked


def engine_core(
    steps: int = 8,
    device: str = "cpu",
    additional: dict | None = None,
    readers: int | None = 2,
) -> Any:
    """An engine core's attributes as waits_parked reads them; `readers`
    response queues (None: an executor without them)."""
    vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(num_scheduler_steps=steps),
        device_config=SimpleNamespace(device_type=device),
        additional_config=additional or {},
    )
    executor = SimpleNamespace()
    if readers is not None:
        executor.response_mqs = [
            SimpleNamespace(
                _spin_condition=SimpleNamespace(is_reader=True, busy_loop_s=1)
            )
            for _ in range(readers)
        ]
    return SimpleNamespace(vllm_config=vllm_config, model_executor=executor)


def busy_loops(core: Any) -> list[float]:
    return [q._spin_condition.busy_loop_s for q in core.model_executor.response_mqs]


def test_with_windows_on_cpu_the_response_readers_park_at_once():
    core = engine_core()
    assert waits_parked(core)
    assert busy_loops(core) == [0, 0]
    # Decided once: the executor is not read again.
    core.model_executor = None
    assert waits_parked(core)


@pytest.mark.parametrize(
    "core",
    [
        engine_core(steps=1),  # no windows: upstream's wait
        engine_core(additional={ENGINE_CORE_PARK_KEY: False}),
        engine_core(device="cuda"),  # not measured there: off unless asked
    ],
    ids=["N1", "turned-off", "not-measured-device"],
)
def test_upstream_spin_stays(core: Any):
    assert not waits_parked(core)
    assert busy_loops(core) == [1, 1]


def test_asked_for_on_another_device():
    core = engine_core(device="cuda", additional={ENGINE_CORE_PARK_KEY: True})
    assert waits_parked(core)
    assert busy_loops(core) == [0, 0]


def test_an_executor_without_response_queues_keeps_upstream_wait():
    assert not waits_parked(engine_core(readers=None))
    assert not waits_parked(engine_core(readers=0))


def test_a_value_of_the_wrong_type_is_refused_naming_the_key():
    core = engine_core(additional={ENGINE_CORE_PARK_KEY: "yes"})
    with pytest.raises(ValueError, match=ENGINE_CORE_PARK_KEY):
        engine_core_parks(core.vllm_config)


class Output:
    """An executor's future whose result() blocks until the test releases it
    (`release`), or raises `error`."""

    def __init__(self, value: Any = "output", error: BaseException | None = None):
        self.value, self.error = value, error
        self.released = threading.Event()
        self.poll = mock.Mock(side_effect=AssertionError("spun on the output"))
        self.wait_briefly = mock.Mock(side_effect=AssertionError("spun"))

    def release(self) -> None:
        self.released.set()

    def result(self) -> Any:
        assert self.released.wait(10), "the test never released the output"
        if self.error is not None:
            raise self.error
        return self.value


def parked_core() -> Any:
    """An engine core that waits parked, with upstream's input queue and
    deferred inputs; `handled` records the inputs it handled, in order."""
    core = engine_core()
    core.input_queue = queue.Queue()
    core._deferred_inputs = collections.deque()
    core.handled = []
    core._handle_client_request = lambda *req: core.handled.append(req)
    return core


ADD, ABORT, UTILITY = (
    EngineCoreRequestType.ADD,
    EngineCoreRequestType.ABORT,
    EngineCoreRequestType.UTILITY,
)


def test_the_engine_core_waits_for_the_output_without_spinning():
    core, output = parked_core(), Output()
    output.release()
    assert EngineCoreProc._wait_for_output(core, output) == "output"
    assert core.handled == [] and not core._deferred_inputs


def test_requests_that_arrive_during_the_step_are_added_before_it_ends():
    core, output = parked_core(), Output()

    def handle(*req: Any) -> None:
        core.handled.append(req)
        if len(core.handled) == 2:
            output.release()  # the step ends only after both were added

    core._handle_client_request = handle
    core.input_queue.put((ADD, "a"))
    core.input_queue.put((ABORT, "b"))
    assert EngineCoreProc._wait_for_output(core, output) == "output"
    assert core.handled == [(ADD, "a"), (ABORT, "b")]


def test_inputs_from_the_first_one_deferred_on_wait_for_the_step_in_order():
    core, output = parked_core(), Output()
    for req in [(ADD, "a"), (UTILITY, "u"), (ADD, "b")]:
        core.input_queue.put(req)
    threading.Timer(0.2, output.release).start()
    assert EngineCoreProc._wait_for_output(core, output) == "output"
    assert core.handled == [(ADD, "a")]
    assert list(core._deferred_inputs) == [(UTILITY, "u"), (ADD, "b")]


def test_an_error_of_the_step_is_raised_in_the_engine_core():
    core, output = parked_core(), Output(error=RuntimeError("worker died"))
    output.release()
    with pytest.raises(RuntimeError, match="worker died"):
        EngineCoreProc._wait_for_output(core, output)


def test_one_waiter_thread_serves_every_step():
    core = parked_core()
    threads = threading.active_count()
    for step in range(3):
        output = Output(value=step)
        output.release()
        assert EngineCoreProc._wait_for_output(core, output) == step
    assert threading.active_count() == threads + 1
