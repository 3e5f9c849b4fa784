"""Stand-in for vllm/_C_stable_libtorch on the lent GPU machine (see README.md here).

The compiled kernels of the vLLM 0.32.0 CUDA wheel need torch 2.13.0; the GPU
machine has torch 2.11.0 and no package index, and the wheel (326 MB) exceeds
what a call may carry. Both builds there therefore run the wheel's Python code
with PyTorch-native custom ops, Triton attention and this module in place of
the compiled one, identically for upstream and overlay. It registers the one
compiled op the parity set reaches with those settings (repetition penalty),
with the same arithmetic as vLLM's own torch fallback
(vllm/_custom_ops.py: apply_repetition_penalties_torch), and answers the
CUTLASS capability queries that vLLM's quantization utilities make at import
(w8a8_utils.py) with False: no CUTLASS kernel exists there.
"""

import torch

_LIB = torch.library.Library("_C", "DEF")  # kept alive: the op lives while the library does
_LIB.define(
    "apply_repetition_penalties_(Tensor(a!) logits, Tensor prompt_mask, Tensor output_mask, "
    "Tensor repetition_penalties) -> ()"
)


def _apply_repetition_penalties(logits, prompt_mask, output_mask, repetition_penalties) -> None:
    penalties = repetition_penalties.unsqueeze(dim=1).repeat(1, logits.size(1))
    penalties = torch.where(prompt_mask | output_mask, penalties, 1.0)
    logits *= torch.where(logits > 0, 1.0 / penalties, penalties)


_LIB.impl("apply_repetition_penalties_", _apply_repetition_penalties, "CUDA")


for _query in (
    "cutlass_scaled_mm_supports_fp4",
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_group_gemm_supported",
):
    _LIB.define(f"{_query}(int cuda_device_capability) -> bool")
    _LIB.impl(_query, lambda cuda_device_capability: False, "CompositeExplicitAutograd")
