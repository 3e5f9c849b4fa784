# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A window yields to a request that arrives while it runs: it ends after the
inner step in flight, as a stop would end it, and the engine core admits the
request at its next schedule (vllm/v1/core/sched/arrivals.py).

Tokens stay those of single steps however a window is cut: Model Runner V2
keys each draw by seed and position. What changes is where the next step
starts: under async scheduling the engine planned it before it saw the cut,
from the positions the window was given (`CutWindows`).
"""

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from vllm.v1.core.sched.arrivals import ArrivalReader
from vllm.v1.core.sched.output import SchedulerOutput

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.worker.gpu.multi_step.window_requests import WindowRequests


class ArrivalWatch:
    """Whether a window should end now because a request arrived. With tensor
    parallelism every rank must end the same window at the same step: the
    ranks take the largest of their answers (a CPU all-reduce per inner step
    of a window planned where arrivals are counted)."""

    def __init__(self, vllm_config: "VllmConfig") -> None:
        self._reader = ArrivalReader()
        self._tp = vllm_config.parallel_config.tensor_parallel_size > 1

    def arrived(self, window: SchedulerOutput) -> bool:
        planned_at = window.multi_step_arrivals
        if planned_at is None:
            return False
        arrived = self._reader.since(*planned_at)
        if not self._tp:
            return arrived
        from vllm.distributed.parallel_state import get_tp_group

        flag = torch.tensor([int(arrived)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=get_tp_group().cpu_group)
        return bool(flag.item())


class CutWindows:
    """Requests that left a window before the positions it gave them, without
    stopping, and where they really are.

    The scheduler gives those positions back when it sees the window's output
    (settle); a step it planned before that (async scheduling) still counts
    them as computed. The runner takes a request's computed count from the
    scheduler's output (StandaloneCPUModelRunner's state holds that count
    itself), so the worker puts the true count in that step's output.
    """

    def __init__(self) -> None:
        # req_id -> (computed count the scheduler planned, the true one)
        self._cut: dict[str, tuple[int, int]] = {}

    def record(
        self,
        window: SchedulerOutput,
        requests: "WindowRequests",
        merged: "ModelRunnerOutput",
    ) -> None:
        """Note the requests a window without drafts left short."""
        self._cut = {}
        if window.scheduled_spec_decode_tokens:
            return  # the runner places drafted steps from its own state
        for req_id, tokens in zip(merged.req_ids, merged.sampled_token_ids):
            if tokens:
                planned, true = requests.computed_after(req_id, len(tokens))
                if true < planned:
                    self._cut[req_id] = (planned, true)

    def correct(self, scheduler_output: SchedulerOutput) -> SchedulerOutput:
        """The step after a window, with the true computed count of each
        request the scheduler counted past it."""
        cut, self._cut = self._cut, {}
        cached = scheduler_output.scheduled_cached_reqs
        if not cut or not cached.req_ids:
            return scheduler_output
        counts = list(cached.num_computed_tokens)
        changed = False
        for i, req_id in enumerate(cached.req_ids):
            assumed, true = cut.get(req_id, (-1, -1))
            if counts[i] == assumed:
                counts[i] = true
                changed = True
        if not changed:
            return scheduler_output
        return replace(
            scheduler_output,
            scheduled_cached_reqs=replace(cached, num_computed_tokens=counts),
        )
