# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode on Model Runner V2: the worker runs a decode window as
back-to-back steps.

The scheduler marks a window (`SchedulerOutput.multi_step_window`) and gives
each request the positions its steps may use (vllm/v1/core/sched/multi_step.py);
the KV blocks for all of them arrive with the window. Step 1 is the
scheduler's step with one token per request (and its drafts); each later step
is what a single-step scheduler would send for the requests still in the
window (window_requests.py), run by the kind of inner step picked for the
runner (inner_steps.py). The window reads each step's tokens on the host to
see which requests stopped and returns one output for the window.

Under async scheduling the next step is planned before the scheduler learns
that a request stopped in this window; that step runs without it (the
scheduler ignores outputs for finished requests), as the runner no longer
advances its state. A window also ends after the inner step in flight when a
request arrives (window_yield.py). The worker masks each inner step of a
structured-output request with its own copy of the request's grammar
(window_grammar.py), and step 1 too where the scheduler leaves it that
(`SchedulerOutput.multi_step_worker_masks`), reporting which copies followed
their requests through the window.
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
)
from vllm.v1.worker.gpu.multi_step.inner_steps import InnerSteps, pick_inner_steps
from vllm.v1.worker.gpu.multi_step.window_grammar import WindowGrammars
from vllm.v1.worker.gpu.multi_step.window_requests import (
    WindowRequests,
    WindowStart,
    only,
    prompt_shares,
)
from vllm.v1.worker.gpu.multi_step.window_yield import ArrivalWatch, CutWindows
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
    from vllm.v1.worker.gpu.multi_step.window_requests import PromptShare
    from vllm.v1.worker.worker_base import WorkerBase

logger = init_logger(__name__)


@dataclass(frozen=True)
class ExecutedStep:
    """A step the worker executed, until `sample_tokens` samples it (as
    upstream's ExecuteModelState travels from execute_model to sample_tokens)."""

    # The window's scheduler output, where the step is a window's step 1.
    window: SchedulerOutput | None
    # The requests the step runs.
    req_ids: list[str]
    # Whether the inner steps executed it (`InnerSteps.execute_first`).
    executed_here: bool = False
    # Whether every request of the step had stopped: the runner ran nothing.
    ran_nothing: bool = False


# A step the worker executes as the scheduler planned it.
AS_SCHEDULED = ExecutedStep(None, [])


