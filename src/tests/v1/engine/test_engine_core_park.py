# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""With multi-step windows the engine core waits for a step's output parked."""

from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from vllm.config.multi_step import ENGINE_CORE_PARK_KEY, engine_core_parks
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


def test_the_engine_core_blocks_on_the_output_without_spinning():
    core = engine_core()
    future = mock.Mock()
    future.poll.side_effect = AssertionError("spun on the output")
    future.result.return_value = "output"
    assert EngineCoreProc._wait_for_output(core, future) == "output"
    future.wait_briefly.assert_not_called()
