# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode, scheduler side: plan decode windows and settle them.

With `--num-scheduler-steps N`, one `schedule()` call may plan a window of up
to N decode steps for every running request: `window` sizes each request's
share (n positions; with k drafts up to W * (1 + k)), capped by max_tokens and
max_model_len; `after_schedule` marks the scheduler output; `settle` brings
num_computed_tokens back to what the window's steps really processed, minus
rejected drafts, and counts acceptance per inner step. A window is planned only
for a pure decode batch without structured output (docs/design.md, "Scheduler").
"""

from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

logger = init_logger(__name__)


class DecodeWindowPlanner:
    def __init__(self, scheduler: "Scheduler", num_steps: int) -> None:
        self.scheduler = scheduler
        self.num_steps = num_steps
        self.async_scheduling = bool(scheduler.scheduler_config.async_scheduling)
        self.num_spec_tokens = scheduler.num_spec_tokens
        spec = scheduler.vllm_config.speculative_config
        self.num_drafting_slots = (
            spec.max_num_new_slots_for_drafting if spec is not None else 0
        )
        # The scheduler step the window decision below was taken for, and the
        # window size it allows (1: no window this step).
        self._decided_step = -1
        self._window_size = 1

    @classmethod
    def create(cls, scheduler: "Scheduler") -> "DecodeWindowPlanner | None":
        num_steps = scheduler.scheduler_config.num_scheduler_steps
        return cls(scheduler, num_steps) if num_steps > 1 else None

    def window(self, request: Request, num_new_tokens: int) -> int:
        """Number of tokens to schedule for a running request this step.

        Called for each running request after upstream has sized its step:
        a decode request gets the window size of this step (1 for a single
        step), capped so that no position past max_tokens or max_model_len is
        scheduled. Upstream's own async check assumes at most one token in
        flight; a window puts up to N in flight, so the cap applies to every
        step, single ones included.
        """
        if self._decided_step != self.scheduler.current_step:
            self._decided_step = self.scheduler.current_step
            self._window_size = self._plan_window_size()
        if self.num_spec_tokens:
            return self._spec_window(request, num_new_tokens)
        if num_new_tokens != 1:
            return num_new_tokens  # a prompt chunk, or nothing left to compute
        # Tokens already generated or in flight count against max_tokens; the
        # last step of a window may sample the token that reaches max_model_len.
        # A window cut by these caps ends the request, so a request leaves a
        # window early only when it finishes (the worker relies on this).
        num_output_tokens = request.num_output_tokens + request.num_output_placeholders
        return max(
            0,
            min(
                self._window_size,
                request.max_tokens - num_output_tokens,
                self.scheduler.max_model_len - request.num_computed_tokens - 1,
            ),
        )

    def _spec_window(self, request: Request, num_new_tokens: int) -> int:
        """Positions for a decode request with drafts: W steps of up to 1 + k.

        Step j starts at most (j - 1) * (1 + k) past the window's start and
        writes at most 1 + k positions; before its last step a request has
        generated fewer than its remaining max_tokens, hence the caps. A
        single step, or a step upstream already trimmed, stays as it is.
        """
        # Under async scheduling the positions of the step in flight are
        # counted as computed already, and as placeholders.
        num_committed = request.num_computed_tokens - request.num_output_placeholders
        is_decode = num_committed + 1 == request.num_tokens
        if (
            self._window_size == 1
            or not is_decode
            or num_new_tokens != 1 + len(request.spec_token_ids)
        ):
            return num_new_tokens
        remaining = request.max_tokens - request.num_output_tokens
        return min(
            self._window_size * (1 + self.num_spec_tokens),
            remaining + self.num_spec_tokens,
            self.scheduler.max_model_len - request.num_computed_tokens - 1,
        )

    def _plan_window_size(self) -> int:
        """Steps per window for this schedule, or 1 if it must be a single step."""
        scheduler = self.scheduler
        num_running, num_waiting = scheduler.get_request_counts()
        if num_waiting and num_running < scheduler.max_num_running_reqs:
            return 1  # admit the waiting requests in a single step first
        for request in scheduler.running:
            if request.is_prefill_chunk or request.resumable:
                return 1
            if request.use_structured_output:
                logger.info_once(
                    "Multi-step decode: batches with structured-output requests "
                    "run one step per schedule (the grammar mask is per step)."
                )
                return 1
        # Every running request gets the same window within the token budget,
        # so none is cut short by the budget and none is starved. Upstream's
        # schedule() also charges each request's drafting slots to the input
        # budget (a draft model needs one per request), once per request.
        num_reqs = max(num_running, 1)
        budget = min(
            scheduler.max_num_scheduled_tokens,
            scheduler.scheduler_config.max_num_batched_tokens
            - num_reqs * self.num_drafting_slots,
        )
        tokens_per_step = num_reqs * (1 + self.num_spec_tokens)
        return max(1, min(self.num_steps, budget // tokens_per_step))

    def after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Mark a window in the output and reserve its async placeholders."""
        window_planned = (
            self._window_size > 1 and self._decided_step == self.scheduler.current_step
        )
        if not window_planned or not scheduler_output.num_scheduled_tokens:
            return
        assert not scheduler_output.scheduled_new_reqs, (
            "a decode window must not admit new requests"
        )
        scheduler_output.multi_step_window = self._window_size
        if not self.async_scheduling:
            return
        # The async scheduler reserves a placeholder per position of a single
        # step (1 + its drafts); a window of n positions reserves n, the most
        # tokens it can produce (settle gives back what it did not produce).
        requests = self.scheduler.requests
        drafts = scheduler_output.scheduled_spec_decode_tokens
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            num_single_step = 1 + len(drafts.get(req_id, ()))
            requests[req_id].num_output_placeholders += num_tokens - num_single_step

    def settle(
        self,
        request: Request,
        num_scheduled: int,
        generated_token_ids: list[int],
        spec_counts: list[tuple[int, int]],
        spec_decoding_stats: "SpecDecodingStats | None",
        is_stale: bool = False,
    ) -> "SpecDecodingStats | None":
        """Give back the positions a window did not keep; count its drafts.

        A window keeps one position per generated token: without drafts the
        steps it stopped short of are given back; with drafts also each
        step's rejected positions (their KV is rewritten by the next step or
        never read). `spec_counts` holds each inner step's (drafts, accepted).
        A stale window (its request was preempted after it was planned, under
        async scheduling) gives nothing back: preemption reset the counters.

        Drafts are counted for the steps a single-step engine would have run:
        those that started before the request reached max_tokens (a worker
        that cannot see that count runs on to the window's positions). Steps
        without drafts are counted by none, as upstream counts them.
        """
        num_unprocessed = num_scheduled - len(generated_token_ids)
        if num_unprocessed > 0 and not is_stale:
            request.num_computed_tokens -= num_unprocessed
            if self.async_scheduling:
                request.num_output_placeholders -= num_unprocessed
        num_tokens_left = request.max_tokens - request.num_output_tokens
        num_generated = 0
        for num_draft_tokens, num_accepted in spec_counts:
            if num_generated >= num_tokens_left:
                break
            num_generated += 1 + num_accepted
            if not num_draft_tokens:
                continue
            spec_decoding_stats = self.scheduler.make_spec_decoding_stats(
                spec_decoding_stats,
                num_draft_tokens=num_draft_tokens,
                num_accepted_tokens=num_accepted,
                num_invalid_spec_tokens=None,
                request_id=request.request_id,
            )
            if request.spec_decode_metrics is not None:
                request.spec_decode_metrics.observe(
                    num_draft_tokens=num_draft_tokens,
                    num_accepted=num_accepted,
                    detailed=self.scheduler.spec_decode_metrics_level == "detailed",
                )
        return spec_decoding_stats
