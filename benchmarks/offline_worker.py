"""Runs inside one build's venv: decode throughput of `vllm.LLM`, or the forward-only time.

Usage: python offline_worker.py MODEL '{"LLM kwargs"}' BATCH OUT_LEN REPS [--forward-only | --worker-forward]
Prints one line "RESULT {json}". Throughput: BATCH prompts of 32 token ids,
OUT_LEN tokens each (ignore_eos, greedy), best and median output tokens/s of
REPS runs after a warm-up. --forward-only runs the engine in-process and times
the model's forward passes of full-batch decode steps alone: BATCH / that time
is the physical limit no scheduling can beat. It runs the forward as the served
worker does: one torch thread on one core (the multiprocess CPU worker binds
itself so; in-process the engine would otherwise keep every core), which the
caller sets with OMP_NUM_THREADS=1 and this script with the CPU affinity.
On a CUDA device the forward is timed between device synchronizations (the
GPU's time, not the launch's) and no affinity is set. --worker-forward times the
forward inside the served worker process instead (benchmarks/worker_forward_timer,
CPU: no device synchronization) and adds its median to the result beside the
throughput of the same runs.
"""

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    model, kwargs, batch, out_len, reps = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:6])
    forward_only = "--forward-only" in sys.argv
    forward_times: list[float] = []
    if forward_only:
        import torch

        sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
        if not torch.cuda.is_available():
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

        def timed(original):
            def forward(self, *args, **kw):
                sync()
                start = time.perf_counter()
                out = original(self, *args, **kw)
                sync()
                if kw.get("input_ids") is not None and kw["input_ids"].shape[0] == batch:
                    forward_times.append(time.perf_counter() - start)
                return out

            return forward

        _time_forwards(timed)
    timer_dir = _time_worker_forward(batch) if "--worker-forward" in sys.argv else None
    from vllm import LLM, SamplingParams

    spec = "speculative_config" in kwargs  # then also report the acceptance (engine stats on)
    llm = LLM(**{"model": model, "dtype": "float32", "max_model_len": 1024, "seed": 0, **kwargs}
              | ({"disable_log_stats": False} if spec else {}))  # fmt: skip
    prompts = [{"prompt_token_ids": [(7 * i + j) % 200 + 10 for j in range(32)]} for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    rates = []
    for _ in range(reps):
        forward_times.clear()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
    result = {"best": max(rates), "median": statistics.median(rates)}
    if spec:
        totals = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
        drafts = totals.get("vllm:spec_decode_num_drafts", 0)
        accepted = totals.get("vllm:spec_decode_num_accepted_tokens", 0)
        # Tokens per verified step: the bonus token plus the accepted drafts.
        result["acceptance_length"] = 1 + accepted / drafts if drafts else None
    if timer_dir is not None:
        # One file per process, one full-batch forward's seconds per line.
        times = [float(t) for f in timer_dir.glob("*.txt") for t in f.read_text().split()]
        shutil.rmtree(timer_dir)
        result["worker_forward_ms"] = statistics.median(times) * 1000 if times else None
        result["worker_forwards"] = len(times)
    if forward_only:
        result["forward_ms"] = statistics.median(forward_times) * 1000
        result["forward_limit"] = batch / statistics.median(forward_times)
        import torch

        result["forward_threads"] = torch.get_num_threads()
        result["forward_cores"] = sorted(os.sched_getaffinity(0))
    print("RESULT " + json.dumps(result), flush=True)


def _time_forwards(timed) -> None:
    """Wrap the model's forward as the runner calls it, on the runner this vLLM has."""
    try:  # Model Runner V1 (vLLM up to 0.33.0): the runner's own forward method
        from vllm.v1.worker import gpu_model_runner

        runner = gpu_model_runner.GPUModelRunner
        runner._model_forward = timed(runner._model_forward)
        return
    except ImportError:
        pass
    # Model Runner V2 only (0.34.0 on): the runners call the model itself; wrap its class's
    # forward once the runner has loaded it.
    from vllm.v1.worker.cpu.standalone_model_runner import StandaloneCPUModelRunner
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    for runner in (StandaloneCPUModelRunner, GPUModelRunner):
        runner.load_model = _then_time_model(runner.load_model, timed)


def _then_time_model(load_model, timed):
    def load(self, *args, **kw):
        out = load_model(self, *args, **kw)
        cls = type(self.model)
        if not getattr(cls, "_forward_timed", False):
            cls.forward, cls._forward_timed = timed(cls.forward), True
        return out

    return load


def _time_worker_forward(batch: int) -> Path:
    """Have the engine processes spawned from here time their forwards."""
    timer_dir = Path(tempfile.mkdtemp(prefix="worker-forward-"))
    hook = Path(__file__).resolve().parent / "worker_forward_timer"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    os.environ["OVERLAY_BENCH_FORWARD_DIR"] = str(timer_dir)
    os.environ["OVERLAY_BENCH_FORWARD_BATCH"] = str(batch)
    return timer_dir


if __name__ == "__main__":
    main()
