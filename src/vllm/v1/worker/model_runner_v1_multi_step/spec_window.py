# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode with speculative decoding: the worker's window loop.

Each inner step is the runner's own single step, `execute_model` +
`sample_tokens`, for a follow-up scheduler output that carries the drafts the
previous inner step proposed. A step that processes 1 + k tokens for a request
(its last token and k drafts) generates 1 + a of them (a drafts accepted), so
the request's next step starts a + 1 positions further: what the step
processed minus what it rejected. Positions, slot mappings and the runner's
num_computed_tokens follow from that per request, never per token row; the KV
written for rejected drafts lies at or past the next step's start, so the next
step rewrites it before attention reads it (or nothing reads it).

The scheduler gave each request W steps' worth of positions, W * (1 + k)
(vllm/v1/core/sched/multi_step.py), so no step ever trims a draft the
single-step scheduler would keep: the drafts, and so the tokens, are those of
speculative decoding without windows.

Each step's drafts follow the previous step's accepted tokens, which the
runner's host-side bookkeeping records, so with windows and drafts the runner
keeps its synchronous path even under async scheduling
(`runner_async_scheduling`). The engine still plans step t+1 while step t
runs; `correct_optimistic_step` turns what it planned into what a synchronous
scheduler would have sent.
"""

from dataclasses import replace
from typing import TYPE_CHECKING

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.model_runner_v1_multi_step.steps import follow_up_step
from vllm.v1.worker.window_output import resolve_output, stop_token_ids

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


def next_num_computed(num_computed: int, num_processed: int, num_rejected: int) -> int:
    """Where a request's next inner step starts.

    The step processed `num_processed` positions (its last token and its
    drafts); the rejected drafts' positions are given back. Advancing by the
    accepted drafts alone would drop the bonus token and repeat a position;
    advancing by the processed count alone would skip positions whose KV
    holds rejected drafts.
    """
    return num_computed + num_processed - num_rejected


def advance_requests(
    output: ModelRunnerOutput,
    req_ids: list[str],
    drafts: dict[str, list[int]],
    num_computed: dict[str, int],
) -> dict[str, tuple[int, int]]:
    """Advance each request once by its own step result; its (drafts, accepted).

    Rows are found through the output's req_id_to_index, one per request,
    whatever the step's token layout (1 + k token rows per request).
    """
    counts = {}
    for req_id in req_ids:
        tokens = output.sampled_token_ids[output.req_id_to_index[req_id]]
        assert tokens, f"a decode step sampled nothing for {req_id}"
        num_drafts = len(drafts.get(req_id, ()))
        num_accepted = len(tokens) - 1
        num_computed[req_id] = next_num_computed(
            num_computed[req_id], 1 + num_drafts, num_drafts - num_accepted
        )
        counts[req_id] = (num_drafts, num_accepted)
    return counts


class SpecDecodeWindow:
    def __init__(self, runner: "GPUModelRunner") -> None:
        self.runner = runner

    def correct_optimistic_step(
        self, scheduler_output: SchedulerOutput
    ) -> SchedulerOutput:
        """The step a synchronous scheduler would have sent.

        The async scheduler plans step t+1 before step t's output reaches it: as
        if step t had accepted all its drafts (used all its window's positions),
        with placeholder drafts (-1). Upstream's async runner corrects both on the
        device; this runner keeps exact host state, so the step is corrected
        before it runs: a decoding request starts at its last sampled token
        (every earlier one is computed), with the drafts step t proposed for it.
        A step's positions stay as planned: their KV slots were allocated from the
        optimistic start, never before the true one. The scheduler settles its
        own counters from the outputs, as it does for upstream's async steps.
        """
        cached = scheduler_output.scheduled_cached_reqs
        num_computed = list(cached.num_computed_tokens)
        num_output = list(cached.num_output_tokens)
        for i, req_id in enumerate(cached.req_ids):
            req_state = self.runner.requests.get(req_id)
            if (
                req_state is None
                or req_id in cached.resumed_req_ids
                or not req_state.output_token_ids
            ):
                continue  # a prompt chunk's start is never optimistic
            num_computed[i] = req_state.num_tokens - 1
            num_output[i] = len(req_state.output_token_ids)
        placeholders = scheduler_output.scheduled_spec_decode_tokens
        by_req = self._proposed_drafts() if placeholders else {}
        drafts = {
            r: list(by_req.get(r, ()))[: len(p)]
            for r, p in placeholders.items()
            if by_req.get(r)
        }
        num_scheduled = dict(scheduler_output.num_scheduled_tokens)
        if not scheduler_output.multi_step_window:
            # A request absent from step t has no drafts from it: fewer tokens.
            for req_id, p in placeholders.items():
                num_scheduled[req_id] -= len(p) - len(drafts.get(req_id, ()))
        return replace(
            scheduler_output,
            scheduled_cached_reqs=replace(
                cached, num_computed_tokens=num_computed, num_output_tokens=num_output
            ),
            scheduled_spec_decode_tokens=drafts,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
        )

    def run(
        self, window: SchedulerOutput, first: ModelRunnerOutput, req_ids: list[str]
    ) -> tuple[list[ModelRunnerOutput], dict[str, list[tuple[int, int]]], set[str]]:
        """Run the window's later steps: every step's output, per request each
        step's (drafts, accepted), and the requests that finished. `first` is
        step 1's output (the scheduler's own output, with its drafts)."""
        cached = window.scheduled_cached_reqs
        num_computed = {
            r: c
            for r, c in zip(cached.req_ids, cached.num_computed_tokens)
            if r in req_ids
        }
        end = {
            r: num_computed[r] + window.num_scheduled_tokens[r] for r in num_computed
        }
        steps_left = dict.fromkeys(num_computed, window.multi_step_window)
        drafts = {
            r: list(window.scheduled_spec_decode_tokens.get(r, ()))
            for r in num_computed
        }
        counts: dict[str, list[tuple[int, int]]] = {r: [] for r in num_computed}
        finished: set[str] = set()
        steps = [first]
        while True:
            step_counts = advance_requests(
                steps[-1], list(steps_left), drafts, num_computed
            )
            for req_id, (num_drafts, num_accepted) in step_counts.items():
                if num_drafts:
                    counts[req_id].append((num_drafts, num_accepted))
            finished |= self._leave_window(steps[-1], steps_left, num_computed, end)
            if not steps_left:
                break
            drafts = self._next_drafts(steps_left, num_computed, end)
            step = follow_up_step(
                self.runner.requests,
                {r: num_computed[r] for r in steps_left},
                drafts,
                window.num_spec_tokens_to_schedule,
            )
            assert self.runner.execute_model(step) is None, "an inner step must sample"
            steps.append(resolve_output(self.runner.sample_tokens(None)))
        return steps, {r: c for r, c in counts.items() if c}, finished

    def _leave_window(
        self,
        output: ModelRunnerOutput,
        steps_left: dict[str, int],
        num_computed: dict[str, int],
        end: dict[str, int],
    ) -> set[str]:
        """Drop requests that finished, ran their steps, or have no position
        left; the ones that finished (a stop token, max_tokens or
        max_model_len reached)."""
        finished = set()
        for req_id in list(steps_left):
            steps_left[req_id] -= 1
            tokens = output.sampled_token_ids[output.req_id_to_index[req_id]]
            req_state = self.runner.requests[req_id]
            params = req_state.sampling_params
            assert params is not None
            if (
                not stop_token_ids(params).isdisjoint(tokens)
                or len(req_state.output_token_ids) >= params.max_tokens
                or req_state.num_tokens >= self.runner.max_model_len
            ):
                finished.add(req_id)
            if (
                req_id in finished
                or steps_left[req_id] == 0
                or num_computed[req_id] + 1 > end[req_id]
            ):
                del steps_left[req_id]
        return finished

    def _next_drafts(
        self,
        steps_left: dict[str, int],
        num_computed: dict[str, int],
        end: dict[str, int],
    ) -> dict[str, list[int]]:
        """The drafts the last step proposed, within each request's positions."""
        by_req = self._proposed_drafts()
        num_spec_tokens = self.runner.num_spec_tokens
        return {
            r: list(by_req.get(r, ()))[
                : max(0, min(num_spec_tokens, end[r] - num_computed[r] - 1))
            ]
            for r in steps_left
        }

    def _proposed_drafts(self) -> dict[str, list[int]]:
        """The drafts the runner's last step proposed, by request."""
        proposed = self.runner.take_draft_token_ids()
        if proposed is None:
            return {}
        return dict(zip(proposed.req_ids, proposed.draft_token_ids))
