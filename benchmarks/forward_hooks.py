"""Times the model's forward wherever the runner of the running vLLM calls it.

Used in-process by offline_worker.py --forward-only and, in each engine process,
by worker_forward_timer/sitecustomize.py. Model Runner V1 (vLLM up to 0.33.0)
calls `_model_forward`; Model Runner V2 (0.34.0 on) calls the model itself on
eager steps and the graph manager on graphed ones, so all three are wrapped, and
a forward inside a timed one (a graph's runner calling the model) is not timed
again.
"""

import time
from collections.abc import Callable

Record = Callable[[int | None, float], None]
_timing: list[bool] = []  # set while a timed forward runs


def time_forwards(record: Record, sync: Callable[[], None] | None = None) -> None:
    """Call record(input rows, seconds) after each forward; sync() around it (a device's time)."""

    def timed(original, rows_of):
        def forward(*args, **kw):
            if _timing:
                return original(*args, **kw)
            _timing.append(True)
            try:
                if sync:
                    sync()
                start = time.perf_counter()
                out = original(*args, **kw)
                if sync:
                    sync()
            finally:
                _timing.clear()
            record(rows_of(args, kw), time.perf_counter() - start)
            return out

        return forward

    try:  # Model Runner V1
        from vllm.v1.worker import gpu_model_runner

        runner = gpu_model_runner.GPUModelRunner
        runner._model_forward = timed(runner._model_forward, _input_rows)
        return
    except ImportError:
        pass
    from vllm.v1.worker.cpu.standalone_model_runner import StandaloneCPUModelRunner
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    manager = ModelCudaGraphManager
    manager.run_fullgraph = timed(manager.run_fullgraph, lambda args, kw: args[1].num_tokens)
    manager.run_pw_graph = timed(manager.run_pw_graph, lambda args, kw: _input_rows((), args[2]))
    for runner in (StandaloneCPUModelRunner, GPUModelRunner):  # the model's class, once loaded
        runner.load_model = _then_time_model(runner.load_model, timed)


def _input_rows(args: tuple, kw: dict) -> int | None:
    input_ids = kw.get("input_ids")
    return None if input_ids is None else input_ids.shape[0]


def _then_time_model(load_model, timed):
    def load(self, *args, **kw):
        out = load_model(self, *args, **kw)
        cls = type(self.model)
        if not getattr(cls, "_forward_timed", False):
            cls.forward, cls._forward_timed = timed(cls.forward, _input_rows), True
        return out

    return load
