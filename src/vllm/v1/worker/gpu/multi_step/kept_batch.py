# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Inner steps on StandaloneCPUModelRunner's kept batch.

Inside a window without drafts, each inner step runs the same requests as the
step before, one token each, one position further on. Rather than rebuild
that batch in `execute_model`, the step keeps the step before's `InputBatch`
and refreshes what a decode step moves with the runner's own pieces, in the
order its `execute_model` uses them: positions and seq lens
(`prepare_pos_seq_lens`), input ids (`combine_sampled_and_draft_tokens`),
slot mappings and attention metadata (refreshed in place on the CPU backend,
where only the attention work split is computed again), then the forward in
vLLM's forward context. Where the requests differ (one left the window), the
runner's `execute_model` runs the step and its batch is kept for the next.

A window's step 1 runs on the kept batch where the window before ran the same
decoding requests in the order the runner would sort them: the scheduler's
output is applied with the runner's own request updates and the step is
sampled as an inner step. A decode step is sampled by the sampler's `sample`
itself, its masks and logprobs as the runner's `sample` gives them
(decode_sampling.py).

What `execute_model` does and these steps do not, and why that holds here:
request updates in an inner step (a decode step inside a window changes no
request's blocks or prompt; its computed count is the one `post_update`
wrote), KV connector and encoder hooks, LoRA, pipeline and data parallelism,
the KV-sharing fast prefill helper (refused with windows, or in `create`).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vllm import _cpu_ops as ops
from vllm import envs
from vllm.config.multi_step import batch_reuse_enabled
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)
from vllm.v1.worker.cpu.attn_utils import build_slot_mappings_by_layer
from vllm.v1.worker.cpu.input_batch import (
    InputBatch,
    combine_sampled_and_draft_tokens,
    prepare_pos_seq_lens,
)
from vllm.v1.worker.cpu.model_states.default import DefaultModelState
from vllm.v1.worker.cpu.standalone_model_runner import (
    ExecuteModelState,
    StandaloneCPUModelRunner,
    sort_batch_req_ids,
)
from vllm.v1.worker.gpu.multi_step.decode_sampling import DecodeSampling, decodes
from vllm.v1.worker.gpu.multi_step.inner_steps import InnerSteps, sample_inner_step
from vllm.v1.worker.gpu.multi_step.window_requests import WindowRequests

if TYPE_CHECKING:
    from collections.abc import Collection

    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput


@dataclass
class _Attention:
    """An inner step's attention inputs, as the forward context takes them."""

    block_tables: tuple[torch.Tensor, ...]
    slot_mappings_by_layer: dict[str, torch.Tensor]
    metadata: dict[str, Any]
    # Each distinct metadata with the builder that made it, where every one
    # can be refreshed in place; else None.
    in_place: "list[tuple[CPUAttentionMetadata, CPUAttentionMetadataBuilder]] | None"


