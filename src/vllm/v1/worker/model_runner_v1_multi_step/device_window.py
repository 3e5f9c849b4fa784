# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode: windows that stay on the device.

A window's step 1 is the runner's own step. Its inner steps 2..n run here, in
a loop that never leaves the device between steps: the inputs of step s + 1
are advanced in place from step s (input ids from its sampled tokens,
positions and seq lens by one for the requests still going, the KV slots of
the whole window computed once from the block table), then forward, logits
and upstream's own `Sampler` on device-resident state. The host sees the
window once, at the end: one copy of its tokens (and logprob rows), one bulk
update of the runner's host state (token ids, output token lists, counters),
exactly what n - 1 single steps' bookkeeping would have left.

Sampling gets what upstream's sampler gets at each step:
- temperature, top-k/top-p, min-p, logit_bias, allowed token ids and the
  seeded generators are the batch's own (they do not change while its rows
  do not), so upstream's `Sampler.forward` applies them unchanged, and each
  seeded request draws from its generator once per step, in row order;
- the penalties read the output history: it is kept as a device tensor (pad =
  vocab size, as upstream pads) that each step appends to, and applied with
  upstream's `apply_penalties` at the point upstream applies them (after the
  other non-argmax-invariant processors);
- min_tokens masks the stop tokens of a request while it has fewer output
  tokens than its min_tokens, counted on the device per step.

Stops are found on the device: a request stops at EOS (unless ignored) or one
of its stop_token_ids once it has min_tokens, or when its planned steps run
out (the scheduler plans fewer only at max_tokens / max_model_len). A stopped
request keeps its row to the end of the window, frozen at its last position,
with no KV slot (-1) so its extra forwards write nothing; its extra tokens
are dropped. The loop reads the alive mask every `stop_check_interval` steps
and ends once no request is left. Stop strings are found by the frontend as
for any window.

What the loop does not cover (bad_words, custom logits processors, explicit
logprob token ids, thinking budgets, full-vocabulary logprobs, NaN counting,
speculative decoding) runs the step-by-step path of window.py; so does
any batch the lean step does not apply to. `uncovered` names the reason.
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

import vllm.envs as envs
from vllm.model_executor.layers.utils import apply_penalties
from vllm.utils.torch_utils import async_tensor_h2d, make_tensor_with_pad
from vllm.v1.outputs import AsyncModelRunnerOutput, LogprobsLists, ModelRunnerOutput
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import (
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
)
from vllm.v1.worker.model_runner_v1_multi_step.lean_step import last_sampled
from vllm.v1.worker.window_output import resolve_output

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.model_runner_v1_multi_step.lean_step import LeanDecodeStep

# Logits processors whose state depends only on the batch's requests, not on
# the tokens they generate, so the window applies them as they are.
_CONSTANT_PROCESSORS = (LogitBiasLogitsProcessor, MinPLogitsProcessor)


@dataclass
class WindowResult:
    """A device window's merged output and the requests that finished in it."""

    output: ModelRunnerOutput
    finished: set[str]