class ModelRunnerV2Windows:
    """The worker's side of multi-step decode on Model Runner V2."""

    def __init__(self, worker: "WorkerBase", vllm_config: "VllmConfig") -> None:
        self.worker = worker
        self.vllm_config = vllm_config
        self.async_scheduling = bool(vllm_config.scheduler_config.async_scheduling)
        # req_id -> the token ids that end it when sampled (stop_token_ids),
        # and its max_tokens.
        self._stop_ids: dict[str, frozenset[int]] = {}
        self._max_tokens: dict[str, int] = {}
        self._executed: ExecutedStep | None = None
        # Requests that sampled a stop token in the last window. Under async
        # scheduling the step after it was planned before the scheduler knew.
        self._stopped: set[str] = set()
        # Picked at the first step: the runner is loaded after the worker.
        self._inner_steps: InnerSteps | None = None
        self._arrivals = ArrivalWatch(vllm_config)
        self._cut_windows = CutWindows()
        self._grammars = WindowGrammars(vllm_config)
        self._num_windows = 0
        self._num_steps = 0
        self._num_yielded = 0
        self._num_worker_masked = 0

    @classmethod
    def create(
        cls, vllm_config: "VllmConfig", worker: "WorkerBase"
    ) -> "ModelRunnerV2Windows | None":
        if vllm_config.scheduler_config.num_scheduler_steps == 1:
            return None
        return cls(worker, vllm_config)

    @property
    def model_runner(self) -> "GPUModelRunner":
        return self.worker.model_runner

    @property
    def inner_steps(self) -> InnerSteps:
        if self._inner_steps is None:
            self._inner_steps = pick_inner_steps(self.model_runner, self.vllm_config)
        return self._inner_steps

    def first_step(self, scheduler_output: SchedulerOutput) -> SchedulerOutput | None:
        """What the runner executes first: a window's step 1, or the step as is;
        None where the inner steps executed step 1 themselves."""
        self._track_requests(scheduler_output)
        scheduler_output = self._cut_windows.correct(scheduler_output)
        scheduled = scheduler_output.num_scheduled_tokens
        dropped = self._stopped.intersection(scheduled) if self.async_scheduling else ()
        self._stopped = set()
        window = scheduler_output if scheduler_output.multi_step_window else None
        if window is None and not dropped:
            self._executed = AS_SCHEDULED
            return scheduler_output
        step_one = _step_one(scheduler_output, dropped)
        req_ids = list(step_one.num_scheduled_tokens)
        executed_here = window is not None and self.inner_steps.execute_first(step_one)
        self._executed = ExecutedStep(window, req_ids, executed_here, not req_ids)
        return None if executed_here else step_one

    def sample_tokens(
        self, grammar_output: "GrammarOutput | None"
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        pending, self._executed = self._executed or AS_SCHEDULED, None
        if pending.ran_nothing:
            # The engine samples the step it scheduled all the same.
            return EMPTY_MODEL_RUNNER_OUTPUT
        window = pending.window
        if window is not None and window.multi_step_worker_masks:
            self._num_worker_masked += 1
            grammar_output = self._grammars.mask_step_one(
                grammar_output,
                window.multi_step_worker_masks,
                pending.req_ids,
                self.model_runner,
            )
        first = self.inner_steps.sample_first(grammar_output, pending.executed_here)
        if window is None or first is None:
            return first
        start = WindowStart(
            window,
            pending.req_ids,
            self._stop_ids,
            # The scheduler's output counts include the placeholders of the
            # step in flight under async scheduling: max_tokens is no bound.
            {} if self.async_scheduling else self._max_tokens,
        )
        steps, requests, yielded, followed = self._run_window(
            start, resolve_output(first), grammar_output
        )
        merged = merge_step_outputs(steps)
        spec_counts = requests.spec_counts()
        if spec_counts:
            merged.multi_step_spec_counts = spec_counts
        merged.multi_step_yielded = yielded
        merged.multi_step_grammars = followed
        self._cut_windows.record(window, requests, merged)
        return returned_like(first, merged)

    def _run_window(
        self,
        start: WindowStart,
        first: ModelRunnerOutput,
        first_grammar: "GrammarOutput | None",
    ) -> tuple[list[ModelRunnerOutput], WindowRequests, bool, list[str] | None]:
        """Run a window's steps after step 1: every step's output, the tracker
        of its requests, whether the window yielded to an arrival, and the
        structured-output requests its grammar copies followed through it."""
        inner_steps = self.inner_steps
        requests = inner_steps.requests(start)
        masks = self._grammars.start(first_grammar, start.req_ids, self.model_runner)
        steps = [first]
        yielded = False
        while requests.advance(steps[-1]):
            if self._arrivals.arrived(start.window):
                yielded = True
                break
            if masks.lost:
                break  # a grammar copy cannot follow: as single steps from here
            inner_steps.execute(requests)
            steps.append(inner_steps.sample(masks.next_step(requests.running)))
            masks.accept(steps[-1])
        inner_steps.finish_window()
        self._stopped = requests.stopped
        self._count(len(steps), yielded)
        return steps, requests, yielded, masks.followed()

    def _track_requests(self, scheduler_output: SchedulerOutput) -> None:
        """Remember each new request's stop tokens and max_tokens until it
        finishes."""
        for new_req in scheduler_output.scheduled_new_reqs:
            params = new_req.sampling_params
            self._stop_ids[new_req.req_id] = stop_token_ids(params)
            if params is not None and params.max_tokens is not None:
                self._max_tokens[new_req.req_id] = params.max_tokens
        for req_id in scheduler_output.finished_req_ids:
            self._stop_ids.pop(req_id, None)
            self._max_tokens.pop(req_id, None)
        self._grammars.track(scheduler_output)

    def _count(self, num_steps: int, yielded: bool) -> None:
        """Log the windows' mean length at 1, 2, 4, 8, ... windows."""
        self._num_windows += 1
        self._num_steps += num_steps
        self._num_yielded += yielded
        if self._num_windows & (self._num_windows - 1) == 0:
            described = self.inner_steps.describe()
            logger.info(
                "Multi-step decode on Model Runner V2 (%s, %s): %d windows, "
                "%.2f steps per window, %d yielded to arrivals, %d with step 1 "
                "masked by the worker%s.",
                type(self.model_runner).__name__,
                type(self.inner_steps).__name__,
                self._num_windows,
                self._num_steps / self._num_windows,
                self._num_yielded,
                self._num_worker_masked,
                "; " + described if described else "",
            )


def _step_one(
    scheduler_output: SchedulerOutput, dropped: "set[str] | tuple[()]"
) -> SchedulerOutput:
    """The step the runner executes for `scheduler_output` without the
    requests of `dropped`; for a window, its step 1: each request's last
    token and its drafts, each admitted request's prompt share."""
    window = scheduler_output.multi_step_window
    drafts = {
        req_id: draft_ids
        for req_id, draft_ids in scheduler_output.scheduled_spec_decode_tokens.items()
        if req_id not in dropped
    }
    prompts = prompt_shares(scheduler_output) if window else {}
    counts = {
        req_id: _step_one_share(req_id, num_tokens, window, drafts, prompts)
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items()
        if req_id not in dropped
    }
    return replace(
        scheduler_output,
        scheduled_cached_reqs=only(scheduler_output.scheduled_cached_reqs, counts),
        num_scheduled_tokens=counts,
        total_num_scheduled_tokens=sum(counts.values()),
        scheduled_spec_decode_tokens=drafts,
        # The next inner step verifies what this one drafts: the scheduler's
        # reason to skip drafting (the window's end) does not hold per step.
        skip_drafts=False if window else scheduler_output.skip_drafts,
        multi_step_window=0,
    )


def _step_one_share(
    req_id: str,
    num_tokens: int,
    window: int,
    drafts: dict[str, list[int]],
    prompts: "dict[str, PromptShare]",
) -> int:
    """A request's tokens in the step the runner executes first."""
    if not window:
        return num_tokens
    if req_id in prompts:
        return prompts[req_id].num_tokens
    return 1 + len(drafts.get(req_id, ()))
