# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A window's inner step on StandaloneCPUModelRunner, on the batch it already has.

Inside a window without drafts, each inner step runs the same requests as the
step before, one token each, one position further on. The runner's
`execute_model` would rebuild that batch from a scheduler output: update its
request states from the scheduler's counts, gather and sort the requests,
allocate the batch's index tensors. On this runner, where every step's host
work is paid between forwards on the same core, that was about a tenth of a
window's time (docs/benchmarks.md). So while the requests are the same, the
inner step keeps the step before's `InputBatch` and refreshes only what a
decode step moves, with the runner's own pieces, in the order its
`execute_model` uses them: positions and seq lens from the request states
`post_update` advanced (`prepare_pos_seq_lens`), input ids from the last
sampled tokens (`combine_sampled_and_draft_tokens`), block tables and slot
mappings (`prepare_attn`), the model state's hooks and attention metadata, and
the forward in vLLM's forward context. The runner's `sample` and
`postprocess_sampled` then sample it as any step (vllm/v1/worker/decode_window.py).

Where the requests differ (one left the window), the window runs the runner's
`execute_model` instead, and keeps that step's batch for the next.

What `execute_model` does and this step does not, and why that holds here:
request updates (a decode step of running requests changes no request's
blocks or prompt; its computed count is the one `post_update` wrote), KV
connector and encoder hooks, LoRA, pipeline and data parallelism, the
KV-sharing fast prefill helper (refused with windows, or in `create`).
"""

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.v1.worker.cpu.attn_utils import build_slot_mappings_by_layer
from vllm.v1.worker.cpu.input_batch import (
    InputBatch,
    combine_sampled_and_draft_tokens,
    prepare_pos_seq_lens,
)
from vllm.v1.worker.cpu.standalone_model_runner import (
    ExecuteModelState,
    StandaloneCPUModelRunner,
)

if TYPE_CHECKING:
    from collections.abc import Collection

    from vllm.config import VllmConfig


class StandaloneInnerStep:
    """Inner steps on the batch of the step before, for one runner."""

    def __init__(self, standalone: StandaloneCPUModelRunner) -> None:
        self.standalone = standalone
        self._batch: InputBatch | None = None

    @classmethod
    def create(
        cls, standalone: object, vllm_config: "VllmConfig"
    ) -> "StandaloneInnerStep | None":
        """One for `standalone` (the runner) where its batches can be reused,
        else None."""
        if not isinstance(standalone, StandaloneCPUModelRunner):
            return None
        parallel_config = vllm_config.parallel_config
        if (
            vllm_config.speculative_config is not None
            or vllm_config.lora_config is not None
            or standalone.uses_inputs_embeds
            or standalone.is_encoder_decoder
            # its per-step helper is prepared in prepare_inputs, not here
            or standalone.fast_prefill is not None
            or parallel_config.pipeline_parallel_size > 1
            or parallel_config.data_parallel_size > 1
        ):
            return None
        return cls(standalone)

    def keep_executed(self) -> None:
        """Keep the batch the runner's `execute_model` just ran, for the next
        inner step (none where it ran nothing)."""
        executed = self.standalone.execute_model_state
        self._batch = executed.input_batch if executed is not None else None

    @torch.inference_mode()
    def execute(self, req_ids: "Collection[str]") -> bool:
        """Execute the next step of `req_ids` on the kept batch, as the runner's
        `execute_model` leaves it for sampling; False where the batch holds
        other requests (nothing is done then)."""
        cpu_batch = self._batch
        if (
            cpu_batch is None
            or cpu_batch.num_reqs != len(req_ids)
            or not set(cpu_batch.req_ids).issuperset(req_ids)
        ):
            return False
        standalone = self.standalone
        req_states = standalone.req_states
        buffers = standalone.input_buffers
        prepare_pos_seq_lens(
            cpu_batch.idx_mapping,
            cpu_batch.query_start_loc,
            req_states.num_computed_tokens,
            buffers.positions,
            buffers.seq_lens,
        )
        logits_indices = combine_sampled_and_draft_tokens(
            buffers.input_ids,
            cpu_batch.idx_mapping,
            req_states.last_sampled_tokens,
            cpu_batch.query_start_loc,
            cpu_batch.seq_lens,
            req_states.prefill_len,
            req_states.last_sampled_tokens[:, :0],
            cpu_batch.cu_num_logits,
            cpu_batch.num_reqs,
            standalone.model_state.num_new_sampled_tokens_per_step,
        )
        cpu_batch = replace(
            cpu_batch,
            logits_indices=logits_indices,
            num_computed_tokens_np=req_states.num_computed_tokens_np[
                cpu_batch.idx_mapping_np
            ],
        )
        block_tables, slot_mappings = standalone.prepare_attn(cpu_batch)
        kv_cache_config = standalone.kv_cache_config
        model_state = standalone.model_state
        model_state.preprocess_state(
            cpu_batch, block_tables, kv_cache_config, req_states.num_computed_tokens
        )
        attn_metadata = model_state.prepare_attn(
            cpu_batch,
            block_tables,
            slot_mappings,
            standalone.attn_groups,
            kv_cache_config,
        )
        num_tokens = cpu_batch.num_tokens_after_padding
        with set_forward_context(
            attn_metadata,
            standalone.vllm_config,
            num_tokens=num_tokens,
            num_tokens_across_dp=None,
            batch_descriptor=BatchDescriptor(num_tokens=num_tokens),
            slot_mapping=build_slot_mappings_by_layer(slot_mappings, kv_cache_config),
            is_padding=cpu_batch.is_padding,
        ):
            hidden_states = standalone.model(
                **{
                    "input_ids": cpu_batch.input_ids,
                    "positions": cpu_batch.positions,
                    "inputs_embeds": None,
                    "intermediate_tensors": None,
                    # its positions where the model has its own (M-RoPE)
                    **model_state.prepare_inputs(cpu_batch, req_states),
                }
            )
        standalone.execute_model_state = ExecuteModelState(
            input_batch=cpu_batch,
            hidden_states=hidden_states,
            finished_req_ids=set(),
            ec_connector_output=None,
        )
        self._batch = cpu_batch
        return True
