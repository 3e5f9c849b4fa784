# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""With multi-step windows, the engine core waits for a step's output parked.

Upstream's `EngineCoreProc._wait_for_output` spins on the workers' response
queues (yielding the CPU between looks, for up to a second) while a step runs,
to take in requests that arrive meanwhile and to see the output the moment it
is written. A window is a long step, so the engine core spun through all of
it: 0.6-0.8 of a core on a 2-core host, taken from the API server and the
worker. Here it waits without spinning, and its readers of the response queues
park as soon as they find nothing to read, to be woken through their pipes
(shm_wakeup.py).

Requests that arrive meanwhile are still taken in during the step, as
upstream's spin takes them in: the engine core blocks on its input queue, not on
the output, and a thread of its own waits for the output and hands it to that
queue. So an arrival wakes the engine core, which adds the request while the
window runs (the window yields to it at its next inner step: the input thread
counts each arrival for the worker, arrivals.py), and the output wakes it too.
Blocking on the output alone left arrivals for after the step and raised the
median time to first token of requests sent all at once (docs/benchmarks.md).

On by default on CPU, where it was measured (docs/benchmarks.md); the
additional_config key `multi_step_engine_core_parks` sets it.
"""

import queue
import threading
from collections.abc import Container
from concurrent.futures import Future
from typing import Any

from vllm.config.multi_step import engine_core_parks

# Set on the engine core once it has decided, and at its first parked wait.
_PARKS_ATTR = "_multi_step_parks"
_WAITER_ATTR = "_multi_step_output_waiter"


class _OutputReady:
    """The request type of the input queue's entry that carries a step's
    output (a Future) from the waiter thread."""


OUTPUT_READY = _OutputReady()


def waits_parked(engine_core: Any) -> bool:
    """Whether `engine_core` (an EngineCoreProc) waits for a step's output
    parked; decided at its first step, its response readers set to park then."""
    parks = getattr(engine_core, _PARKS_ATTR, None)
    if parks is None:
        parks = _start_parking(engine_core)
        setattr(engine_core, _PARKS_ATTR, parks)
    return parks


def _start_parking(engine_core: Any) -> bool:
    if not engine_core_parks(engine_core.vllm_config):
        return False
    # The multiprocessing executor's local readers; another executor's step
    # has no queue to spin on, and keeps upstream's wait.
    conditions = [
        getattr(queue, "_spin_condition", None)
        for queue in getattr(engine_core.model_executor, "response_mqs", ())
    ]
    readers = [c for c in conditions if c is not None and c.is_reader]
    if not readers or len(readers) != len(conditions):
        return False
    for condition in readers:
        condition.busy_loop_s = 0  # park at the first look that finds nothing
    return True


def wait_parked(
    engine_core: Any, future: Future[Any], handled_during_step: Container[Any]
) -> Any:
    """The step's output, once `future` (the executor's) has it. Meanwhile the
    engine core handles each input of a type in `handled_during_step` as it
    arrives, as upstream's spin does, and defers the rest, with every input
    after the first it defers, to after the step."""
    waiter = getattr(engine_core, _WAITER_ATTR, None)
    if waiter is None:
        waiter = OutputWaiter(engine_core.input_queue)
        setattr(engine_core, _WAITER_ATTR, waiter)
    waiter.wait_for(future)
    deferred = engine_core._deferred_inputs
    while True:
        request_type, payload = engine_core.input_queue.get()
        if request_type is OUTPUT_READY:
            return payload.result()
        if not deferred and request_type in handled_during_step:
            engine_core._handle_client_request(request_type, payload)
        else:
            deferred.append((request_type, payload))


class OutputWaiter:
    """A thread that waits for each step's output in the engine core's stead
    (its readers park, woken through their pipes) and puts it on the engine
    core's input queue, where the engine core is blocked."""

    def __init__(self, input_queue: "queue.Queue[tuple[Any, Any]]") -> None:
        self._input_queue = input_queue
        self._futures: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()
        threading.Thread(
            target=self._run, name="EngineCoreOutputWaiter", daemon=True
        ).start()

    def wait_for(self, future: Future[Any]) -> None:
        self._futures.put(future)

    def _run(self) -> None:
        while True:
            future = self._futures.get()
            ready: Future[Any] = Future()
            try:
                ready.set_result(future.result())
            except BaseException as e:  # raised in the engine core's thread
                ready.set_exception(e)
            self._input_queue.put_nowait((OUTPUT_READY, ready))
