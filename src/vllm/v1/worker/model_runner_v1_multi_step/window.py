# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode, worker side: run a decode window as back-to-back steps.

The scheduler marks a window (`SchedulerOutput.multi_step_window`) and gives
each request the number of decode steps it may run
(vllm/v1/core/sched/multi_step.py). The worker runs the window through the
model runner's own single-step path, `execute_model` + `sample_tokens`, once per
step: step 1 is the scheduler's output with one token per request, each later
step a follow-up output for the requests still going, at the next position. So
every step gets exactly what a single-step schedule would give it: input ids
from the previous sample (on the device under async scheduling), positions,
slot mappings and attention metadata for that position, and penalties,
min_tokens, bad words, seeded generators and logprobs over the full token
history. The KV blocks for the whole window arrived with step 1.

A request leaves the window after its last planned step or when it samples a
stop token (EOS unless ignored, or one of its stop_token_ids); the window ends
when no request is left. Stops the worker cannot see (stop strings, repetition
detection) are found by the scheduler, which discards the tokens that follow.
The steps' outputs are merged into one ModelRunnerOutput with up to n tokens
(and logprob rows) per request.
"""

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from vllm.config.multi_step import device_window_options, runner_async_scheduling
from vllm.logger import init_logger
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.worker.model_runner_v1_multi_step.device_window import DeviceWindow
from vllm.v1.worker.model_runner_v1_multi_step.lean_step import LeanDecodeStep
from vllm.v1.worker.model_runner_v1_multi_step.spec_window import SpecDecodeWindow
from vllm.v1.worker.model_runner_v1_multi_step.steps import follow_up_step
from vllm.v1.worker.window_output import (
    merge_step_outputs,
    resolve_output,
    returned_like,
    stop_token_ids,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

logger = init_logger(__name__)
# The key of DecodeWindowRunner.paths for windows whose inner steps ran on the
# device; the other keys are the reasons a window ran step by step.
DEVICE_PATH = "device"


class DecodeWindowRunner:
    def __init__(self, worker: "WorkerBase", vllm_config: "VllmConfig") -> None:
        self.worker = worker
        # Inner steps on the device (device_window.py) where a window's
        # batch allows, and how often that loop looks for an early end.
        self._device_enabled, self._stop_check_interval = device_window_options(
            vllm_config
        )
        self._device_window: DeviceWindow | None = None
        # Windows per path: DEVICE_PATH, or the reason they ran step by step.
        self.paths: Counter[str] = Counter()
        # The window whose first step is executing, until it is sampled.
        self._window: SchedulerOutput | None = None
        self._first_step_req_ids: list[str] = []
        # Requests seen finishing: a stop token sampled, or a window shorter
        # than the others' (the scheduler cuts a window only at max_tokens or
        # max_model_len). Under async scheduling the next step is planned
        # before the scheduler learns of it; these requests sit it out.
        self._done: set[str] = set()
        self._lean_step: LeanDecodeStep | None = None
        self._spec_window: SpecDecodeWindow | None = None
        # With drafts the runner keeps its synchronous path under async
        # scheduling, and each step the engine planned is corrected first.
        self._corrects_optimistic_steps = bool(
            vllm_config.scheduler_config.async_scheduling
        ) and not runner_async_scheduling(vllm_config)

    @classmethod
    def create(
        cls, vllm_config: "VllmConfig", worker: "WorkerBase"
    ) -> "DecodeWindowRunner | None":
        if vllm_config.scheduler_config.num_scheduler_steps == 1:
            return None
        return cls(worker, vllm_config)

    @property
    def runner(self) -> "GPUModelRunner":
        return self.worker.model_runner

    @property
    def _lean(self) -> LeanDecodeStep:
        # The runner's model and KV cache exist only after worker start-up.
        if self._lean_step is None:
            self._lean_step = LeanDecodeStep(self.runner)
        return self._lean_step

    @property
    def _spec(self) -> "SpecDecodeWindow":
        if self._spec_window is None:
            self._spec_window = SpecDecodeWindow(self.runner)
        return self._spec_window

    @property
    def _device(self) -> DeviceWindow | None:
        if self._device_window is None and self._device_enabled:
            self._device_window = DeviceWindow(
                self.runner, self._lean, self._stop_check_interval
            )
        return self._device_window

    def _count_path(self, path: str) -> None:
        """Count a window's path; log the counts at 1, 2, 4, 8, ... windows,
        and each reason for the step-by-step path the first time it occurs."""
        if path != DEVICE_PATH and path not in self.paths:
            logger.info(
                "Multi-step decode: a window's inner steps run step by step "
                "(not covered on the device: %s).",
                path,
            )
        self.paths[path] += 1
        total = self.paths.total()
        if total & (total - 1) == 0:
            step_by_step = total - self.paths[DEVICE_PATH]
            reasons = ", ".join(
                f"{reason}: {count}"
                for reason, count in sorted(self.paths.items())
                if reason != DEVICE_PATH
            )
            logger.info(
                "Multi-step decode windows: %d, inner steps on the device in "
                "%d, step by step in %d%s.",
                total,
                self.paths[DEVICE_PATH],
                step_by_step,
                f" ({reasons})" if reasons else "",
            )

    def first_step(self, scheduler_output: SchedulerOutput) -> SchedulerOutput:
        """What the runner executes first: a window's step 1, or the step as is.

        Under async scheduling, a step planned before the scheduler learned
        that a request finished may still list it; the runner no longer holds
        it in its batch (it left its window), so it is dropped from the step.
        The scheduler ignores outputs for finished requests.
        """
        if self._corrects_optimistic_steps:
            scheduler_output = self._spec.correct_optimistic_step(scheduler_output)
        self._done -= scheduler_output.finished_req_ids
        self._done -= {r.req_id for r in scheduler_output.scheduled_new_reqs}
        self._done -= scheduler_output.scheduled_cached_reqs.resumed_req_ids
        window = scheduler_output.multi_step_window
        self._window = scheduler_output if window else None
        scheduled = scheduler_output.num_scheduled_tokens
        dropped = self._done.intersection(scheduled)
        if not window and not dropped:
            return scheduler_output
        spec = scheduler_output.scheduled_spec_decode_tokens
        counts = {
            req_id: 1 + len(spec.get(req_id, ())) if window else num_tokens
            for req_id, num_tokens in scheduled.items()
            if req_id not in dropped
        }
        self._first_step_req_ids = list(counts)
        return replace(
            scheduler_output,
            scheduled_cached_reqs=_without(
                scheduler_output.scheduled_cached_reqs, dropped
            ),
            num_scheduled_tokens=counts,
            total_num_scheduled_tokens=sum(counts.values()),
            scheduled_spec_decode_tokens={
                r: d for r, d in spec.items() if r not in dropped
            },
            multi_step_window=0,
        )

    def sample_tokens(
        self, grammar_output: "GrammarOutput | None"
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        runner = self.runner
        window, self._window = self._window, None
        first = runner.sample_tokens(grammar_output)
        if window is None:
            return first
        if self.runner.speculative_config is not None:
            steps, spec_counts, finished = self._spec.run(
                window, resolve_output(first), self._first_step_req_ids
            )
            self._done |= finished
            return replace(
                merge_step_outputs(steps), multi_step_spec_counts=spec_counts
            )
        cached = window.scheduled_cached_reqs
        start = dict(zip(cached.req_ids, cached.num_computed_tokens))
        req_ids = self._first_step_req_ids
        if not req_ids:
            # Every request of the window had finished (async scheduling
            # planned it before the scheduler knew): step 1 ran nothing.
            return first
        longest = max(window.num_scheduled_tokens.values())
        cut = {r for r, n in window.num_scheduled_tokens.items() if n < longest}
        stops = {r: stop_token_ids(runner.requests[r].sampling_params) for r in req_ids}
        device = self._device
        path = device.uncovered(req_ids) if device is not None else "turned off"
        self._count_path(path or DEVICE_PATH)
        if device is not None and path is None:
            self._lean.start_window()
            inner_step = follow_up_step(
                runner.requests, {r: start[r] + 1 for r in req_ids}
            )
            result = device.run(window, inner_step, first, cut, stops)
            self._done |= result.finished
            return returned_like(first, result.output)
        steps = [resolve_output(first)]
        steps_left = {r: window.num_scheduled_tokens[r] for r in req_ids}
        self._leave_window(steps[-1], steps_left, cut, stops)
        self._lean.start_window()
        step = 1
        while steps_left:
            step_output = follow_up_step(
                runner.requests, {r: start[r] + step for r in steps_left}
            )
            self._lean.run(step_output, steps[-1])
            steps.append(resolve_output(runner.sample_tokens(None)))
            self._leave_window(steps[-1], steps_left, cut, stops)
            step += 1
        return returned_like(first, merge_step_outputs(steps))

    def _leave_window(
        self,
        output: ModelRunnerOutput,
        steps_left: dict[str, int],
        cut: set[str],
        stops: dict[str, frozenset[int]],
    ) -> None:
        """Count a step done; drop requests that stopped or ran their last step.

        `cut` holds the requests whose window the scheduler made shorter than
        the others' (at max_tokens or max_model_len): they finish with it.
        `stops` holds each request's stop token ids (`stop_token_ids`).
        """
        for req_id, index in output.req_id_to_index.items():
            if req_id not in steps_left:
                continue
            tokens = output.sampled_token_ids[index]
            if tokens and tokens[-1] in stops[req_id]:
                self._done.add(req_id)
                del steps_left[req_id]
            elif steps_left[req_id] == 1:
                del steps_left[req_id]
                if req_id in cut:
                    self._done.add(req_id)
            else:
                steps_left[req_id] -= 1


def _without(cached: CachedRequestData, req_ids: set[str]) -> CachedRequestData:
    if not req_ids:
        return cached
    keep = [i for i, req_id in enumerate(cached.req_ids) if req_id not in req_ids]
    return CachedRequestData(
        req_ids=[cached.req_ids[i] for i in keep],
        resumed_req_ids=cached.resumed_req_ids - req_ids,
        new_token_ids=[cached.new_token_ids[i] for i in keep]
        if cached.new_token_ids
        else [],
        all_token_ids={
            r: t for r, t in cached.all_token_ids.items() if r not in req_ids
        },
        new_block_ids=[cached.new_block_ids[i] for i in keep],
        num_computed_tokens=[cached.num_computed_tokens[i] for i in keep],
        num_output_tokens=[cached.num_output_tokens[i] for i in keep],
    )
