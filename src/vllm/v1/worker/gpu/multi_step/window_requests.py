# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Which requests of a window run each step, and the step a single-step
scheduler would send for them.

A request leaves the window after its last planned step or position, or when
it samples a token that ends it in the scheduler (its EOS, one of its
stop_token_ids: the first checks of `check_stop`, vllm/v1/core/sched/utils.py).
Stops the worker cannot see (stop strings, length, repetition detection) are
found by the scheduler and the frontend, which discard what follows.

A request admitted in the window's schedule runs its prompt's share in step 1
and, where that completes the prompt, decodes with the others from step 2 on
(`prompt_shares`).

Without drafts every step runs each request one position further, so a
request's last step is known up front (`PlainRequests`). With k drafts a step
processes 1 + d positions and generates 1 + the accepted drafts, so positions
are tracked per request (`DraftedRequests`): a step verifies k drafts, fewer
only where the window's positions end (a single-step scheduler trims them at
max_model_len), and each step's (drafts, accepted) goes to the scheduler's
spec-decoding metrics.
"""

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import NamedTuple

from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput


@dataclass(frozen=True)
class WindowStart:
    """What a window's requests start from: the scheduler's window output, the
    requests its step 1 ran, and per request its stop token ids and its
    max_tokens where the scheduler's output count is exact (none under async
    scheduling: the count includes placeholders)."""

    window: SchedulerOutput
    req_ids: list[str]
    stop_ids: dict[str, frozenset[int]]
    max_tokens: dict[str, int]


class PromptShare(NamedTuple):
    """A request admitted in a window's schedule, in the window's step 1."""

    # Its computed count (prefix-cache hits) before the step.
    num_computed: int
    # Tokens of its prompt step 1 runs.
    num_tokens: int
    # Positions of step 1 that sample no token: a prompt's all but its last;
    # all of a chunk that does not complete it (it leaves after step 1).
    num_silent: int


def prompt_shares(window: SchedulerOutput) -> dict[str, PromptShare]:
    """The share of step 1 of each request a window's schedule admitted."""
    shares = {}
    for new_req in window.scheduled_new_reqs:
        num_left = len(new_req.prefill_token_ids) - new_req.num_computed_tokens
        num_tokens = min(window.num_scheduled_tokens[new_req.req_id], num_left)
        completes = num_tokens == num_left
        shares[new_req.req_id] = PromptShare(
            new_req.num_computed_tokens, num_tokens, num_tokens - completes
        )
    return shares


class WindowRequests(ABC):
    """The requests still in a window after each step."""

    def __init__(self, start: WindowStart) -> None:
        window = start.window
        cached = window.scheduled_cached_reqs
        self.window_size = window.multi_step_window
        self.num_spec_tokens_to_schedule = window.num_spec_tokens_to_schedule
        self._start = dict(zip(cached.req_ids, cached.num_computed_tokens))
        self._num_outputs = dict(zip(cached.req_ids, cached.num_output_tokens))
        # Positions the scheduler gave each request for the window, and those
        # of them that sample no token (an admitted prompt's share of step 1).
        self._num_positions = window.num_scheduled_tokens
        self._num_silent = dict.fromkeys(cached.req_ids, 0)
        for req_id, share in prompt_shares(window).items():
            # where its step 1 samples, as a decoding request's step 1 does
            self._start[req_id] = share.num_computed + share.num_silent
            self._num_outputs[req_id] = 0
            self._num_silent[req_id] = share.num_silent
        self._stop_ids = start.stop_ids
        # Request -> output tokens it may still generate, where known (an
        # admitted request's count is not: its positions bound it).
        self._tokens_left = {
            req_id: start.max_tokens[req_id] - self._num_outputs[req_id]
            if req_id in start.max_tokens and req_id in cached.req_ids
            else None
            for req_id in start.req_ids
        }
        self.num_steps = 0
        # Request -> the drafts its next step verifies.
        self.running = {
            req_id: len(window.scheduled_spec_decode_tokens.get(req_id, ()))
            for req_id in start.req_ids
        }
        # Requests that sampled one of their stop tokens in this window.
        self.stopped: set[str] = set()

    def advance(self, output: ModelRunnerOutput) -> bool:
        """Take in the step just sampled; whether any request runs another."""
        self.num_steps += 1
        self.running = self._still_running(output)
        return bool(self.running)

    def next_step(self) -> SchedulerOutput:
        """What a single-step scheduler would send next for `running`."""
        processed, generated = self._counts()
        return scheduled_inner_step(
            {r: self._start[r] + processed[r] for r in self.running},
            {r: self._num_outputs[r] + generated[r] for r in self.running},
            self.running,
            self.num_spec_tokens_to_schedule,
        )

    def spec_counts(self) -> dict[str, list[tuple[int, int]]]:
        """Per request each step's (drafts, accepted), where it had drafts."""
        return {}

    def computed_after(self, req_id: str, num_tokens: int) -> tuple[int, int]:
        """A request's computed count after the window as the scheduler
        planned it (every position it gave used), and as it is once the
        request generated `num_tokens` in the window (one position each,
        after step 1's positions that sample none)."""
        start = self._start[req_id]
        planned = start - self._num_silent[req_id] + self._num_positions[req_id]
        return planned, start + num_tokens

    @abstractmethod
    def _still_running(self, output: ModelRunnerOutput) -> dict[str, int]:
        """Those of `running` that run another step, with their drafts."""

    @abstractmethod
    def _counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per running request, the positions processed and the tokens
        generated in the window so far."""

    def _sampled_stop(self, req_id: str, sampled: list[int]) -> bool:
        """Whether `sampled` holds one of the request's stop tokens."""
        if self._stop_ids.get(req_id, frozenset()).isdisjoint(sampled):
            return False
        self.stopped.add(req_id)
        return True


