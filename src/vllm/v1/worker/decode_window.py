# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode on Model Runner V2: run a decode window as back-to-back steps.

The scheduler marks a window (`SchedulerOutput.multi_step_window`) and gives
each request the number of decode steps it may run
(vllm/v1/core/sched/multi_step.py); the KV blocks for all of them arrive with
the window. The worker runs the window on the model runner vLLM picked. Step 1
is the runner's own step, `execute_model` + `sample_tokens`, on the
scheduler's output with one token per request. Each later step executes the
output a single-step scheduler would send for the next position of the
requests still in the window (the runner's `execute_model`: its input kernels,
attention metadata and forward, graphs included where it captures them), then
samples with the runner's own sampler and state update (`sample`,
`postprocess_sampled`) and nothing else of `sample_tokens`: an inner step
builds no output object, prompt logprobs or per-step copy of its own.
Model Runner V2 keeps every request's state on the device (token history,
last sampled token, computed count, penalty counts, per-request seeds keyed
by position), and a step reads its input ids and positions from that state:
so each inner step computes exactly what upstream's step would, with every
sampling option (penalties, bad words, logit bias, min_tokens, logits
processors, logprobs) computed by upstream's sampler.

Both runners serve: `GPUModelRunner` (vllm/v1/worker/gpu/, also the x86 CPU
runner as `CPUModelRunner`) and `StandaloneCPUModelRunner`
(vllm/v1/worker/cpu/); they share the method names used here. The runner's
`sample_tokens` returns an `AsyncOutput` (GPU runner) or a finished
`ModelRunnerOutput` (standalone); the window reads each step's tokens on the
host to see which requests stopped, and returns one output for the window.

A request leaves the window after its last planned step or when it samples a
token that ends it in the scheduler (its EOS, one of its stop_token_ids: the
first checks of `check_stop`, vllm/v1/core/sched/utils.py); the window ends
when no request is left. Stops the worker cannot see (stop strings, length,
repetition detection) are found by the scheduler and the frontend, which
discard what follows; a request that leaves writes no further KV.