class DeviceWindow:
    def __init__(
        self, runner: "GPUModelRunner", lean: "LeanDecodeStep", stop_check_interval: int
    ) -> None:
        self.runner = runner
        self.lean = lean
        self.stop_check_interval = stop_check_interval

    def uncovered(self, req_ids: list[str]) -> str | None:
        """Why this window's inner steps cannot run on the device, or None.

        Called after step 1 ran, with the window's requests.
        """
        runner = self.runner
        if runner.speculative_config is not None:
            return "speculative decoding"
        if not self.lean.applies(req_ids):
            return "the batch is not the window's rows"
        meta = runner.input_batch.sampling_metadata
        if meta.bad_words_token_ids:
            return "bad_words"
        if meta.logprob_token_ids:
            return "logprob token ids"
        if meta.max_num_logprobs == -1:
            return "full-vocabulary logprobs"
        holder = meta.thinking_budget_state_holder
        if holder is not None and holder.has_tracked_requests():
            return "thinking budget"
        for processor in meta.logitsprocs.all:
            if isinstance(processor, MinTokensLogitsProcessor):
                if any(entry[3] for entry in processor.min_toks.values()):
                    return "min_tokens with structured output"
            elif not isinstance(processor, _CONSTANT_PROCESSORS):
                return "custom logits processors"
        if envs.VLLM_COMPUTE_NANS_IN_LOGITS:
            return "VLLM_COMPUTE_NANS_IN_LOGITS"
        return None

    def run(
        self,
        window: "SchedulerOutput",
        inner_step: "SchedulerOutput",
        first_step: ModelRunnerOutput | AsyncModelRunnerOutput,
        cut: set[str],
        stops: dict[str, frozenset[int]],
    ) -> WindowResult:
        """Run steps 2..n of `window` on the device; `first_step` is step 1's
        output (its sampled tokens are the input of step 2; under async
        scheduling it is read only after the loop, so step 1 costs no sync).

        `inner_step` is the window's one-token follow-up scheduler output (what
        the attention metadata and input preparation read); `cut` the
        requests whose window the scheduler shortened (they finish with it);
        `stops` each request's stop token ids.
        """
        runner = self.runner
        req_ids = list(runner.input_batch.req_ids)
        arrays = _Arrays(runner.device)
        inputs = _StepInputs(runner, len(req_ids), arrays)
        state = _WindowState.start(
            runner, window, first_step, req_ids, stops, inputs, arrays
        )
        sampling = _window_sampling_metadata(
            runner.input_batch.sampling_metadata, state
        )

        num_steps = 1  # step 1 ran
        shape = None
        logprobs = []
        for step in range(1, state.num_steps):
            inputs.write(state)
            if shape is None:
                # The window's slot table starts at this step's positions.
                shape = self.lean.shape(first_position=0)
            shape.write_slot_mappings(step - 1, state.alive_tensor)
            _, logits = self.lean.forward(inner_step, shape)
            sampler_output = runner.sampler(logits=logits, sampling_metadata=sampling)
            if sampler_output.logprobs_tensors is not None:
                logprobs.append(sampler_output.logprobs_tensors)
            state.advance(step, sampler_output.sampled_token_ids[:, 0])
            num_steps += 1
            if step % self.stop_check_interval == 0 and not state.alive.any():
                break

        # The window's one device-to-host copy.
        inner = state.host_results(num_steps)
        first = resolve_output(first_step)
        output = _merged_output(first, inner, logprobs)
        _update_host_state(runner, req_ids, first, inner, state)
        finished = {
            req_id
            for i, req_id in enumerate(req_ids)
            if inner.stopped[i]
            or (req_id in cut and inner.num_tokens[i] == inner.budget[i])
        }
        return WindowResult(output, finished)


@dataclass
class _HostResults:
    """The window's device state, copied to the host once at its end."""

    tokens: np.ndarray  # [inner steps, rows] sampled tokens
    valid: np.ndarray  # [inner steps, rows] the row was still going
    stopped: np.ndarray  # [rows] stopped at a stop token
    num_tokens: np.ndarray  # [rows] tokens generated in the window (step 1 too)
    budget: np.ndarray  # [rows] planned steps
    last_positions: np.ndarray  # [rows] each row's position at its last step


class _Arrays:
    """What the window's per-step arithmetic runs on.

    On a CPU the device is host memory: the state is numpy views of the
    device tensors, because a numpy op costs a fraction of a torch op's
    dispatch (one inner step's bookkeeping at 32 rows: 16 us against 60 us,
    measured, beside a forward of about 1 ms). Elsewhere it is the tensors.
    Both take the same indexing and operators, so the state's code is one.
    """

    def __init__(self, device: torch.device, on_host: bool | None = None) -> None:
        self.device = device
        self.on_host = device.type == "cpu" if on_host is None else on_host

    def view(self, tensor: torch.Tensor):
        return tensor.numpy() if self.on_host else tensor

    def from_host(self, data, dtype: torch.dtype):
        """A new device array holding `data` (a copy, never an alias)."""
        host = torch.as_tensor(np.asarray(data)).to(dtype)
        return self.view(host.to(self.device, copy=True, non_blocking=True))

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype):
        return self.view(torch.zeros(shape, dtype=dtype, device=self.device))

    def as_int64(self, array):
        # numpy casts on assignment; torch's index_put_ needs matching dtypes.
        return array if self.on_host else array.long()

    def to_host(self, array) -> np.ndarray:
        return np.array(array) if self.on_host else array.cpu().numpy()


