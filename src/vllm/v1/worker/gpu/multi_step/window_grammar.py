# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Structured output inside a window: each inner step's grammar mask.

Upstream masks a structured-output request's logits with the bitmask the
engine core's StructuredOutputManager fills once per engine step, from the
tokens its grammar has accepted. Inside a window the engine core sees the
tokens only when the window returns. So the worker keeps its own copy of each
such request's grammar: upstream's StructuredOutputManager, run in the worker
with the same backend, tokenizer, stop tokens and reasoning parser, fed every
token the request samples. Step 1 is masked by the engine core's bitmask, as
a single step is; each inner step by the worker's copy, which by then has
accepted the same tokens the engine core's would have in single steps (one
at a time, reasoning included). After the window the engine core's grammar
accepts the window's tokens (a rejection is logged there as the bug it is).

A copy catches up at a window's step 1 from the runner's own token history,
so the steps between windows cost nothing here. Where the scheduler leaves a
window's step 1 to the worker (its requests' copies followed them through
their last window), the copies catch up before step 1 and replace the engine
core's rows, which it filled without waiting for the tokens in flight.
Within the window a copy advances on each inner step's tokens, which the
window reads on the host anyway (to see stops): structured requests add no
sync and no round trip to the engine core, only the bitmask fill and its copy
to the device per inner step.

Where a copy cannot follow its request (its grammar did not compile in the
worker, or it rejected a sampled token), the window ends after the step in
flight, as when a request arrives: the scheduler takes back the positions,
and the tokens stay those of single steps.
"""

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from vllm.logger import init_logger
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.structured_output.request import StructuredOutputRequest

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

logger = init_logger(__name__)

# How long a window waits for a grammar the worker compiles (the engine core
# compiled the same grammar before it scheduled the request).
COMPILE_TIMEOUT_S = 300.0


@dataclass
class GrammarRequest:
    """What upstream's StructuredOutputManager reads of a request: the worker's
    stand-in for the engine core's Request, with the tokens fed so far."""

    request_id: str
    sampling_params: "SamplingParams"
    prompt_token_ids: list[int]
    structured_output_request: StructuredOutputRequest
    # The prompt, then every output token fed to the grammar copy.
    _all_token_ids: list[int] = field(default_factory=list)
    use_structured_output: bool = True

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids


@dataclass
class _Created:
    """A structured-output request as the engine core created it: what its
    grammar copy is rebuilt from when it comes back after preemption."""

    sampling_params: "SamplingParams"
    prompt_token_ids: list[int]
    reasoning_ended: bool | None
    reasoning_parser_kwargs: dict[str, Any] | None


