"""Stand-in for vllm/_C_stable_libtorch on the lent GPU machine (see README.md here).

The compiled kernels of the vLLM 0.34.0 CUDA wheel need torch 2.14; the GPU
machine has torch 2.11.0 and no package index, and the wheel (239 MB) exceeds
what a call may carry. Both builds there therefore run the wheel's Python code
with PyTorch-native custom ops, native IR ops, Triton attention and sampling,
and this module in place of the compiled one, identically for upstream and
overlay (device_check.sh copies this same file into both trees).

What it registers, and why each is safe (audit of 0.34.0's engine path, README.md):
  * get_cuda_view_from_cpu_tensor (CPU key): Model Runner V2's UVA buffers
    (vllm/v1/worker/gpu/buffer_utils.py) take a device view of pinned host
    memory. As csrc/cuda_view.cu does, the view aliases the pinned storage
    through cudaHostGetDevicePointer (ctypes on the libcudart torch loaded),
    wrapped by __cuda_array_interface__; it raises if torch copied instead.
  * silu_and_mul: SiluAndMul.__init__ looks the op up on CUDA even when custom
    ops are off (it then runs forward_native); the arithmetic of forward_native.
  * apply_repetition_penalties_, weak_ref_tensor: not on Model Runner V2's path
    (Triton penalties; its own FULL graphs), kept with vLLM's torch fallback
    arithmetic and an alias in case a path reaches them.
  * the CUTLASS capability queries (asked at import): False.
  * declared only, no kernel: the ops the torch.compile fusion passes name in
    their module bodies (the EAGLE and draft-model speculators import them even
    when eager); the passes run only under Inductor.
  * _C_cuda_utils.get_max_shared_memory_per_block_device_attribute (encoder
    prefill attention only): the device property it reads.
Plus, only where torch 2.11 lacks them, torch APIs vLLM calls on this path,
filled with the torch call they stand for (TORCH_SHIMS lists those applied).
"""

import ctypes
import os

import torch

_LIB = torch.library.Library("_C", "DEF")  # kept alive: the ops live while the library does
_LIB_UTILS = torch.library.Library("_C_cuda_utils", "DEF")


def _apply_repetition_penalties(logits, prompt_mask, output_mask, repetition_penalties) -> None:
    penalties = repetition_penalties.unsqueeze(dim=1).repeat(1, logits.size(1))
    penalties = torch.where(prompt_mask | output_mask, penalties, 1.0)
    logits *= torch.where(logits > 0, 1.0 / penalties, penalties)


def _silu_and_mul(out, x) -> None:
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])


def _weak_ref_tensor(tensor):
    return torch.ops.aten.alias.default(tensor)


_CUDART = None


def _device_pointer(host_ptr: int) -> int:
    """cudaHostGetDevicePointer through the libcudart torch already loaded (as csrc/cuda_view.cu does)."""
    global _CUDART
    if _CUDART is None:
        from vllm.utils.system_utils import find_loaded_library

        _CUDART = ctypes.CDLL(find_loaded_library("libcudart") or os.environ["VLLM_CUDART_SO_PATH"])
        _CUDART.cudaHostGetDevicePointer.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_uint]
        _CUDART.cudaHostGetDevicePointer.restype = ctypes.c_int
    dev = ctypes.c_void_p()
    err = _CUDART.cudaHostGetDevicePointer(ctypes.byref(dev), ctypes.c_void_p(host_ptr), 0)
    if err != 0:
        raise RuntimeError(f"cudaHostGetDevicePointer failed: error {err}")
    return dev.value


class _MappedHostBytes:
    """__cuda_array_interface__ over the bytes of a pinned storage; holds the CPU tensor alive."""

    def __init__(self, dev_ptr: int, nbytes: int, keep: torch.Tensor):
        self._keep = keep
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (dev_ptr, False), "strides": None, "version": 2,
        }  # fmt: skip