class PlainRequests(WindowRequests):
    """A window without drafts: every request still in it ran every step, one
    position and one token each, so its last step is known up front."""

    def __init__(self, start: WindowStart) -> None:
        super().__init__(start)
        self._last_steps = {
            req_id: _last_plain_step(
                self.window_size,
                start.window.num_scheduled_tokens[req_id] - self._num_silent[req_id],
                self._tokens_left[req_id],
            )
            for req_id in self.running
        }
        self._window_stop_ids = frozenset().union(
            *(self._stop_ids.get(req_id, ()) for req_id in self.running)
        )

    def _still_running(self, output: ModelRunnerOutput) -> dict[str, int]:
        """A step where every request sampled a token, none of them a stop
        token, and none reached its last step leaves the window as it was:
        checked over the whole step at once, the common case costs no
        per-request work."""
        running = self.running
        token_ids = output.sampled_token_ids
        if (
            len(token_ids) == len(running)
            and all(token_ids)
            and self.num_steps < min(map(self._last_steps.__getitem__, running))
            and self._window_stop_ids.isdisjoint(chain.from_iterable(token_ids))
        ):
            return running
        tokens = dict(zip(output.req_ids, token_ids))
        still = {}
        for req_id in running:
            sampled = tokens.get(req_id)
            if not sampled:
                continue  # sampled nothing: the scheduler settles the window
            if not self._sampled_stop(req_id, sampled) and (
                self.num_steps < self._last_steps[req_id]
            ):
                still[req_id] = 0
        return still

    def _counts(self) -> tuple[dict[str, int], dict[str, int]]:
        steps = dict.fromkeys(self.running, self.num_steps)
        return steps, steps


class DraftedRequests(WindowRequests):
    """A window with up to `num_spec_tokens` drafts per step: positions and
    tokens tracked per request."""

    def __init__(self, start: WindowStart, num_spec_tokens: int) -> None:
        super().__init__(start)
        self.num_spec_tokens = num_spec_tokens
        self._progress = {
            req_id: RequestInWindow(
                start.window.num_scheduled_tokens[req_id] - self._num_silent[req_id],
                self._tokens_left[req_id],
            )
            for req_id in self.running
        }

    def _still_running(self, output: ModelRunnerOutput) -> dict[str, int]:
        tokens = dict(zip(output.req_ids, output.sampled_token_ids))
        running = {}
        for req_id, num_drafts in self.running.items():
            sampled = tokens.get(req_id)
            if not sampled:
                continue  # sampled nothing: the scheduler settles the window
            in_window = self._progress[req_id]
            in_window.record(num_drafts, len(sampled))
            if (
                not self._sampled_stop(req_id, sampled)
                and self.num_steps < self.window_size
            ):
                num_next = in_window.num_next_drafts(self.num_spec_tokens)
                if num_next is not None:
                    running[req_id] = num_next
        return running

    def _counts(self) -> tuple[dict[str, int], dict[str, int]]:
        progress = self._progress
        return (
            {r: progress[r].num_processed for r in self.running},
            {r: progress[r].num_generated for r in self.running},
        )

    def spec_counts(self) -> dict[str, list[tuple[int, int]]]:
        return {r: p.spec_counts for r, p in self._progress.items()}


@dataclass
class RequestInWindow:
    """One request's progress through a window with drafts."""

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


def _last_plain_step(
    window_size: int, num_positions: int, num_tokens_left: int | None
) -> int:
    """A request's last step in a window without drafts: each step generates
    one token at the next position."""
    if num_tokens_left is None:
        return min(window_size, num_positions)
    return min(window_size, num_positions, num_tokens_left)


def scheduled_inner_step(
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


def only(cached: CachedRequestData, req_ids: Iterable[str]) -> CachedRequestData:
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