class WindowGrammars:
    """The worker's copies of its structured-output requests' grammars."""

    def __init__(self, vllm_config: "VllmConfig") -> None:
        self.vllm_config = vllm_config
        # Built at the first structured-output request (it loads a tokenizer).
        self._manager: StructuredOutputManager | None = None
        self._created: dict[str, _Created] = {}
        self._requests: dict[str, GrammarRequest] = {}
        # Requests whose copy cannot follow them: their windows end after
        # step 1. Logged once each.
        self._lost: set[str] = set()

    def track(self, scheduler_output: SchedulerOutput) -> None:
        """Start a copy of each structured-output request the step adds (a
        request resumed after preemption starts a new one), drop the copies
        of finished requests."""
        reasoning = scheduler_output.multi_step_reasoning or {}
        for new_req in scheduler_output.scheduled_new_reqs:
            req_id = new_req.req_id
            if req_id not in reasoning:
                continue
            created = self._created.get(req_id)
            if created is None and new_req.prompt_token_ids is not None:
                assert new_req.sampling_params is not None
                created = self._created[req_id] = _Created(
                    new_req.sampling_params,
                    list(new_req.prompt_token_ids),
                    *reasoning[req_id],
                )
            self._requests.pop(req_id, None)
            if created is not None:
                self._start_copy(req_id, created)
        for req_id in scheduler_output.finished_req_ids:
            self._created.pop(req_id, None)
            self._requests.pop(req_id, None)
            self._lost.discard(req_id)

    def start(
        self,
        grammar_output: GrammarOutput | None,
        req_ids: list[str],
        model_runner: Any,
    ) -> "WindowMasks":
        """The masks of the inner steps of a window whose step 1 ran `req_ids`,
        its copies caught up with every token sampled up to step 1
        (`grammar_output`: step 1's masks, from the engine core; None where
        step 1 masked no request, and so none of the window's steps is)."""
        if grammar_output is None:
            return WindowMasks(self, [])
        in_step = set(req_ids)
        followed = []
        for req_id in grammar_output.structured_output_request_ids:
            if req_id not in in_step:
                continue  # stopped in the window before (async scheduling)
            if req_id in self._lost or not self._catch_up(req_id, model_runner):
                return WindowMasks(self, [], lost=True)
            followed.append(req_id)
        return WindowMasks(self, followed)

    def mask_step_one(
        self,
        grammar_output: GrammarOutput | None,
        worker_masks: list[str],
        req_ids: list[str],
        model_runner: Any,
    ) -> GrammarOutput | None:
        """Step 1's masks (`grammar_output`, the engine core's, one row per
        request) for the requests step 1 runs (`req_ids`), with the rows of
        `worker_masks` filled from their copies, caught up with every token
        sampled before step 1. The engine core filled its bitmask before it
        took in the window before: those rows from grammars a window behind,
        and rows for requests that stopped there, which step 1 leaves out. A
        copy that cannot follow leaves its row unmasked, logged: it is a bug
        (the scheduler names only requests whose copies followed them
        through a window)."""
        if grammar_output is None:
            return None
        in_step = set(req_ids)
        kept = [
            (row, req_id)
            for row, req_id in enumerate(grammar_output.structured_output_request_ids)
            if req_id in in_step
        ]
        if not kept:
            return None
        rows = [req_id for _, req_id in kept]
        engine_rows = grammar_output.grammar_bitmask
        assert len(engine_rows) == len(grammar_output.structured_output_request_ids), (
            "one row per request: no drafts in a structured window"
        )
        bitmask = engine_rows[[row for row, _ in kept]]  # a copy
        index = {req_id: row for row, req_id in enumerate(rows)}
        # the engine core's rows name the same requests (same filter, same step)
        mine = [req_id for req_id in worker_masks if req_id in index]
        followed = [
            req_id
            for req_id in mine
            if req_id not in self._lost and self._catch_up(req_id, model_runner)
        ]
        filled = self.masks(followed).grammar_bitmask if followed else ()
        for req_id, row in zip(followed, filled):
            bitmask[index[req_id]] = row
        for req_id in set(mine).difference(followed):
            bitmask[index[req_id]] = -1  # every token allowed
            logger.error(
                "Multi-step decode: step 1 of a window sampled request %s "
                "without its grammar mask: the worker's copy cannot follow it.",
                req_id,
            )
        return GrammarOutput(rows, bitmask)

    def _start_copy(self, req_id: str, created: _Created) -> None:
        """A new copy of the request's grammar, compiled in the background."""
        structured_request = StructuredOutputRequest.from_sampling_params(
            created.sampling_params
        )
        if structured_request is None:
            return
        structured_request.reasoning_ended = created.reasoning_ended
        structured_request.reasoning_parser_kwargs = created.reasoning_parser_kwargs
        copy = GrammarRequest(
            req_id,
            created.sampling_params,
            created.prompt_token_ids,
            structured_request,
            list(created.prompt_token_ids),
        )
        try:
            if self._manager is None:
                self._manager = StructuredOutputManager(self.vllm_config)
            manager = self._manager
            manager.grammar_init(cast("Request", copy))
        except Exception:
            self._lose(req_id, "its grammar could not be built in the worker", True)
            return
        self._requests[req_id] = copy

    def _catch_up(self, req_id: str, model_runner: Any) -> bool:
        """Feed a copy the tokens its request sampled since it was last fed;
        False where it cannot follow the request."""
        copy = self._requests.get(req_id)
        if copy is None:
            return self._lose(req_id, "the worker holds no copy of its grammar")
        # Compiled in the background since the request came (grammar_init).
        structured_request = copy.structured_output_request
        pending = structured_request._grammar
        if isinstance(pending, Future):
            try:
                pending.result(timeout=COMPILE_TIMEOUT_S)
            except Exception:
                return self._lose(
                    req_id, "its grammar did not compile in the worker", True
                )
        history, num_tokens = _token_history(model_runner, req_id)
        start = len(copy.all_token_ids)
        if num_tokens < start:
            return self._lose(req_id, "its token history is shorter than the copy's")
        return self.feed(req_id, history[start:num_tokens].tolist())

    def feed(self, req_id: str, token_ids: list[int]) -> bool:
        """Advance a copy by tokens its request sampled, one at a time as
        single steps feed the engine core's; False where it rejects one."""
        copy = self._requests[req_id]
        manager = self._manager
        assert manager is not None
        for token_id in token_ids:
            copy.all_token_ids.append(token_id)
            if not manager.accept_tokens(cast("Request", copy), [token_id]):
                return self._lose(req_id, f"its grammar copy rejected token {token_id}")
        return True

    def masks(self, req_ids: list[str]) -> GrammarOutput:
        """The bitmask rows of the next inner step of `req_ids`, from their
        copies as upstream's manager fills the engine core's."""
        manager = self._manager
        assert manager is not None
        requests = cast("dict[str, Request]", self._requests)
        bitmask = manager.grammar_bitmask(requests, req_ids, {})
        assert bitmask is not None
        return GrammarOutput(req_ids, bitmask)

    def _lose(self, req_id: str, why: str, raised: bool = False) -> bool:
        """Give up following a request: its windows end after step 1."""
        self._requests.pop(req_id, None)
        if req_id not in self._lost:
            self._lost.add(req_id)
            logger.error(
                "Multi-step decode: structured-output request %s runs single "
                "steps from here: %s.",
                req_id,
                why,
                exc_info=raised,
            )
        return False