class KeptBatchInnerSteps(InnerSteps):
    """A window's steps on the batch of the step before, where it holds the
    same requests; else the runner's own pieces."""

    def __init__(self, standalone: StandaloneCPUModelRunner) -> None:
        super().__init__(standalone)  # type: ignore[arg-type]
        self.standalone = standalone
        self._batch: InputBatch | None = None
        # The attention inputs of the last inner step on `_batch`.
        self._attention: _Attention | None = None
        # Whether this runner's batches can have their attention refreshed in
        # place at all (fixed by its model and KV cache layout): not where the
        # block tables of a step depend on its positions (sliding windows).
        cpu_tables = standalone.block_tables
        self._in_place_possible = (
            type(standalone.model_state) is DefaultModelState
            and not cpu_tables.has_sliding_window_groups
        )
        # How a decode step on the kept batch is sampled.
        self.sampling = DecodeSampling(standalone)
        # Inner steps run, and on the kept batch; windows' step 1 tried here,
        # and run on the kept batch (the window's log gives the shares).
        self.num_inner_steps = 0
        self.num_inner_kept = 0
        self.num_first_steps = 0
        self.num_first_kept = 0

    @classmethod
    def create(
        cls, standalone: object, vllm_config: "VllmConfig"
    ) -> "KeptBatchInnerSteps | None":
        """One for `standalone` (the runner) where its batches can be kept,
        else None."""
        if not isinstance(standalone, StandaloneCPUModelRunner):
            return None
        parallel_config = vllm_config.parallel_config
        if (
            not batch_reuse_enabled(vllm_config)
            or vllm_config.speculative_config is not None
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

    def execute_first(self, step: "SchedulerOutput") -> bool:
        self.num_first_steps += 1
        kept = self._execute_first(step)
        self.num_first_kept += kept
        return kept

    def sample_first(
        self, grammar_output: "GrammarOutput | None", executed_here: bool
    ) -> "ModelRunnerOutput | AsyncModelRunnerOutput | None":
        self.keep_executed()  # this step's batch, before sampling consumes it
        # A step 1 on the kept batch is a decode step of requests already
        # running, as an inner step is: sampled as one, masked by step 1's
        # grammar output.
        if executed_here:
            return self.sample(grammar_output)
        return super().sample_first(grammar_output, executed_here)

    def execute(self, requests: WindowRequests) -> None:
        self.num_inner_steps += 1
        if self._execute_kept(requests.running):
            self.num_inner_kept += 1
            return
        super().execute(requests)
        self.keep_executed()

    def sample(
        self, grammar_output: "GrammarOutput | None" = None
    ) -> "ModelRunnerOutput":
        output = sample_inner_step(
            self.standalone,  # type: ignore[arg-type]
            self.sampling.sample,
            grammar_output,
        )
        self.sampling.claim(output)
        return output

    def finish_window(self) -> None:
        self.sampling.score()

    def describe(self) -> str:
        sampling = self.sampling
        return (
            f"{_percent(self.num_inner_kept, self.num_inner_steps)}% of inner "
            f"steps and {_percent(self.num_first_kept, self.num_first_steps)}% "
            "of first steps on the batch of the step before, "
            f"{_percent(sampling.num_direct_steps, sampling.num_sampled_steps)}%"
            " of steps sampled without the sampler's per-step bookkeeping"
        )

    def keep_executed(self) -> None:
        """Keep the batch of the step just executed, before it is sampled, for
        the next step (none where it ran nothing). Every executed step is kept:
        the batch views the runner's input buffers, which the runner's next
        `execute_model` overwrites."""
        executed = self.standalone.execute_model_state
        cpu_batch = executed.input_batch if executed is not None else None
        if cpu_batch is not self._batch:  # the runner built it: no inputs of ours
            self._attention = None
        self._batch = cpu_batch

    @torch.inference_mode()
    def _execute_kept(self, req_ids: "Collection[str]") -> bool:
        """Execute the next inner step of `req_ids` on the kept batch, as the
        runner's `execute_model` leaves it for sampling; False where the batch
        holds other requests (nothing is done then)."""
        cpu_batch = self._batch
        if (
            cpu_batch is None
            or not decodes(cpu_batch)  # step 1 prefilled a prompt
            or cpu_batch.num_reqs != len(req_ids)
            or not set(cpu_batch.req_ids).issuperset(req_ids)
        ):
            return False
        self._forward(cpu_batch, finished_req_ids=set())
        return True

    @torch.inference_mode()
    def _execute_first(self, scheduler_output: "SchedulerOutput") -> bool:
        """Execute a window's step 1 (`scheduler_output`, one token per
        request) on the kept batch, as the runner's `execute_model` would;
        False where that batch is not the one it would build (nothing is done
        then)."""
        cpu_batch = self._batch
        standalone = self.standalone
        num_scheduled = scheduler_output.num_scheduled_tokens
        if (
            cpu_batch is None
            or not decodes(cpu_batch)
            or scheduler_output.total_num_scheduled_tokens != len(num_scheduled)
            or scheduler_output.scheduled_new_reqs
            or scheduler_output.scheduled_encoder_inputs
            or scheduler_output.encoder_input_updates
            or cpu_batch.req_ids
            != sort_batch_req_ids(num_scheduled, standalone.decode_query_len)
        ):
            return False
        # The request updates of the runner's execute_model, in its order.
        standalone.finish_requests(scheduler_output)
        standalone.free_states(scheduler_output)
        standalone.add_requests(scheduler_output)
        standalone.update_requests(scheduler_output)
        if any(scheduler_output.scheduled_cached_reqs.new_block_ids):
            self._attention = None  # block tables to gather again
        self._forward(cpu_batch, scheduler_output.finished_req_ids)
        return True

    def _forward(self, cpu_batch: InputBatch, finished_req_ids: set[str]) -> None:
        """Refresh what a decode step moves in `cpu_batch`, run the forward
        and leave the step for sampling."""
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
        # The kept batch is this step's: sampling the step before is done.
        cpu_batch.logits_indices = logits_indices
        cpu_batch.num_computed_tokens_np = req_states.num_computed_tokens_np[
            cpu_batch.idx_mapping_np
        ]
        attention = self._attention_inputs(cpu_batch)
        self._attention = attention
        num_tokens = cpu_batch.num_tokens_after_padding
        with set_forward_context(
            attention.metadata,
            standalone.vllm_config,
            num_tokens=num_tokens,
            num_tokens_across_dp=None,
            batch_descriptor=BatchDescriptor(num_tokens=num_tokens),
            slot_mapping=attention.slot_mappings_by_layer,
            is_padding=cpu_batch.is_padding,
        ):
            hidden_states = standalone.model(
                **{
                    "input_ids": cpu_batch.input_ids,
                    "positions": cpu_batch.positions,
                    "inputs_embeds": None,
                    "intermediate_tensors": None,
                    # its positions where the model has its own (M-RoPE)
                    **standalone.model_state.prepare_inputs(cpu_batch, req_states),
                }
            )
        standalone.execute_model_state = ExecuteModelState(
            input_batch=cpu_batch,
            hidden_states=hidden_states,
            finished_req_ids=finished_req_ids,
            ec_connector_output=None,
        )

    def _attention_inputs(self, cpu_batch: InputBatch) -> _Attention:
        """The attention inputs of this step on `cpu_batch`: the last inner
        step's refreshed in place where they can be, else built as
        `execute_model` builds them."""
        standalone = self.standalone
        kept = self._attention
        refresh = kept is not None and kept.in_place is not None
        if refresh:
            # Into the buffer the metadata views (same batch, same shape).
            cpu_tables = standalone.block_tables
            cpu_tables.compute_slot_mappings(
                cpu_batch.idx_mapping,
                cpu_batch.query_start_loc,
                cpu_batch.positions,
                num_tokens_padded=cpu_batch.num_tokens_after_padding,
            )
            block_tables = kept.block_tables
        else:
            block_tables, slot_mappings = standalone.prepare_attn(cpu_batch)
        kv_cache_config = standalone.kv_cache_config
        model_state = standalone.model_state
        model_state.preprocess_state(
            cpu_batch,
            block_tables,
            kv_cache_config,
            standalone.req_states.num_computed_tokens,
        )
        if refresh:
            for metadata, builder in kept.in_place:
                _refresh_cpu_attention(metadata, builder)
            return kept
        metadata = model_state.prepare_attn(
            cpu_batch,
            block_tables,
            slot_mappings,
            standalone.attn_groups,
            kv_cache_config,
        )
        return _Attention(
            block_tables,
            build_slot_mappings_by_layer(slot_mappings, kv_cache_config),
            metadata,
            self._in_place(metadata, cpu_batch) if self._in_place_possible else None,
        )

    def _in_place(
        self, by_layer: dict[str, Any], cpu_batch: InputBatch
    ) -> "list[tuple[CPUAttentionMetadata, CPUAttentionMetadataBuilder]] | None":
        """Each distinct metadata of `by_layer` with its builder, where all are
        the CPU backend's for decoder self-attention over views of the
        runner's buffers, without the prompt lengths some models' windows
        read; else None."""
        if cpu_batch.prompt_lens is not None:
            return None
        seq_lens = cpu_batch.seq_lens
        found: dict[int, tuple[CPUAttentionMetadata, CPUAttentionMetadataBuilder]]
        found = {}
        for attn_groups in self.standalone.attn_groups:
            for attn_group in attn_groups:
                builder = attn_group.get_metadata_builder()
                for layer_name in attn_group.layer_names:
                    metadata = by_layer.get(layer_name)
                    if (
                        type(builder) is not CPUAttentionMetadataBuilder
                        or type(metadata) is not CPUAttentionMetadata
                        or builder.is_cross_attention
                        or builder.is_encoder_only_attention
                        or metadata.dynamic_causal is not None
                        or metadata.seq_lens.data_ptr() != seq_lens.data_ptr()
                    ):
                        return None
                    found[id(metadata)] = (metadata, builder)
        return list(found.values()) or None


def _percent(part: int, whole: int) -> int:
    return 100 * part // max(whole, 1)


def _refresh_cpu_attention(
    metadata: CPUAttentionMetadata, builder: CPUAttentionMetadataBuilder
) -> None:
    """Bring `metadata` to the seq lens its buffers now hold: what
    `CPUAttentionMetadataBuilder.build` computes from them (the slot mappings
    and seq lens it views were rewritten in place)."""
    seq_lens = metadata.seq_lens
    metadata.max_seq_len = int(seq_lens.max())
    metadata.scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=seq_lens.shape[0],
        num_heads=builder.num_heads,
        num_kv_heads=builder.num_kv_heads,
        head_dim=builder.head_dim,
        seq_lens=seq_lens,
        dtype=builder.dtype,
        query_start_loc=metadata.query_start_loc,
        causal=metadata.causal,
        sliding_window_size=builder.window_size,
        isa=builder.isa,
        enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
        dynamic_causal=None,
        kv_cache_dtype=builder.kv_cache_dtype,
    )