def _get_cuda_view_from_cpu_tensor(cpu_tensor):
    if cpu_tensor.device.type != "cpu":
        raise RuntimeError("Input tensor must be on CPU")
    device = torch.device("cuda", torch.cuda.current_device())
    if cpu_tensor.numel() == 0:
        return torch.empty(cpu_tensor.shape, dtype=cpu_tensor.dtype, device=device)
    # Unpinned input: the compiled op copies into mapped memory; a pinned copy is the same.
    base = cpu_tensor if cpu_tensor.is_pinned() else cpu_tensor.contiguous().pin_memory()
    storage = base.untyped_storage()
    dev_ptr = _device_pointer(storage.data_ptr())
    raw = torch.as_tensor(_MappedHostBytes(dev_ptr, storage.nbytes(), base), device=device)
    if raw.data_ptr() != dev_ptr:  # torch copied instead of aliasing: UVA semantics would be lost
        raise RuntimeError("get_cuda_view_from_cpu_tensor stand-in: view does not alias host memory")
    return raw.view(base.dtype).as_strided(base.size(), base.stride(), base.storage_offset())


for _schema, _impl, _key in (
    ("apply_repetition_penalties_(Tensor(a!) logits, Tensor prompt_mask, Tensor output_mask, "
     "Tensor repetition_penalties) -> ()", _apply_repetition_penalties, "CUDA"),
    ("silu_and_mul(Tensor(a!) result, Tensor input) -> ()", _silu_and_mul, "CUDA"),
    ("weak_ref_tensor(Tensor(a) input) -> Tensor(a)", _weak_ref_tensor, "CUDA"),
    ("get_cuda_view_from_cpu_tensor(Tensor cpu_tensor) -> Tensor", _get_cuda_view_from_cpu_tensor, "CPU"),
):  # fmt: skip
    _LIB.define(_schema)
    _LIB.impl(_schema.split("(", 1)[0], _impl, _key)

for _query in (
    "cutlass_scaled_mm_supports_fp4",
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_group_gemm_supported",
):
    _LIB.define(f"{_query}(int cuda_device_capability) -> bool")
    _LIB.impl(_query, lambda cuda_device_capability: False, "CompositeExplicitAutograd")

# Declared only (no kernel): vllm.compilation.backends -> passes/pass_manager.py imports the fusion
# passes, whose module bodies take these OpOverloads (matcher_utils.py:32-50, rms_quant_fusion.py:156-198,
# qk_norm_rope_fusion.py:26, act_quant_fusion.py:34-44). The MRV2 EAGLE loader (eagle/utils.py:119) and
# the draft_model speculator (standalone_ar/speculator.py:8) import that module even in eager mode; the
# passes only run under Inductor, which mode 0 / enforce_eager never start. Schemas: csrc/torch_bindings.cpp.
for _schema in (
    "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, "
    "bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()",
    "static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, int[]? group_shape=None) -> ()",
    "dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()",
    "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, Tensor? scale_ub) -> ()",
    "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()",
    "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, Tensor scale, float epsilon) -> ()",
    "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor! residual, Tensor weight, "
    "Tensor scale, float epsilon) -> ()",
    "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, Tensor weight, Tensor! scale, float epsilon, "
    "Tensor? scale_ub, Tensor!? residual) -> ()",
    "fused_qk_norm_rope(Tensor! qkv, int num_heads_q, int num_heads_k, int num_heads_v, int head_dim, float eps, "
    "Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, bool is_neox, Tensor position_ids, "
    "int forced_token_heads_per_warp=-1) -> ()",
    "silu_and_mul_quant(Tensor! result, Tensor input, Tensor scale) -> ()",
    "silu_and_mul_per_block_quant(Tensor! out, Tensor input, Tensor! scales, int group_size, "
    "Tensor? scale_ub=None, bool is_scale_transposed=False) -> ()",
):  # fmt: skip
    _LIB.define(_schema)

# Encoder-only Triton prefill attention sizes tiles with this (not reached by decoder models).
_LIB_UTILS.define("get_max_shared_memory_per_block_device_attribute(int device_id) -> int")
_LIB_UTILS.impl(
    "get_max_shared_memory_per_block_device_attribute",
    lambda device_id: torch.cuda.get_device_properties(device_id).shared_memory_per_block_optin,
    "CompositeExplicitAutograd",
)


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
    # gpu_worker.py:431-436 falls back to _snapshot()["allocator_settings"][...] (KeyError-prone) without it
    (torch._C, "_accelerator_getAllocatorSettings", _allocator_settings),
    # parallel_state.py:2597 calls it inside try/except AttributeError (a warning at shutdown otherwise)
    (torch.accelerator, "empty_host_cache", lambda: torch._C._host_emptyCache()),
):  # fmt: skip
    if not hasattr(_owner, _name):
        setattr(_owner, _name, _fill)
        TORCH_SHIMS.append(f"{_owner.__name__}.{_name}")
