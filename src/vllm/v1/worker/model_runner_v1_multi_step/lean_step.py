# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode: the lean inner step.

Inside a decode window, a step whose batch is exactly the previous step's (same
requests, same rows, one token each) differs from it only by one position per
request. The runner's `execute_model` would still rebuild every input from the
scheduler output: update the persistent batch, recompute request indices,
positions, token indices, query start locations, the discard mask and the input
ids gather, about half of a tiny model's step on CPU. This module runs such a
step as a delta instead:

- num_computed_tokens (request state and persistent batch) set to the step's,
  which is what `_update_states` does for a decode request with no new blocks;
- positions, seq_lens and the optimistic seq_lens from them; query start
  locations, request indices and the discard mask are the previous step's
  (same rows, one token each, nothing discarded);
- input ids: the previous step's sampled tokens;
- then what `execute_model` does for any batch: slot mappings (KV blocks for
  the whole window were appended at step 1), attention metadata, forward,
  logits, and the state `sample_tokens` reads. Sampling and bookkeeping are the
  runner's own `sample_tokens`, so penalties, min_tokens, bad words, seeded
  generators and logprobs see exactly what a full step gives them.

`LeanDecodeStep.applies` says when a step qualifies; any other step (a request
left the window, a feature this path does not cover) goes through the
runner's full `execute_model`.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.logger import init_logger
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import AsyncModelRunnerOutput
from vllm.v1.worker.block_table import SlotMappingMode
from vllm.v1.worker.gpu_model_runner import ExecuteModelState
from vllm.v1.worker.window_output import resolve_output

if TYPE_CHECKING:
    from vllm.compilation.cuda_graph import CUDAGraphStat
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = init_logger(__name__)


