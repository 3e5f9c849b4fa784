# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""With multi-step windows, the engine core waits for a step's output parked.

Upstream's `EngineCoreProc._wait_for_output` spins on the workers' response
queues (yielding the CPU between looks, for up to a second) while a step runs,
to take in requests that arrive meanwhile and to see the output the moment it
is written. A window is a long step, so the engine core spun through all of
it: 0.6-0.8 of a core on a 2-core host, taken from the API server and the
worker. Here it blocks on the output, as upstream does once a step has run for
a second, and its readers of the response queues park as soon as they find
nothing to read, to be woken through their pipes (shm_wakeup.py).

Requests that arrive meanwhile are taken in after the step, as upstream takes
them in after a long one. A window still yields to them at once: the engine
core's input thread counts each arrival for the worker (arrivals.py).

On by default on CPU, where it was measured (docs/benchmarks.md); the
additional_config key `multi_step_engine_core_parks` sets it.
"""

from typing import Any

from vllm.config.multi_step import engine_core_parks

# Set on the engine core once it has decided.
_PARKS_ATTR = "_multi_step_parks"


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
