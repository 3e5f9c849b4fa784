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
speculative decoding without windows. Windows with drafts run with async
scheduling off (each step's drafts follow the previous step's accepted tokens,
which the host-side bookkeeping records).
"""

from typing import TYPE_CHECKING

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.multi_step import follow_up_step, stop_token_ids
from vllm.v1.worker.multi_step_lean import resolve_output

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

    def run(
        self, window: SchedulerOutput, first: ModelRunnerOutput, req_ids: list[str]
    ) -> tuple[list[ModelRunnerOutput], dict[str, list[tuple[int, int]]]]:
        """Run the window's later steps: every step's output, and per request
        each step's (drafts, accepted). `first` is step 1's output (the
        scheduler's own output, with its drafts)."""
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
        steps = [first]
        while True:
            step_counts = advance_requests(
                steps[-1], list(steps_left), drafts, num_computed
            )
            for req_id, (num_drafts, num_accepted) in step_counts.items():
                if num_drafts:
                    counts[req_id].append((num_drafts, num_accepted))
            self._leave_window(steps[-1], steps_left, num_computed, end)
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
        return steps, {r: c for r, c in counts.items() if c}

    def _leave_window(
        self,
        output: ModelRunnerOutput,
        steps_left: dict[str, int],
        num_computed: dict[str, int],
        end: dict[str, int],
    ) -> None:
        """Drop requests that finished, ran their steps, or have no position left."""
        requests = self.runner.requests
        for req_id in list(steps_left):
            steps_left[req_id] -= 1
            tokens = output.sampled_token_ids[output.req_id_to_index[req_id]]
            params = requests[req_id].sampling_params
            assert params is not None
            if (
                steps_left[req_id] == 0
                or not stop_token_ids(params).isdisjoint(tokens)
                or len(requests[req_id].output_token_ids) >= params.max_tokens
                or num_computed[req_id] + 1 > end[req_id]
            ):
                del steps_left[req_id]

    def _next_drafts(
        self,
        steps_left: dict[str, int],
        num_computed: dict[str, int],
        end: dict[str, int],
    ) -> dict[str, list[int]]:
        """The drafts the last step proposed, within each request's positions."""
        proposed = self.runner.take_draft_token_ids()
        by_req = (
            dict(zip(proposed.req_ids, proposed.draft_token_ids)) if proposed else {}
        )
        num_spec_tokens = self.runner.num_spec_tokens
        return {
            r: list(by_req.get(r, ()))[
                : max(0, min(num_spec_tokens, end[r] - num_computed[r] - 1))
            ]
            for r in steps_left
        }