Under async scheduling the next step is planned before the scheduler learns
that a request stopped in this window; that step runs without it (the
scheduler ignores outputs for finished requests), as the runner no longer
advances its state.
"""

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
)
from vllm.v1.worker.window_output import (
    merge_step_outputs,
    resolve_output,
    returned_like,
    stop_token_ids,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

logger = init_logger(__name__)


class DecodeWindowRunner:
    """The worker's side of multi-step decode on Model Runner V2."""

    def __init__(self, worker: "WorkerBase", vllm_config: "VllmConfig") -> None:
        self.worker = worker
        self.async_scheduling = bool(vllm_config.scheduler_config.async_scheduling)
        # req_id -> the token ids that end it when sampled (stop_token_ids).
        self._stop_ids: dict[str, frozenset[int]] = {}
        # The window whose step 1 is executing, until it is sampled, and the
        # requests step 1 runs.
        self._window: SchedulerOutput | None = None
        self._req_ids: list[str] = []
        # Requests that sampled a stop token in the last window. Under async
        # scheduling the step after it was planned before the scheduler knew.
        self._stopped: set[str] = set()
        self._ran_nothing = False
        self._num_windows = 0
        self._num_steps = 0

    @classmethod
    def create(
        cls, vllm_config: "VllmConfig", worker: "WorkerBase"
    ) -> "DecodeWindowRunner | None":
        if vllm_config.scheduler_config.num_scheduler_steps == 1:
            return None
        return cls(worker, vllm_config)

    @property
    def model_runner(self) -> "GPUModelRunner":
        return self.worker.model_runner

    def first_step(self, scheduler_output: SchedulerOutput) -> SchedulerOutput:
        """What the runner executes first: a window's step 1, or the step as is."""
        for new_req in scheduler_output.scheduled_new_reqs:
            self._stop_ids[new_req.req_id] = stop_token_ids(new_req.sampling_params)
        for req_id in scheduler_output.finished_req_ids:
            self._stop_ids.pop(req_id, None)
        scheduled = scheduler_output.num_scheduled_tokens
        dropped = self._stopped.intersection(scheduled) if self.async_scheduling else ()
        self._stopped = set()
        window = scheduler_output.multi_step_window
        self._window = scheduler_output if window else None
        self._ran_nothing = False
        if not window and not dropped:
            return scheduler_output
        counts = {
            req_id: 1 if window else num_tokens
            for req_id, num_tokens in scheduled.items()
            if req_id not in dropped
        }
        self._req_ids = list(counts)
        # Every request of the step had stopped: the runner runs nothing and has
        # no step to sample, but the engine samples the step it scheduled.
        self._ran_nothing = not counts
        return replace(
            scheduler_output,
            scheduled_cached_reqs=_only(scheduler_output.scheduled_cached_reqs, counts),
            num_scheduled_tokens=counts,
            total_num_scheduled_tokens=sum(counts.values()),
            scheduled_spec_decode_tokens={},
            multi_step_window=0,
        )

    def sample_tokens(
        self, grammar_output: "GrammarOutput | None"
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        window, self._window = self._window, None
        if self._ran_nothing:
            return EMPTY_MODEL_RUNNER_OUTPUT
        first = self.model_runner.sample_tokens(grammar_output)
        if window is None or first is None:
            return first
        cached = window.scheduled_cached_reqs
        start = dict(zip(cached.req_ids, cached.num_computed_tokens))
        num_outputs = dict(zip(cached.req_ids, cached.num_output_tokens))
        planned = window.num_scheduled_tokens
        steps = [resolve_output(first)]
        running = self._still_running(steps[-1], self._req_ids, planned, 1)
        while running:
            offset = len(steps)
            self.model_runner.execute_model(
                follow_up_step(
                    {r: start[r] + offset for r in running},
                    {r: num_outputs[r] + offset for r in running},
                )
            )
            steps.append(self._sample_inner_step())
            running = self._still_running(steps[-1], running, planned, len(steps))
        self._count(len(steps))
        return returned_like(first, merge_step_outputs(steps))

    def _sample_inner_step(self) -> ModelRunnerOutput:
        """Sample the inner step the runner just executed, with upstream's own
        sampler and state update (`sample`, `postprocess_sampled`: post_update
        advances computed counts, token history, last token, penalty counts).

        The rest of the runner's `sample_tokens` is left out: an inner step is
        a decode step of requests already running, so it has no prompt
        logprobs, and the KV connectors, auxiliary outputs, EPLB and drafters
        that would act per step are refused with windows
        (vllm/config/multi_step.py). Nor is a step's output copied or wrapped
        on its own: only what the window reads (token ids, logprob rows) is
        taken to the host.
        """
        model_runner = self.model_runner
        executed = model_runner.execute_model_state
        model_runner.execute_model_state = None  # consumed, as sample_tokens does
        assert executed is not None and executed.hidden_states is not None
        step_batch = executed.input_batch
        step_sample, num_sampled, num_rejected = model_runner.sample(
            executed.hidden_states, step_batch, None
        )
        model_runner.postprocess_sampled(
            step_batch.idx_mapping,
            step_sample.sampled_token_ids,
            num_sampled,
            num_rejected,
            step_batch.query_start_loc,
        )
        token_ids = step_sample.sampled_token_ids.tolist()
        for row, num_tokens in zip(token_ids, num_sampled.tolist(), strict=True):
            del row[num_tokens:]
        output = ModelRunnerOutput(
            req_ids=step_batch.req_ids, sampled_token_ids=token_ids
        )
        if step_sample.logprobs_tensors is not None:
            output.logprobs = step_sample.logprobs_tensors.tolists()
        if step_sample.num_nans is not None:
            output.num_nans_in_logits = dict(
                zip(step_batch.req_ids, step_sample.num_nans.tolist(), strict=True)
            )
        return output

    def _still_running(
        self,
        output: ModelRunnerOutput,
        req_ids: Iterable[str],
        planned: dict[str, int],
        num_steps: int,
    ) -> list[str]:
        """The requests of `req_ids` that run another step after this one."""
        tokens = dict(zip(output.req_ids, output.sampled_token_ids))
        running = []
        for req_id in req_ids:
            sampled = tokens.get(req_id)
            if not sampled:
                continue  # sampled nothing: the scheduler settles the window
            if sampled[-1] in self._stop_ids.get(req_id, ()):
                self._stopped.add(req_id)
            elif planned[req_id] > num_steps:
                running.append(req_id)
        return running

    def _count(self, num_steps: int) -> None:
        """Log the windows' mean length at 1, 2, 4, 8, ... windows."""
        self._num_windows += 1
        self._num_steps += num_steps
        if self._num_windows & (self._num_windows - 1) == 0:
            logger.info(
                "Multi-step decode on Model Runner V2 (%s): %d windows, %.2f "
                "steps per window.",
                type(self.model_runner).__name__,
                self._num_windows,
                self._num_steps / self._num_windows,
            )


def follow_up_step(
    num_computed: dict[str, int], num_output_tokens: dict[str, int]
) -> SchedulerOutput:
    """What a single-step scheduler would send next: each request's last
    token at its position (the runner reads the token from its own state)."""
    req_ids = list(num_computed)
    return replace(
        SchedulerOutput.make_empty(),
        scheduled_cached_reqs=replace(
            CachedRequestData.make_empty(),
            req_ids=req_ids,
            new_block_ids=[None] * len(req_ids),
            num_computed_tokens=[num_computed[r] for r in req_ids],
            num_output_tokens=[num_output_tokens[r] for r in req_ids],
        ),
        num_scheduled_tokens=dict.fromkeys(req_ids, 1),
        total_num_scheduled_tokens=len(req_ids),
    )


def _only(cached: CachedRequestData, req_ids: Iterable[str]) -> CachedRequestData:
    """`cached` restricted to `req_ids` (a step that leaves some requests out)."""
    keep_ids = set(req_ids)
    keep = [i for i, req_id in enumerate(cached.req_ids) if req_id in keep_ids]
    if len(keep) == len(cached.req_ids):
        return cached
    return replace(
        cached,
        req_ids=[cached.req_ids[i] for i in keep],
        new_token_ids=[cached.new_token_ids[i] for i in keep]
        if cached.new_token_ids
        else [],
        new_block_ids=[cached.new_block_ids[i] for i in keep],
        num_computed_tokens=[cached.num_computed_tokens[i] for i in keep],
        num_output_tokens=[cached.num_output_tokens[i] for i in keep],
    )