class _StepInputs:
    """The runner's input buffers for the window's rows, as `_Arrays` views.

    Each inner step writes the input ids and seq lens; the positions buffer
    holds the window's position state, advanced in place. The computed
    counts are not written per step: only a full step's input preparation
    reads them, and the window's end sets them (the attention metadata's
    prefill flag reads their host copy: false for decode rows throughout).
    """

    def __init__(
        self, runner: "GPUModelRunner", num_reqs: int, arrays: _Arrays
    ) -> None:
        self.input_ids = arrays.view(runner.input_ids.gpu[:num_reqs])
        self.positions = arrays.view(runner.positions[:num_reqs])
        self.seq_lens = arrays.view(runner.seq_lens[:num_reqs])
        # A host tensor on every device: max_seq_len and the upper bound.
        self.seq_lens_host = runner.optimistic_seq_lens_cpu[:num_reqs].numpy()

    def write(self, state: "_WindowState") -> None:
        """The next step's input ids and seq lens, from `state`."""
        self.input_ids[...] = state.arrays.view(state.last)
        self.seq_lens[...] = state.positions + 1
        # On a CPU the host copy is the exact seq lens; elsewhere the host
        # cannot know which rows stopped without a sync, so it holds bounds
        # (a stopped row is frozen below them).
        if state.arrays.on_host:
            self.seq_lens_host[...] = self.seq_lens
        else:
            self.seq_lens_host[...] = state.upper_positions + 1
            state.upper_positions += 1


class _WindowState:
    """Per-row device state the inner steps advance (as `_Arrays`)."""

    def __init__(
        self,
        arrays: _Arrays,
        last: torch.Tensor,
        positions,
        start_positions: list[int],
        budget: list[int],
        min_tokens: list[int],
        num_output: list[int],
        stop_ids: list[list[int]],
    ) -> None:
        """`last`: step 1's sampled token per row (step 2's input ids);
        `positions`: the array to hold each row's position, set here to
        `start_positions` (step 2's); `budget`: each row's planned steps;
        `num_output`: its output tokens before step 1."""
        self.arrays = arrays
        num_reqs = len(budget)
        self.num_steps = max(budget)
        self.budget = np.asarray(budget)  # host: the scheduler's plan
        self.last = last  # a torch tensor either way (the sampler's output)
        self.positions = positions
        self.positions[...] = arrays.from_host(start_positions, torch.int64)
        self.upper_positions = np.array(start_positions, dtype=np.int64)
        self.rows = arrays.view(torch.arange(num_reqs, device=arrays.device))
        self._start_tables(budget, min_tokens, num_output)
        width = max(1, max(len(ids) for ids in stop_ids))
        self.stop_ids = arrays.view(
            make_tensor_with_pad(
                stop_ids, pad=-1, dtype=torch.int32, max_len=width,
                device=arrays.device,
            )
        )  # fmt: skip
        self.stopped = arrays.zeros((num_reqs,), torch.bool)
        self.stopped[...] = self._stops(0, arrays.view(last))
        # The slot mappings mask with it: a torch view of the same memory.
        self.alive_tensor = torch.zeros(
            num_reqs, dtype=torch.bool, device=arrays.device
        )
        self.alive = arrays.view(self.alive_tensor)
        self.alive[...] = ~self.stopped & self.goes_on[0]
        steps = self.num_steps - 1
        self.tokens = arrays.zeros((steps, num_reqs), torch.int32)  # [step, row]
        self.valid = arrays.zeros((steps, num_reqs), torch.bool)
        self.history: torch.Tensor | None = None  # penalties' output tokens
        self.min_tokens_mask: _MinTokensMask | None = None

    @classmethod
    def start(
        cls,
        runner: "GPUModelRunner",
        window: "SchedulerOutput",
        first_step: ModelRunnerOutput | AsyncModelRunnerOutput,
        req_ids: list[str],
        stops: dict[str, frozenset[int]],
        inputs: _StepInputs,
        arrays: _Arrays,
    ) -> "_WindowState":
        batch = runner.input_batch
        params = [runner.requests[r].sampling_params for r in req_ids]
        num_output = [len(runner.requests[r].output_token_ids) for r in req_ids]
        cached = window.scheduled_cached_reqs
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens))
        s = cls(
            arrays,
            last=last_sampled(runner, first_step),
            positions=inputs.positions,
            # Step 1 processed the token at each request's computed position.
            start_positions=[computed[r] + 1 for r in req_ids],
            budget=[window.num_scheduled_tokens[r] for r in req_ids],
            min_tokens=[p.min_tokens if p is not None else 0 for p in params],
            num_output=num_output,
            stop_ids=[sorted(stops[r]) for r in req_ids],
        )
        meta = batch.sampling_metadata
        if not meta.no_penalties:
            s.start_history(meta.output_token_ids, batch.vocab_size)
        s.min_tokens_mask = _MinTokensMask.of(meta, num_output, runner.device)
        return s

    def _start_tables(
        self, budget: list[int], min_tokens: list[int], num_output: list[int]
    ) -> None:
        """`may_stop` and `goes_on` for every step of the window, [step, row].

        After step `step` (0: the window's step 1) a row has num_output + step
        output tokens: a stop token ends it once that reaches min_tokens (the
        scheduler's check_stop), and it runs on while step + 1 < its budget.
        """
        steps = np.arange(max(budget))[:, None]
        first_stop = np.asarray(min_tokens) - np.asarray(num_output)
        self.may_stop = self.arrays.from_host(steps >= first_stop, torch.bool)
        self.goes_on = self.arrays.from_host(steps + 1 < np.asarray(budget), torch.bool)

    def _stops(self, step: int, tokens):
        hit = (self.stop_ids == tokens[:, None]).any(1)
        return hit & self.may_stop[step]

    def start_history(self, lists: list[list[int]], vocab_size: int) -> None:
        """The penalties' output-token tensor, with room for the window.

        Each row's tokens are left-aligned, the rest is `vocab_size` (no
        token), as in upstream's padded tensor. Step 1's token may still be
        an async placeholder (-1) in the lists: it is written from the
        device. Other placeholders mean no token, as upstream treats them.
        """
        arrays = self.arrays
        lengths = [len(tokens) for tokens in lists]
        width = max(lengths) + self.num_steps - 1
        history = make_tensor_with_pad(
            lists, pad=vocab_size, dtype=torch.int64, max_len=width
        )
        history.masked_fill_(history == -1, vocab_size)
        self.history = history.to(arrays.device, non_blocking=True)
        self._history = arrays.view(self.history)
        # The column of each row's step-1 token.
        self._history_end = arrays.from_host(lengths, torch.int64) - 1
        self._history[self.rows, self._history_end] = arrays.as_int64(
            arrays.view(self.last)
        )

    def advance(self, step: int, sampled: torch.Tensor) -> None:
        """Take step `step`'s tokens (inner steps count from 1)."""
        tokens = self.arrays.view(sampled)
        self.tokens[step - 1] = tokens
        self.valid[step - 1] = self.alive
        stopped = self._stops(step, tokens) & self.alive
        self.stopped |= stopped
        self.alive &= self.goes_on[step] & ~stopped
        if self.history is not None:
            column = self._history_end + step
            self._history[self.rows, column] = self.arrays.as_int64(tokens)
        self.last = sampled
        self.positions += self.alive

    def host_results(self, num_steps: int) -> _HostResults:
        to_host = self.arrays.to_host
        valid = to_host(self.valid[: num_steps - 1])
        return _HostResults(
            tokens=to_host(self.tokens[: num_steps - 1]),
            valid=valid,
            stopped=to_host(self.stopped),
            num_tokens=1 + valid.sum(axis=0),
            budget=self.budget,
            last_positions=to_host(self.positions),
        )


