"""Stand-in for vllm/model_executor/warmup/minimax_m3_msa_warmup.py on the lent GPU machine.

kernel_warmup.py:366-372 imports the real module on every CUDA run; it imports the MiniMax-M3 model
package, whose ops import `cutlass` (nvidia-cutlass-dsl), which that machine lacks. The real
function returns at once for any model without MiniMaxM3SparseAttention (its line 92).
"""


def minimax_m3_msa_warmup(worker) -> None:
    return None
