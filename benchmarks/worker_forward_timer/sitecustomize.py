"""Times the model forward inside every vLLM process started with this folder on PYTHONPATH.

benchmarks/offline_worker.py --worker-forward puts this folder first on
PYTHONPATH before it creates `LLM`, so the engine core and worker processes it
spawns run this file at interpreter start (Python's `site` imports any
`sitecustomize` on the path). It wraps the V1 runner's `_model_forward` and,
for forwards of exactly OVERLAY_BENCH_FORWARD_BATCH tokens (full-batch decode
steps), records the wall time; every 64 records it appends them, one per
line, to OVERLAY_BENCH_FORWARD_DIR/<pid>.txt, so the driver can read them while
the engine is still up (and the step loop never writes more than 64 numbers). Nothing happens without those variables
(and this file shadows any other `sitecustomize` for the run, which a benchmark
process does not need).

This measures the forward as the served worker runs it (its own process, its
own core, the engine core busy beside it), which the in-process forward-only
limit cannot: the two agree when scheduling does not slow the forward.
"""

import os
import time

_DIR = os.environ.get("OVERLAY_BENCH_FORWARD_DIR")
_BATCH = int(os.environ.get("OVERLAY_BENCH_FORWARD_BATCH", "0"))


def _install() -> None:
    from vllm.v1.worker import gpu_model_runner

    original = gpu_model_runner.GPUModelRunner._model_forward
    pending: list[float] = []
    out = os.path.join(_DIR, f"{os.getpid()}.txt")

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        result = original(self, *args, **kwargs)
        input_ids = kwargs.get("input_ids")
        if input_ids is not None and input_ids.shape[0] == _BATCH:
            pending.append(time.perf_counter() - start)
            if len(pending) == 64:
                with open(out, "a") as f:
                    f.write("".join(f"{t!r}\n" for t in pending))
                pending.clear()
        return result

    gpu_model_runner.GPUModelRunner._model_forward = timed


if _DIR and _BATCH:
    _install()
