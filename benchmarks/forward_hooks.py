"""Times the model's forward, and the sampling after it, wherever the runner of the running vLLM calls them.

Used in-process by offline_worker.py --forward-only (both) and, in each engine
process, by worker_forward_timer/sitecustomize.py (the forward alone).

The forward: Model Runner V1 (vLLM up to 0.33.0) calls `_model_forward`; Model
Runner V2 (0.34.0 on) calls the model itself on eager steps and the graph
manager on graphed ones, so all three are wrapped, and a forward inside a timed
one (a graph's runner calling the model) is not timed again.

The sampling (time_sampling): upstream's own code that turns a step's hidden
states into its sampled tokens, as the runner calls it. Model Runner V2: the
runner's `sample` (StandaloneCPUModelRunner's and GPUModelRunner's), which
gathers the sampled rows, runs the model's `compute_logits` on them and calls
the runner's sampler; one piece a step. Model Runner V1: the model's
`compute_logits` on the sampled rows (at the end of `execute_model`, after the
forward) and the runner's `_sample` (in `sample_tokens`: the sampler call); two
pieces a step, and the rows' gather between the forward and `compute_logits`
(one indexing op) is in neither. StepTimes puts each step's pieces with its
forward.
"""

import time
from collections.abc import Callable, Iterable

Record = Callable[[int | None, float], None]
PieceRecord = Callable[[str, float], None]
_timing: list[bool] = []  # set while a timed forward runs
_sampling: list[bool] = []  # set while a timed piece of sampling runs


def _timed(original, running: list[bool], done: Callable[[tuple, dict, float], None], sync):
    """``original`` calling done(args, kwargs, seconds) after it; not timed again inside itself
    (``running`` is set meanwhile); sync() around it (a device's time)."""

    def call(*args, **kw):
        if running:
            return original(*args, **kw)
        running.append(True)
        try:
            if sync:
                sync()
            start = time.perf_counter()
            out = original(*args, **kw)
            if sync:
                sync()
        finally:
            running.clear()
        done(args, kw, time.perf_counter() - start)
        return out

    return call


def time_forwards(record: Record, sync: Callable[[], None] | None = None) -> None:
    """Call record(input rows, seconds) after each forward; sync() around it (a device's time)."""

    def timed(original, rows_of):
        return _timed(original, _timing, lambda args, kw, seconds: record(rows_of(args, kw), seconds), sync)

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

    def time_model(model) -> None:  # the model's class: its forward, once
        cls = type(model)
        if not getattr(cls, "_forward_timed", False):
            cls.forward, cls._forward_timed = timed(cls.forward, _input_rows), True

    for runner in (StandaloneCPUModelRunner, GPUModelRunner):  # the model's class, once loaded
        runner.load_model = _then(runner.load_model, time_model)


def time_sampling(record: PieceRecord, sync: Callable[[], None] | None = None) -> tuple[str, ...]:
    """Call record(piece, seconds) after each piece of a step's sampling (see the docstring);
    sync() around it. Returns the pieces of one step in the order they run, the last ending it."""

    def timed(original, piece: str):
        return _timed(original, _sampling, lambda args, kw, seconds: record(piece, seconds), sync)

    try:  # Model Runner V1
        from vllm.v1.worker import gpu_model_runner
    except ImportError:
        pass
    else:
        runners = [gpu_model_runner.GPUModelRunner]
        try:
            from vllm.v1.worker.cpu_model_runner import CPUModelRunner  # its own load_model

            runners.append(CPUModelRunner)
        except ImportError:
            pass

        def time_logits(model) -> None:  # on the instance: a graph wrapper forwards the attribute
            if not getattr(model.compute_logits, "_timed", False):
                model.compute_logits = timed(model.compute_logits, "compute_logits")
                model.compute_logits._timed = True

        for runner in runners:
            runner.load_model = _then(runner.load_model, time_logits)
        runner = gpu_model_runner.GPUModelRunner
        runner._sample = timed(runner._sample, "sample")
        return ("compute_logits", "sample")
    from vllm.v1.worker.cpu.standalone_model_runner import StandaloneCPUModelRunner
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    for runner in (StandaloneCPUModelRunner, GPUModelRunner):
        runner.sample = timed(runner.sample, "sample")
    return ("sample",)


def time_steps(batches: Iterable[int], sync: Callable[[], None] | None = None) -> "StepTimes":
    """Time every forward and the sampling after it (time_forwards, time_sampling) into a StepTimes."""
    steps = StepTimes(batches)
    time_forwards(steps.record_forward, sync)
    steps.pieces = time_sampling(steps.record_piece, sync)
    return steps


class StepTimes:
    """Each full-batch decode step's forward seconds, and its forward + sampling seconds, per batch.

    A step's forward + sampling is its forward's time plus the time of each piece of its sampling
    (time_sampling's pieces: every one, in order, after that forward), added up per step. Each is
    a span of upstream's own code alone, so the sum leaves out what runs between them (the
    runner's bookkeeping after the forward, the engine core between `execute_model` and
    `sample_tokens`), which a decode loop that keeps upstream's sampling need not run. A forward
    whose pieces do not all follow it (a dummy run's, one whose sampling the runner skips) gives a
    forward time only. ``batches``: the forwards' input rows to keep (a decode step's: the batch).
    """

    def __init__(self, batches: Iterable[int], pieces: Iterable[str] = ()) -> None:
        self.pieces = tuple(pieces)
        self.forward: dict[int, list[float]] = {b: [] for b in batches}
        self.forward_sample: dict[int, list[float]] = {b: [] for b in self.forward}
        self.sampling: dict[int, list[float]] = {b: [] for b in self.forward}  # its pieces alone
        self._step: tuple[int | None, float, float, tuple[str, ...]] | None = None  # rows, forward, pieces

    def record_forward(self, rows: int | None, seconds: float) -> None:
        if rows in self.forward:
            self.forward[rows].append(seconds)
        self._step = (rows, seconds, 0.0, ())

    def record_piece(self, piece: str, seconds: float) -> None:
        if self._step is None:
            return
        rows, forward, sampling, seen = self._step
        seen += (piece,)
        if seen != self.pieces[: len(seen)]:  # not this step's next piece: the step is not counted
            self._step = None
            return
        self._step = (rows, forward, sampling + seconds, seen)
        if seen == self.pieces:
            if rows in self.forward_sample:
                self.forward_sample[rows].append(forward + sampling + seconds)
                self.sampling[rows].append(sampling + seconds)
            self._step = None

    def clear(self, batch: int) -> None:
        for times in (self.forward, self.forward_sample, self.sampling):
            times[batch].clear()


def _input_rows(args: tuple, kw: dict) -> int | None:
    input_ids = kw.get("input_ids")
    return None if input_ids is None else input_ids.shape[0]


def _then(load_model, with_model: Callable):
    """The runner's load_model, then with_model(the loaded model)."""

    def load(self, *args, **kw):
        out = load_model(self, *args, **kw)
        with_model(self.model)
        return out

    return load
