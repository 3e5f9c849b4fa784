"""Stand-in for vllm/_C_stable_libtorch on the lent GPU machine (see README.md here).

The compiled kernels of the vLLM 0.32.0 CUDA wheel need torch 2.13.0; the GPU
machine has torch 2.11.0 and no package index, and the wheel (326 MB) exceeds
what a call may carry. Both builds there therefore run the wheel's Python code
with PyTorch-native custom ops, native IR ops, Triton attention, the V1 model
runner and this module in place of the compiled one, identically for upstream
and overlay (device_check.sh copies this same file into both trees).

What it registers under torch.ops._C, and why each is safe:
  * apply_repetition_penalties_: the one compiled op the sampler calls on CUDA
    (vllm/_custom_ops.py picks it for contiguous CUDA logits), with the
    arithmetic of vLLM's own torch fallback apply_repetition_penalties_torch.
  * silu_and_mul: SiluAndMul.__init__ looks the op up on CUDA even when custom
    ops are off (it then runs forward_native); registered with the arithmetic of
    SiluAndMul.forward_native so the lookup succeeds.
  * weak_ref_tensor: CUDA graph capture (compilation/cuda_graph.py) turns graph
    outputs into non-owning references. Here it returns an alias that keeps the
    storage alive: same values, the graph pool just holds those outputs longer.
  * the CUTLASS capability queries (w8a8_utils.py asks at import): False, as no
    CUTLASS kernel exists here.
Plus, only where torch 2.11 lacks them, torch APIs vLLM 0.32 calls on this path,
filled with the torch.cuda call they stand for (TORCH_SHIMS lists those applied).
"""

import os

import torch

_LIB = torch.library.Library("_C", "DEF")  # kept alive: the ops live while the library does


def _apply_repetition_penalties(logits, prompt_mask, output_mask, repetition_penalties) -> None:
    penalties = repetition_penalties.unsqueeze(dim=1).repeat(1, logits.size(1))
    penalties = torch.where(prompt_mask | output_mask, penalties, 1.0)
    logits *= torch.where(logits > 0, 1.0 / penalties, penalties)


def _silu_and_mul(out, x) -> None:
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])


def _weak_ref_tensor(tensor):
    return torch.ops.aten.alias.default(tensor)


for _schema, _impl in (
    ("apply_repetition_penalties_(Tensor(a!) logits, Tensor prompt_mask, Tensor output_mask, "
     "Tensor repetition_penalties) -> ()", _apply_repetition_penalties),
    ("silu_and_mul(Tensor(a!) result, Tensor input) -> ()", _silu_and_mul),
    ("weak_ref_tensor(Tensor(a) input) -> Tensor(a)", _weak_ref_tensor),
):  # fmt: skip
    _LIB.define(_schema)
    _LIB.impl(_schema.split("(", 1)[0], _impl, "CUDA")

for _query in (
    "cutlass_scaled_mm_supports_fp4",
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_group_gemm_supported",
):
    _LIB.define(f"{_query}(int cuda_device_capability) -> bool")
    _LIB.impl(_query, lambda cuda_device_capability: False, "CompositeExplicitAutograd")


def _allocator_settings() -> str:
    try:
        value = torch.cuda.memory._snapshot().get("allocator_settings", {}).get("PYTORCH_CUDA_ALLOC_CONF")
        if isinstance(value, str):
            return value
    except Exception:
        pass
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", ""))


TORCH_SHIMS: list[str] = []
for _owner, _name, _fill in (
    (torch.accelerator, "get_memory_info", lambda device=None, /: torch.cuda.mem_get_info(device)),
    (torch.accelerator, "empty_cache", lambda: torch.cuda.empty_cache()),
    (torch.accelerator, "memory_allocated", lambda device=None, /: torch.cuda.memory_allocated(device)),
    (torch.accelerator, "memory_reserved", lambda device=None, /: torch.cuda.memory_reserved(device)),
    (torch.accelerator, "max_memory_allocated", lambda device=None, /: torch.cuda.max_memory_allocated(device)),
    (torch.accelerator, "memory_stats", lambda device=None, /: torch.cuda.memory_stats(device)),
    (torch.accelerator, "reset_peak_memory_stats", lambda device=None, /: torch.cuda.reset_peak_memory_stats(device)),
    (torch._C, "_accelerator_setAllocatorSettings", lambda s: torch.cuda.memory._set_allocator_settings(s)),
    (torch._C, "_accelerator_getAllocatorSettings", _allocator_settings),
):  # fmt: skip
    if not hasattr(_owner, _name):
        setattr(_owner, _name, _fill)
        TORCH_SHIMS.append(f"{_owner.__name__}.{_name}")
