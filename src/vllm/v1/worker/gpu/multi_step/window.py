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

With speculative decoding (k drafts) the scheduler gives each request up to
W * (1 + k) positions (vllm/v1/core/sched/multi_step.py). Each step verifies
the drafts the runner's speculator proposed after the step before (they stay
on the device; the step's scheduler output carries placeholders, as upstream's
async scheduler sends them) and generates 1 + the accepted ones; the runner's
`post_update` moves each request to where its accepted tokens end, so the next
step starts there, per request. A step verifies k drafts, fewer only where the
window's positions end (a single-step scheduler trims them at max_model_len),
and the window reports each step's (drafts, accepted) for the scheduler's
spec-decoding metrics.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain
from typing import TYPE_CHECKING

from vllm.config.multi_step import device_window_options
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
    from vllm.v1.worker.standalone_inner_step import StandaloneInnerStep
    from vllm.v1.worker.worker_base import WorkerBase

logger = init_logger(__name__)


@dataclass
class _RequestInWindow:
    """One request's progress through a window, in positions and tokens."""

    # Positions the scheduler allocated for the window (its num_scheduled_tokens).
    num_positions: int
    # Output tokens it may still generate, where the scheduler's count is exact
    # (no async placeholders); otherwise the positions bound it.
    num_tokens_left: int | None
    # Positions its steps processed (rejected drafts included), tokens they
    # generated (1 + accepted drafts each), each step's (drafts, accepted):
    # the scheduler counts drafts per step, up to the request's max_tokens.
    num_processed: int = 0
    num_generated: int = 0
    spec_counts: list[tuple[int, int]] = field(default_factory=list)

    def record(self, num_drafts: int, num_tokens: int) -> None:
        self.num_processed += 1 + num_drafts
        self.num_generated += num_tokens
        self.spec_counts.append((num_drafts, num_tokens - 1))

    def num_next_drafts(self, num_spec_tokens: int) -> int | None:
        """Drafts its next step verifies, or None when it has no next step.

        The next step starts where the generated tokens end and processes 1 + d
        positions, within the window's; a step that runs out of them verifies
        fewer drafts, as a single-step scheduler trims them at max_model_len.
        """
        room = self.num_positions - self.num_generated - 1
        if room < 0 or (
            self.num_tokens_left is not None
            and self.num_generated >= self.num_tokens_left
        ):
            return None
        return min(num_spec_tokens, room)

    def last_step(self, window_size: int) -> int:
        """Its last step in a window without drafts, where each step generates
        one token at the next position: `num_next_drafts(0)` turns None after
        it."""
        if self.num_tokens_left is None:
            return min(window_size, self.num_positions)
        return min(window_size, self.num_positions, self.num_tokens_left)