class LeanDecodeStep:
    def __init__(self, runner: "GPUModelRunner") -> None:
        self.runner = runner
        self.supported = _supported(runner)
        self._shape: _StepShape | None = None
        # Fixed once the KV cache is set up, which is before the first window.
        self._kv_update_outside_forward = self.supported and _has_separate_kv_update(
            runner
        )
        if not self.supported:
            logger.info(
                "Multi-step decode: this model or configuration is not covered "
                "by the lean inner step; inner steps run the full single step."
            )

    def applies(self, req_ids: list[str]) -> bool:
        """The step's requests are the rows of the previous (decode) step.

        The persistent batch holds exactly the previous step's requests (the
        runner drops unscheduled ones), so the same count and membership mean
        the same rows; the discard mask says none of them was a partial
        prefill.
        """
        if not self.supported:
            return False
        batch = self.runner.input_batch
        num_reqs = len(req_ids)
        return (
            batch.num_reqs == num_reqs
            and all(req_id in batch.req_id_to_index for req_id in req_ids)
            and not self.runner.discard_request_mask.np[:num_reqs].any()
        )

    def start_window(self) -> None:
        """A full step ran (step 1 of a window): forget the cached step shape.

        A full step rewrites the runner's buffers the shape holds views of
        (padding mask, slot-mapping padding) for its own batch.
        """
        self._shape = None

    def run(
        self, scheduler_output: SchedulerOutput, previous: "ModelRunnerOutput"
    ) -> None:
        """Execute one inner step: lean when it qualifies, else the full step."""
        if self.applies(scheduler_output.scheduled_cached_reqs.req_ids):
            self.execute(scheduler_output, previous)
            return
        self._shape = None
        early = self.runner.execute_model(scheduler_output)
        assert early is None, "an inner step has tokens, so it must sample"

    def execute(
        self, scheduler_output: SchedulerOutput, previous: "ModelRunnerOutput"
    ) -> None:
        """Run the step's forward; the runner's `sample_tokens` comes next.

        `previous` is the previous step's output, whose sampled tokens are this
        step's inputs.
        """
        logger.info_once(
            "Multi-step decode: inner steps with an unchanged batch run as "
            "lean steps (inputs advanced in place)."
        )
        runner = self.runner
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        cached = scheduler_output.scheduled_cached_reqs
        last_tokens = last_sampled(runner, previous)

        row = batch.req_id_to_index
        for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens):
            runner.requests[req_id].num_computed_tokens = num_computed
            batch.num_computed_tokens_cpu[row[req_id]] = num_computed
        # Logits processors (min_tokens) refresh their state every step.
        batch.refresh_metadata()

        computed_cpu = batch.num_computed_tokens_cpu_tensor[:num_reqs]
        computed = runner.num_computed_tokens[:num_reqs]
        computed.copy_(computed_cpu)
        runner.positions[:num_reqs].copy_(computed)
        torch.add(computed_cpu, 1, out=runner.optimistic_seq_lens_cpu[:num_reqs])
        torch.add(computed, 1, out=runner.seq_lens[:num_reqs])
        runner.input_ids.gpu[:num_reqs].copy_(last_tokens)

        # Every row advances one position per step, so one request's position
        # says how far into the shape's run of lean steps this step is.
        position = cached.num_computed_tokens[0]
        shape = self.shape(position)
        shape.write_slot_mappings(position - shape.first_position)
        hidden_states, logits = self.forward(scheduler_output, shape)
        sample_hidden_states = hidden_states[:num_reqs]
        # By keyword: contract.toml lists the fields, so a new one is reported.
        runner.execute_model_state = ExecuteModelState(
            scheduler_output=scheduler_output,
            logits=logits,
            spec_decode_metadata=None,
            spec_decode_common_attn_metadata=None,
            hidden_states=hidden_states,
            sample_hidden_states=sample_hidden_states,
            aux_hidden_states=None,
            ec_connector_output=None,
            cudagraph_stats=shape.cudagraph_stats,
            slot_mappings=shape.slot_mappings,
        )
        runner.kv_connector_output = None

    def shape(self, first_position: int) -> "_StepShape":
        """The step shape for the batch's current rows (kept while they are).

        `first_position` is a request's position at the shape's first step:
        its slot table starts there.
        """
        num_reqs = self.runner.input_batch.num_reqs
        if self._shape is None or self._shape.num_reqs != num_reqs:
            self._shape = _StepShape.of(
                self.runner, num_reqs, self._kv_update_outside_forward, first_position
            )
        return self._shape

    def forward(
        self, scheduler_output: SchedulerOutput, shape: "_StepShape"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention metadata, forward and logits for inputs already in the
        runner's buffers (one token per row; slot mappings written).

        Returns the hidden states and the logits of the batch's rows.
        """
        runner = self.runner
        num_reqs = shape.num_reqs
        attn_metadata, _ = runner._build_attention_metadata(
            num_tokens=num_reqs,
            num_tokens_padded=shape.num_tokens_padded if shape.pad_attn else None,
            num_reqs=num_reqs,
            num_reqs_padded=shape.num_reqs_padded if shape.pad_attn else None,
            max_query_len=1,
            logits_indices=shape.logits_indices,
            max_num_sampled_tokens=1,
            num_scheduled_tokens=scheduler_output.num_scheduled_tokens,
            slot_mappings=shape.slot_mappings_by_group,
        )
        input_ids, inputs_embeds, positions, _, model_kwargs, _ = runner._preprocess(
            scheduler_output, shape.num_tokens_padded
        )
        with set_forward_context(
            attn_metadata,
            runner.vllm_config,
            num_tokens=shape.num_tokens_padded,
            num_tokens_across_dp=shape.num_tokens_across_dp,
            cudagraph_runtime_mode=shape.cudagraph_mode,
            batch_descriptor=shape.batch_desc,
            slot_mapping=shape.slot_mappings,
            is_padding=shape.is_padding,
        ):
            hidden_states = runner._model_forward(
                input_ids=input_ids,
                positions=positions,
                intermediate_tensors=None,
                inputs_embeds=inputs_embeds,
                **model_kwargs,
            )
        # One token per row: the rows to sample are the first num_reqs.
        return hidden_states, runner.model.compute_logits(hidden_states[:num_reqs])


@dataclass
class _StepShape:
    """What stays the same across consecutive lean steps of one batch.

    The batch execution descriptor, padding and logits indices depend only on
    the number of rows (one token each); the slot mappings and padding mask are
    views of runner buffers whose contents lean steps rewrite in place
    (slots) or leave alone (the mask), so only a full step invalidates them.
    """

    num_reqs: int
    cudagraph_mode: CUDAGraphMode
    batch_desc: BatchDescriptor
    num_tokens_across_dp: torch.Tensor | None
    cudagraph_stats: "CUDAGraphStat | None"
    num_tokens_padded: int
    num_reqs_padded: int
    pad_attn: bool
    logits_indices: torch.Tensor
    slot_mappings_by_group: dict[int, torch.Tensor] | None
    slot_mappings: Any
    is_padding: torch.Tensor
    # Each block table's slot mapping and its slots for the steps ahead, as
    # [step, row]; step 0 is the lean step at `first_position`.
    slots_ahead: list[tuple[torch.Tensor, torch.Tensor]]
    first_position: int

    def write_slot_mappings(self, step: int, alive: torch.Tensor | None = None) -> None:
        """Slots of the shape's `step`-th step; rows not `alive` get none
        (-1: the KV write skips them)."""
        for slot_mapping, slots in self.slots_ahead:
            slot_mapping.copy_(slots[step])
            if alive is not None:
                slot_mapping.masked_fill_(~alive, -1)

    @classmethod
    def of(
        cls,
        runner: "GPUModelRunner",
        num_reqs: int,
        kv_update_outside_forward: bool,
        first_position: int,
    ) -> "_StepShape":
        cudagraph_mode, batch_desc, _, num_tokens_across_dp, cudagraph_stats = (
            runner._determine_batch_execution_and_padding(
                num_tokens=num_reqs,
                num_reqs=num_reqs,
                num_scheduled_tokens_np=np.ones(num_reqs, dtype=np.int32),
                max_num_scheduled_tokens=1,
                allow_microbatching=False,
            )
        )
        num_tokens_padded = batch_desc.num_tokens
        pad_attn = cudagraph_mode == CUDAGraphMode.FULL
        num_reqs_padded = (
            batch_desc.num_reqs
            if pad_attn and batch_desc.num_reqs is not None
            else num_reqs
        )
        pad_slots = pad_attn or kv_update_outside_forward
        slot_mappings_by_group, slot_mappings = runner._get_slot_mappings(
            num_tokens_padded=num_tokens_padded if pad_slots else num_reqs,
            num_reqs_padded=num_reqs_padded if pad_slots else num_reqs,
            num_tokens_unpadded=num_reqs,
            ubatch_slices=None,
        )
        query_start_loc = runner.query_start_loc.gpu[: num_reqs + 1]
        return cls(
            num_reqs=num_reqs,
            cudagraph_mode=cudagraph_mode,
            batch_desc=batch_desc,
            num_tokens_across_dp=num_tokens_across_dp,
            cudagraph_stats=cudagraph_stats,
            num_tokens_padded=num_tokens_padded,
            num_reqs_padded=num_reqs_padded,
            pad_attn=pad_attn,
            logits_indices=query_start_loc[1:] - 1,
            slot_mappings_by_group=slot_mappings_by_group,
            slot_mappings=slot_mappings,
            is_padding=runner._prepare_padding_mask(num_reqs, num_tokens_padded),
            # A window has at most num_scheduler_steps steps, and a full step
            # (each window's first) starts a new shape.
            slots_ahead=_slots_ahead(
                runner.input_batch,
                runner.positions[:num_reqs],
                runner.scheduler_config.num_scheduler_steps,
            ),
            first_position=first_position,
        )


def last_sampled(
    runner: "GPUModelRunner",
    previous: "ModelRunnerOutput | AsyncModelRunnerOutput",
) -> torch.Tensor:
    """The previous step's sampled token per row of the batch, on the device.

    Under async scheduling they are still on the device and `previous` is
    not read (reading it would wait for its copy to the host).
    """
    batch = runner.input_batch
    if batch.prev_sampled_token_ids is not None:
        # Async scheduling: rows in batch order.
        return batch.prev_sampled_token_ids[: batch.num_reqs, 0]
    output = resolve_output(previous)  # synchronous: already on the host
    index = output.req_id_to_index
    tokens = [output.sampled_token_ids[index[r]][-1] for r in batch.req_ids]
    return async_tensor_h2d(tokens, runner.device, torch.int32)


def _slots_ahead(
    batch: "InputBatch", positions: torch.Tensor, num_steps: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """KV slot of each request's token for the next steps: block id * block
    size + offset, per block table, as [step, row].

    The block table kernel computes the same for any batch; for one token per
    row (and no context parallelism) a gather is the whole job. The window's
    KV blocks were all appended at its first step, so the slots of all its
    steps are known then. Positions past a request's window (it leaves before
    them, which starts a new shape) are clamped into the table and unused.
    """
    num_reqs = positions.shape[0]
    ahead = positions[:, None] + torch.arange(num_steps, device=positions.device)
    out = []
    for table in batch.block_table.block_tables:
        if table.slot_mapping_mode != SlotMappingMode.TOKEN_TO_KV_SLOT:
            continue
        block_index = torch.div(ahead, table.block_size, rounding_mode="floor")
        block_index.clamp_(max=table.max_num_blocks_per_req - 1)
        block_ids = table.block_table.gpu[:num_reqs].gather(1, block_index)
        slots = ahead % table.block_size + block_ids.to(torch.int64) * table.block_size
        out.append((table.slot_mapping.gpu[:num_reqs], slots.T.contiguous()))
    return out


def _supported(runner: "GPUModelRunner") -> bool:
    """Features whose per-step inputs this path does not rebuild."""
    model_config = runner.model_config
    return (
        runner.speculative_config is None
        and not runner.uses_mrope
        and not runner.supports_mm_inputs
        and not runner.enable_prompt_embeds
        and not runner.lora_config
        and not runner.is_pooling_model
        and not runner.use_aux_hidden_state_outputs
        and not model_config.is_encoder_decoder
        and not model_config.is_hybrid
        and runner.eplb_state is None
        and runner.dcp_world_size == 1
        and runner.parallel_config.pipeline_parallel_size == 1
        and runner.parallel_config.data_parallel_size == 1
        and not runner.parallel_config.use_ubatching
        and len(runner.kv_cache_config.kv_cache_groups) > 0
        and all(
            table.pcp_world_size * table.dcp_world_size == 1
            for table in runner.input_batch.block_table.block_tables
        )
    )


def _has_separate_kv_update(runner: "GPUModelRunner") -> bool:
    # As in execute_model: backends that write the KV cache outside forward()
    # need slot mappings as long as the padded batch.
    return not all(
        group.backend.forward_includes_kv_cache_update
        for gid in range(len(runner.kv_cache_config.kv_cache_groups))
        for group in runner.attn_groups[gid]
    )