class WindowMasks:
    """The grammar masks of one window's inner steps."""

    def __init__(
        self, grammars: WindowGrammars, req_ids: list[str], lost: bool = False
    ) -> None:
        self._grammars = grammars
        self._req_ids = set(req_ids)
        # Whether a copy cannot follow its request: the window ends.
        self.lost = lost

    def next_step(self, running: "dict[str, int] | list[str]") -> GrammarOutput | None:
        """The masks of the inner step of `running` (None: no request in it
        is masked)."""
        if not self._req_ids:
            return None  # a window without structured requests: no work per step
        req_ids = [req_id for req_id in running if req_id in self._req_ids]
        return self._grammars.masks(req_ids) if req_ids else None

    def followed(self) -> list[str] | None:
        """The requests whose copies followed them through the window (None:
        it held no structured-output request)."""
        return sorted(self._req_ids) if self._req_ids or self.lost else None

    def accept(self, step: ModelRunnerOutput) -> None:
        """Feed each copy the token its request sampled in the inner step."""
        if not self._req_ids:
            return
        for req_id, token_ids in zip(step.req_ids, step.sampled_token_ids):
            followed = req_id in self._req_ids and token_ids
            if followed and not self._grammars.feed(req_id, token_ids):
                self._req_ids.discard(req_id)
                self.lost = True


def _token_history(model_runner: Any, req_id: str) -> tuple[torch.Tensor, int]:
    """A request's row of the runner's token history (prompt, then every
    sampled token) and its length."""
    req_states = model_runner.req_states
    index = req_states.req_id_to_index[req_id]
    all_token_ids, total_len = req_states.all_token_ids, req_states.total_len
    if isinstance(total_len, torch.Tensor):
        # StandaloneCPUModelRunner: host tensors.
        return all_token_ids[index], int(total_len[index])
    # GPUModelRunner: staged writes; the token ids are host memory the device
    # maps (UVA) unless a drafter keeps them on the device.
    return all_token_ids.gpu[index], int(total_len.gpu[index])