class _MinTokensMask:
    """min_tokens on the device: the stop tokens of a row are masked while
    it has fewer output tokens than its min_tokens.

    Built from upstream's MinTokensLogitsProcessor state at the window's
    start: its (row, stop token) pairs and each pair's missing count.
    """

    def __init__(
        self, rows: torch.Tensor, tokens: torch.Tensor, missing: torch.Tensor
    ) -> None:
        self.rows = rows
        self.tokens = tokens
        self.missing = missing
        self.step = 0
        self.neg_inf = torch.tensor(-float("inf"), device=rows.device)

    @classmethod
    def of(
        cls, meta: "SamplingMetadata", num_output: list[int], device: torch.device
    ) -> "_MinTokensMask | None":
        rows, tokens, missing = [], [], []
        for processor in meta.logitsprocs.non_argmax_invariant:
            if not isinstance(processor, MinTokensLogitsProcessor):
                continue
            for row, (min_toks, _, stop_ids, _) in processor.min_toks.items():
                for token in stop_ids:
                    rows.append(row)
                    tokens.append(token)
                    missing.append(min_toks - num_output[row])
        if not rows:
            return None
        return cls(
            async_tensor_h2d(rows, device, torch.int64),
            async_tensor_h2d(tokens, device, torch.int64),
            async_tensor_h2d(missing, device, torch.int32),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        # Before inner step `step + 1` samples, a row has `step` more output
        # tokens than at the window's start.
        masked = self.missing > self.step
        current = logits[self.rows, self.tokens]
        logits[self.rows, self.tokens] = torch.where(masked, self.neg_inf, current)
        self.step += 1
        return logits


class _Penalties:
    """Upstream's penalties over the window's device-resident history."""

    def __init__(self, meta: "SamplingMetadata", state: _WindowState) -> None:
        self.meta = meta
        self.state = state

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        assert meta.prompt_token_ids is not None and self.state.history is not None
        return apply_penalties(
            logits,
            meta.prompt_token_ids,
            self.state.history,
            meta.presence_penalties,
            meta.frequency_penalties,
            meta.repetition_penalties,
        )


def _window_sampling_metadata(
    meta: "SamplingMetadata", state: _WindowState
) -> "SamplingMetadata":
    """The batch's sampling metadata with the history-reading steps swapped
    for their device-resident versions, in upstream's order: min_tokens
    where its processor was, penalties after the non-argmax-invariant
    processors (where `Sampler.apply_logits_processors` applies them)."""
    procs = LogitsProcessors()
    procs.argmax_invariant = list(meta.logitsprocs.argmax_invariant)
    for processor in meta.logitsprocs.non_argmax_invariant:
        if not isinstance(processor, MinTokensLogitsProcessor):
            procs.non_argmax_invariant.append(processor)
        elif state.min_tokens_mask is not None:
            procs.non_argmax_invariant.append(state.min_tokens_mask)
    if not meta.no_penalties:
        procs.non_argmax_invariant.append(_Penalties(meta, state))
    return replace(meta, no_penalties=True, logitsprocs=procs, output_token_ids=[])


def _inner_tokens(inner: _HostResults, row: int) -> list[int]:
    return inner.tokens[inner.valid[:, row], row].tolist()


def _merged_output(
    first: ModelRunnerOutput, inner: _HostResults, logprobs: list
) -> ModelRunnerOutput:
    """Step 1's output with each request's inner tokens (and logprob rows)
    after its own, as the step-by-step merge gives it."""
    rows = [first.req_id_to_index[r] for r in first.req_ids]
    sampled = [list(first.sampled_token_ids[i]) + _inner_tokens(inner, i) for i in rows]
    lists = None
    if first.logprobs is not None:
        lists = _merged_logprobs(first.logprobs, inner, logprobs, rows)
    return replace(first, sampled_token_ids=sampled, logprobs=lists)


def _merged_logprobs(
    first: LogprobsLists, inner: _HostResults, logprobs: list, rows: list[int]
) -> LogprobsLists:
    """Request-major logprob rows: step 1's row, then each valid inner step's."""
    steps = [first] + [t.to_cpu_nonblocking().tolists() for t in logprobs]
    token_ids = np.stack([s.logprob_token_ids for s in steps])  # [step, row, k]
    values = np.stack([s.logprobs for s in steps])
    ranks = np.stack([s.sampled_token_ranks for s in steps])
    valid = np.concatenate([np.ones((1, inner.valid.shape[1]), bool), inner.valid])
    valid = valid[:, rows]
    row_index, step_index = np.nonzero(valid.T)
    batch_rows = np.asarray(rows)[row_index]
    cu = np.concatenate([[0], np.cumsum(valid.sum(axis=0))]).tolist()
    return LogprobsLists(
        token_ids[step_index, batch_rows],
        values[step_index, batch_rows],
        ranks[step_index, batch_rows],
        cu,
    )


def _update_host_state(
    runner: "GPUModelRunner",
    req_ids: list[str],
    first: ModelRunnerOutput,
    inner: _HostResults,
    state: _WindowState,
) -> None:
    """What the inner steps' bookkeeping would have left on the host.

    Token ids and output token lists get the real tokens (step 1's async
    placeholder replaced too: nothing else would replace it once later
    tokens follow it); computed counts are each row's last position. Under
    async scheduling the next step reads its input ids from the device.
    """
    batch = runner.input_batch
    for row, req_id in enumerate(req_ids):
        step_one = first.sampled_token_ids[first.req_id_to_index[req_id]]
        tokens = _inner_tokens(inner, row)
        req_state = runner.requests[req_id]
        outputs = req_state.output_token_ids
        start = batch.num_tokens_no_spec[row]
        if step_one and outputs and outputs[-1] == -1:
            outputs[-1] = step_one[-1]
            batch.token_ids_cpu[row, start - 1] = step_one[-1]
        outputs.extend(tokens)
        end = start + len(tokens)
        batch.token_ids_cpu[row, start:end] = tokens
        batch.is_token_ids[row, start:end] = True
        batch.num_tokens_no_spec[row] = end
        req_state.num_computed_tokens = int(inner.last_positions[row])
        batch.num_computed_tokens_cpu[row] = inner.last_positions[row]
    if runner.use_async_scheduling:
        batch.prev_sampled_token_ids = state.last[:, None]
        batch.prev_req_id_to_index = {r: i for i, r in enumerate(req_ids)}
        # Every output list holds real tokens now: nothing to replace.
        batch.sampled_token_ids_cpu = None
