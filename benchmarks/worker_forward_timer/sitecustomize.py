"""Times the model forward inside every vLLM process started with this folder on PYTHONPATH.

benchmarks/offline_worker.py --worker-forward puts this folder (and benchmarks/,
for forward_hooks.py) first on PYTHONPATH before it creates `LLM`, so the engine
core and worker processes it spawns run this file at interpreter start (Python's
`site` imports any `sitecustomize` on the path). It wraps the forward where the
runner calls it (forward_hooks.py: Model Runner V1's `_model_forward`, Model
Runner V2's model and graph manager) and, for forwards of exactly
OVERLAY_BENCH_FORWARD_BATCH tokens (full-batch decode steps), records the wall
time; every 64 records it appends them, one per line, to
OVERLAY_BENCH_FORWARD_DIR/<pid>.txt, so the driver can read them while the
engine is still up (and the step loop never writes more than 64 numbers).
Nothing happens without those variables (and this file shadows any other
`sitecustomize` for the run, which a benchmark process does not need).

This measures the forward as the served worker runs it (its own process, its
own core, the engine core busy beside it), which the in-process forward-only
limit cannot: the two agree when scheduling does not slow the forward.
"""

import os

_DIR = os.environ.get("OVERLAY_BENCH_FORWARD_DIR")
_BATCH = int(os.environ.get("OVERLAY_BENCH_FORWARD_BATCH", "0"))


def _install() -> None:
    import forward_hooks

    pending: list[float] = []
    out = os.path.join(_DIR, f"{os.getpid()}.txt")

    def record(rows: int | None, seconds: float) -> None:
        if rows != _BATCH:
            return
        pending.append(seconds)
        if len(pending) == 64:
            with open(out, "a") as f:
                f.write("".join(f"{t!r}\n" for t in pending))
            pending.clear()

    forward_hooks.time_forwards(record)


if _DIR and _BATCH:
    _install()