class DecodeWindowRunner:
    """The worker's side of multi-step decode on Model Runner V2."""

    def __init__(self, worker: "WorkerBase", vllm_config: "VllmConfig") -> None:
        self.worker = worker
        self.vllm_config = vllm_config
        self.async_scheduling = bool(vllm_config.scheduler_config.async_scheduling)
        speculative_config = vllm_config.speculative_config
        self.num_spec_tokens = (
            speculative_config.num_speculative_tokens if speculative_config else 0
        )
        # req_id -> the token ids that end it when sampled (stop_token_ids),
        # and its max_tokens.
        self._stop_ids: dict[str, frozenset[int]] = {}
        self._max_tokens: dict[str, int] = {}
        # The window whose step 1 is executing, until it is sampled, and the
        # requests step 1 runs.
        self._window: SchedulerOutput | None = None
        self._req_ids: list[str] = []
        # Requests that sampled a stop token in the last window. Under async
        # scheduling the step after it was planned before the scheduler knew.
        self._stopped: set[str] = set()
        self._ran_nothing = False
        # Inner steps on the step before's batch, where the runner allows it
        # (made on the first window: the runner is loaded after the worker),
        # and whether the window's step 1 ran on it.
        self._reused: StandaloneInnerStep | None = None
        self._first_on_kept = False
        self._reused_made = False
        self._num_windows = 0
        self._num_steps = 0
        self._num_reused = 0
        self._num_first_reused = 0

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

    def first_step(self, scheduler_output: SchedulerOutput) -> SchedulerOutput | None:
        """What the runner executes first: a window's step 1, or the step as is;
        None where the window executed its step 1 itself, on the batch the
        runner's last step left (StandaloneInnerStep.execute_first)."""
        for new_req in scheduler_output.scheduled_new_reqs:
            params = new_req.sampling_params
            self._stop_ids[new_req.req_id] = stop_token_ids(params)
            if params is not None and params.max_tokens is not None:
                self._max_tokens[new_req.req_id] = params.max_tokens
        for req_id in scheduler_output.finished_req_ids:
            self._stop_ids.pop(req_id, None)
            self._max_tokens.pop(req_id, None)
        scheduled = scheduler_output.num_scheduled_tokens
        dropped = self._stopped.intersection(scheduled) if self.async_scheduling else ()
        self._stopped = set()
        window = scheduler_output.multi_step_window
        self._window = scheduler_output if window else None
        self._ran_nothing = False
        if not window and not dropped:
            return scheduler_output
        scheduled_drafts = scheduler_output.scheduled_spec_decode_tokens
        drafts = {
            req_id: draft_ids
            for req_id, draft_ids in scheduled_drafts.items()
            if req_id not in dropped
        }
        # Step 1 of a window: each request's last token and its drafts.
        counts = {
            req_id: 1 + len(drafts.get(req_id, ())) if window else num_tokens
            for req_id, num_tokens in scheduled.items()
            if req_id not in dropped
        }
        self._req_ids = list(counts)
        # Every request of the step had stopped: the runner runs nothing and has
        # no step to sample, but the engine samples the step it scheduled.
        self._ran_nothing = not counts
        step = replace(
            scheduler_output,
            scheduled_cached_reqs=_only(scheduler_output.scheduled_cached_reqs, counts),
            num_scheduled_tokens=counts,
            total_num_scheduled_tokens=sum(counts.values()),
            scheduled_spec_decode_tokens=drafts,
            # The next inner step verifies what this one drafts: the scheduler's
            # reason to skip drafting (the window's end) does not hold per step.
            skip_drafts=False if window else scheduler_output.skip_drafts,
            multi_step_window=0,
        )
        reused = self._reused_steps() if window else None
        self._first_on_kept = reused is not None and reused.execute_first(step)
        if self._first_on_kept:
            self._num_first_reused += 1
            return None
        return step

    def sample_tokens(
        self, grammar_output: "GrammarOutput | None"
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        window, self._window = self._window, None
        if self._ran_nothing:
            return EMPTY_MODEL_RUNNER_OUTPUT
        first_on_kept, self._first_on_kept = self._first_on_kept, False
        reused = self._reused_steps()
        if reused is not None:
            reused.keep_executed()  # this step's batch, before sampling consumes it
        # A step 1 on the kept batch is a decode step of requests already
        # running, as an inner step is: sampled as one.
        first = (
            self._sample_inner_step()
            if first_on_kept
            else self.model_runner.sample_tokens(grammar_output)
        )
        if window is None or first is None:
            return first
        steps, spec_counts = self._run_window(window, resolve_output(first))
        self._count(len(steps))
        merged = merge_step_outputs(steps)
        if spec_counts:
            merged.multi_step_spec_counts = spec_counts
        return returned_like(first, merged)

    def _run_window(
        self, window: SchedulerOutput, first: ModelRunnerOutput
    ) -> tuple[list[ModelRunnerOutput], dict[str, list[tuple[int, int]]]]:
        """Run a window's steps after step 1: every step's output, and per
        request each step's (drafts, accepted) where it verified drafts.

        With drafts an inner step processes each request's last token and the
        drafts the runner's speculator proposed after the previous step (they
        stay on the device, as under upstream's async scheduling), and the
        runner's whole `sample_tokens` samples it: rejection sampling, the
        state update by what was accepted, the next drafts. The runner places
        each request where its accepted tokens end; the host tracks
        positions only to size each step within the window's.
        """
        cached = window.scheduled_cached_reqs
        start = dict(zip(cached.req_ids, cached.num_computed_tokens))
        num_outputs = dict(zip(cached.req_ids, cached.num_output_tokens))
        progress = {
            req_id: _RequestInWindow(
                window.num_scheduled_tokens[req_id],
                self._tokens_left(req_id, num_outputs[req_id]),
            )
            for req_id in self._req_ids
        }
        # The requests that run each step, with the drafts it verifies for them.
        drafts = {
            req_id: len(window.scheduled_spec_decode_tokens.get(req_id, ()))
            for req_id in self._req_ids
        }
        steps = [first]
        if self.num_spec_tokens:
            advance = partial(
                self._advance, progress=progress, window_size=window.multi_step_window
            )
        else:
            # Without drafts every request still in the window ran every step,
            # one position and one token each: its last step is known up front.
            advance = partial(
                self._advance_plain,
                last_steps={
                    req_id: in_window.last_step(window.multi_step_window)
                    for req_id, in_window in progress.items()
                },
                window_stop_ids=frozenset().union(
                    *(self._stop_ids.get(req_id, ()) for req_id in progress)
                ),
            )
        drafts = advance(first, drafts, num_steps=1)
        reused = self._reused if not self.num_spec_tokens else None
        while drafts:
            if reused is not None and reused.execute(drafts):
                self._num_reused += 1
            else:
                if self.num_spec_tokens:
                    processed = {r: progress[r].num_processed for r in drafts}
                    generated = {r: progress[r].num_generated for r in drafts}
                else:  # each ran every step so far, one position and token each
                    processed = generated = dict.fromkeys(drafts, len(steps))
                self.model_runner.execute_model(
                    follow_up_step(
                        {r: start[r] + processed[r] for r in drafts},
                        {r: num_outputs[r] + generated[r] for r in drafts},
                        drafts,
                        window.num_spec_tokens_to_schedule,
                    )
                )
                if reused is not None:
                    reused.keep_executed()
            # With a speculator the runner's whole step, which drafts for the next.
            steps.append(
                resolve_output(self.model_runner.sample_tokens(None))
                if self.num_spec_tokens
                else self._sample_inner_step()
            )
            drafts = advance(steps[-1], drafts, num_steps=len(steps))
        if not self.num_spec_tokens:
            return steps, {}
        return steps, {r: p.spec_counts for r, p in progress.items()}

    def _reused_steps(self) -> "StandaloneInnerStep | None":
        """The runner's inner steps on the step before's batch, where it has
        them (StandaloneCPUModelRunner) and the device window option is on."""
        if not self._reused_made:
            self._reused_made = True
            enabled, _ = device_window_options(self.vllm_config)
            if enabled and self.vllm_config.device_config.device_type == "cpu":
                # Imported here: the module reads the CPU runner's own kernels.
                from vllm.v1.worker.standalone_inner_step import StandaloneInnerStep

                self._reused = StandaloneInnerStep.create(
                    self.model_runner, self.vllm_config
                )
        return self._reused

    def _tokens_left(self, req_id: str, num_output_tokens: int) -> int | None:
        """How many tokens a request may still generate, where the scheduler's
        output count is exact: without async scheduling (with it, the count
        includes the optimistic placeholders of the step in flight)."""
        max_tokens = self._max_tokens.get(req_id)
        if self.async_scheduling or max_tokens is None:
            return None
        return max_tokens - num_output_tokens

    def _sample_inner_step(self) -> ModelRunnerOutput:
        """Sample the inner step the runner just executed (or a step 1 run on
        the kept batch), with upstream's own sampler and state update
        (`sample`, `postprocess_sampled`: post_update advances computed counts,
        token history, last token, penalty counts). On the standalone CPU
        runner `StandaloneInnerStep.sample` stands in for the runner's `sample`:
        the same draws, without the sampler's per-step bookkeeping.

        The rest of the runner's `sample_tokens` is left out: an inner step is
        a decode step of requests already running, so it has no prompt
        logprobs, and the KV connectors, auxiliary outputs and EPLB that would
        act per step are refused with windows (vllm/config/multi_step.py); with
        a speculator, inner steps take the whole `sample_tokens` instead (it
        drafts for the next step). Nor is a step's output copied or wrapped
        on its own: only what the window reads (token ids, logprob rows) is
        taken to the host.
        """
        model_runner = self.model_runner
        executed = model_runner.execute_model_state
        model_runner.execute_model_state = None  # consumed, as sample_tokens does
        assert executed is not None and executed.hidden_states is not None
        step_batch = executed.input_batch
        reused = self._reused_steps()
        sample = reused.sample if reused is not None else model_runner.sample
        step_sample, num_sampled, num_rejected = sample(
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

    def _advance(
        self,
        output: ModelRunnerOutput,
        drafts: dict[str, int],
        progress: dict[str, _RequestInWindow],
        window_size: int,
        num_steps: int,
    ) -> dict[str, int]:
        """Record the step each request of `drafts` ran (with that many
        drafts); those that run another step, with the drafts it verifies."""
        tokens = dict(zip(output.req_ids, output.sampled_token_ids))
        running = {}
        for req_id, num_drafts in drafts.items():
            sampled = tokens.get(req_id)
            if not sampled:
                continue  # sampled nothing: the scheduler settles the window
            in_window = progress[req_id]
            in_window.record(num_drafts, len(sampled))
            if not self._sampled_stop(req_id, sampled) and num_steps < window_size:
                num_next = in_window.num_next_drafts(self.num_spec_tokens)
                if num_next is not None:
                    running[req_id] = num_next
        return running

    def _advance_plain(
        self,
        output: ModelRunnerOutput,
        running: dict[str, int],
        num_steps: int,
        last_steps: dict[str, int],
        window_stop_ids: frozenset[int],
    ) -> dict[str, int]:
        """`_advance` for a window without drafts: those of `running` that run
        another step after step `num_steps`, each request's last step given.

        A step where every request sampled a token, none of them a stop token,
        and none reached its last step leaves the window as it was: checked
        over the whole step at once, the common case costs no per-request work.
        """
        token_ids = output.sampled_token_ids
        if (
            len(token_ids) == len(running)
            and all(token_ids)
            and num_steps < min(map(last_steps.__getitem__, running))
            and window_stop_ids.isdisjoint(chain.from_iterable(token_ids))
        ):
            return running
        tokens = dict(zip(output.req_ids, token_ids))
        still = {}
        for req_id in running:
            sampled = tokens.get(req_id)
            if not sampled:
                continue  # sampled nothing: the scheduler settles the window
            if not self._sampled_stop(req_id, sampled) and (
                num_steps < last_steps[req_id]
            ):
                still[req_id] = 0
        return still

    def _sampled_stop(self, req_id: str, sampled: list[int]) -> bool:
        """Whether `sampled` holds one of the request's stop tokens (it then
        leaves the window, and is remembered as stopped)."""
        if self._stop_ids.get(req_id, frozenset()).isdisjoint(sampled):
            return False
        self._stopped.add(req_id)
        return True

    def _count(self, num_steps: int) -> None:
        """Log the windows' mean length at 1, 2, 4, 8, ... windows."""
        self._num_windows += 1
        self._num_steps += num_steps
        if self._num_windows & (self._num_windows - 1) == 0:
            num_inner = self._num_steps - self._num_windows
            reused = self._reused
            logger.info(
                "Multi-step decode on Model Runner V2 (%s): %d windows, %.2f "
                "steps per window, %d%% of inner steps and %d%% of first steps "
                "on the batch of the step before, %d%% of steps sampled without "
                "the sampler's per-step bookkeeping.",
                type(self.model_runner).__name__,
                self._num_windows,
                self._num_steps / self._num_windows,
                100 * self._num_reused // max(num_inner, 1),
                100 * self._num_first_reused // self._num_windows,
                100 * reused.num_plain_steps // max(reused.num_sampled_steps, 1)
                if reused is not None
                else 0,
            )


def follow_up_step(
    num_computed: dict[str, int],
    num_output_tokens: dict[str, int],
    num_drafts: dict[str, int],
    num_spec_tokens_to_schedule: int = 0,
) -> SchedulerOutput:
    """What a single-step scheduler would send next: each request's last token
    and `num_drafts` drafts, with upper bounds of its computed and output counts.

    The runner reads the tokens (the last sampled one, the drafts its
    speculator proposed) and each request's true position from its own state,
    as it does for a step upstream's async scheduler planned; the drafts here
    are placeholders, as that scheduler sends them.
    """
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
        num_scheduled_tokens={r: 1 + num_drafts[r] for r in req_ids},
        total_num_scheduled_tokens=sum(1 + num_drafts[r] for r in req_ids),
        scheduled_spec_decode_tokens={
            r: [-1] * num_drafts[r] for r in req_ids if num_drafts[r]
        },
        num_spec_tokens_to_schedule=num_spec_tokens_to_schedule,
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
