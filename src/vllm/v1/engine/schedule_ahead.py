# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Async scheduling on a CPU: no step is scheduled ahead of a long prefill.

Under async scheduling the engine core schedules step i+1 as soon as it has
handed step i to the worker (`EngineCore.step_with_batch_queue`), so a request
that arrives while step i runs is scheduled into step i+2 at the earliest: it
waits for all of step i+1, a step upstream's CPU engine (async scheduling off)
does not make it wait for. While steps are short that step is the price of
hiding the engine core's work between steps; a step that prefills long prompts
costs many times that work, and the request that arrives meanwhile pays it
(served long prompts at 64 req/s: median time to first token 1.24x-1.31x
upstream's, docs/benchmarks.md). So while the step in flight prefills at least
`async_schedule_ahead_prompt_tokens` prompt tokens and no request waits to be
admitted, the engine core waits for that step before it schedules the next,
which a request arriving meanwhile then joins, as in upstream's CPU loop.
Tokens do not change: only when a step is scheduled does.
"""

from collections.abc import Sized
from typing import TYPE_CHECKING, Any

from vllm.platforms import current_platform

if TYPE_CHECKING:
    from vllm.config.vllm import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler

# additional_config key: the prompt tokens a step in flight prefills from which
# the engine core does not schedule ahead of it; false: it always does
# (upstream's async scheduling).
PROMPT_TOKENS_KEY = "async_schedule_ahead_prompt_tokens"
# Measured on a tiny Llama on 2 cores (docs/benchmarks.md, "Scheduling ahead").
DEFAULT_PROMPT_TOKENS = 256


class ScheduleAhead:
    """Whether the engine core schedules a step while one is in flight."""

    def __init__(self, prompt_tokens: int | None) -> None:
        # None: always (upstream's async scheduling; and every synchronous or
        # pipeline-parallel batch queue, which this does not touch).
        self.prompt_tokens = prompt_tokens

    @classmethod
    def create(cls, vllm_config: "VllmConfig") -> "ScheduleAhead":
        limit = prompt_tokens_limit(vllm_config)
        # Only the queue of two that async scheduling makes, and only on a CPU,
        # where upstream itself runs without async scheduling (patch 0003 turns
        # it on): no accelerator has run this.
        if (
            not current_platform.is_cpu()
            or not vllm_config.scheduler_config.async_scheduling
            or vllm_config.parallel_config.pipeline_parallel_size > 1
        ):
            limit = None
        return cls(limit)

    def waits(self, scheduler: "Scheduler", batch_queue: Sized) -> bool:
        """True: do not schedule now; wait for the step in flight first."""
        if self.prompt_tokens is None or len(batch_queue) != 1:
            return False
        if scheduler.waiting:
            # A request arriving now queues behind these whenever it comes.
            return False
        _, in_flight, _ = next(iter(batch_queue))  # type: ignore[call-overload]
        return prompt_tokens(scheduler, in_flight, self.prompt_tokens) >= (
            self.prompt_tokens
        )


def prompt_tokens_limit(vllm_config: "VllmConfig") -> int | None:
    """The configured limit (None: schedule ahead always); ValueError if bad."""
    additional: Any = vllm_config.additional_config
    if not isinstance(additional, dict) or PROMPT_TOKENS_KEY not in additional:
        return DEFAULT_PROMPT_TOKENS
    value = additional[PROMPT_TOKENS_KEY]
    if value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"additional_config['{PROMPT_TOKENS_KEY}'] must be an integer >= 1 "
            "(the prompt tokens a step in flight prefills from which no step "
            f"is scheduled ahead of it) or false (always), got {value!r}."
        )
    return value


def prompt_tokens(
    scheduler: "Scheduler", scheduler_output: "SchedulerOutput", enough: int
) -> int:
    """The prompt tokens `scheduler_output` prefills, counted up to `enough`.

    The scheduler advanced each request's computed tokens when it scheduled
    the step, so the step started at num_computed_tokens - num_scheduled.
    """
    total = 0
    for req_id, num_scheduled in scheduler_output.num_scheduled_tokens.items():
        request = scheduler.requests.get(req_id)
        if request is None:
            continue
        start = request.num_computed_tokens - num_scheduled
        total += max(0, min(num_scheduled, request.num_prompt_tokens - start))
        if total >= enough:
            break
    return total
