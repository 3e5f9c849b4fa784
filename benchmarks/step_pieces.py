"""Host time of each piece of a decode step, in-process: where a window's step goes, in microseconds.

Usage (the build's venv python): python benchmarks/step_pieces.py MODEL N BATCH OUT_LEN [--no-first-step-reuse]
e.g. build/venvs/overlay-0.34.0/bin/python benchmarks/step_pieces.py build/models/bench-tiny 8 32 128
A/B of a window's step 1 on the kept batch (KeptBatchInnerSteps.execute_first) against the runner's
own step 1, ROUNDS alternating runs of each, each in its own process:
  ... step_pieces.py MODEL N BATCH OUT_LEN --ab ROUNDS --json FILE

The engine core and the worker run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), on one
core with one torch thread, as the served worker runs its forward. Each listed function of the
runner, the sampler, the window (vllm/v1/worker/gpu/multi_step/: window.py, kept_batch.py) and
the scheduler is wrapped with a timer for three generate() calls of BATCH greedy requests after a
warm-up, and the table gives calls, time per call and time per decode step (totals are
inclusive: a piece's callees are in it too). The sum is the whole engine's, scheduler and output
processing included, which the served engine runs in other processes: read the pieces against the
forward of the same run (this host's speed moves by 2x between runs). Written for Model Runner
V2's standalone CPU runner (vLLM 0.34.0); a name a build lacks is skipped.
"""

import collections
import json
import os
import sys
import time

# In-process, one core, one torch thread; a small KV cache (the default one takes minutes to allocate).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

TOTAL: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()
TIMING = [False]

# (module or object path, function names): resolved once the engine is up.
PIECES = {
    "worker": ["execute_model", "sample_tokens"],
    "runner": ["execute_model", "sample_tokens", "sample", "postprocess_sampled", "prepare_attn", "prepare_inputs",
               "gather_batch_req_state", "add_requests", "update_requests", "finish_requests", "free_states"],
    "runner.model_state": ["prepare_attn", "preprocess_state"],
    "runner.model": ["compute_logits"],
    "type(runner.model)": ["forward"],
    "type(runner.sampler)": ["__call__", "sample", "apply_sampling_params", "get_logprobs_dims"],
    "sampler_module": ["get_num_sampled_and_rejected", "gumbel_sample"],
    "window": ["sample_tokens", "first_step", "_run_window"],
    "window_module": ["merge_step_outputs"],
    "requests": ["advance", "next_step"],
    "inner": ["execute", "execute_first", "sample", "_execute_kept", "_forward", "_attention_inputs", "_sample"],
    "inner_module": ["prepare_pos_seq_lens", "combine_sampled_and_draft_tokens", "_refresh_cpu_attention",
                     "sample_inner_step"],
    "scheduler": ["schedule", "update_from_output"],
}  # fmt: skip


def wrap(owner, name: str, label: str) -> None:
    original = getattr(owner, name, None)
    if original is None:
        return

    def timed(*args, **kwargs):
        if not TIMING[0]:
            return original(*args, **kwargs)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TOTAL[label] += time.perf_counter() - start
            CALLS[label] += 1

    setattr(owner, name, timed)


def worker_host_share(result: dict) -> float:
    """The worker's host time per step outside the forward, as a share of the forward: its two
    entry points, which nothing else of the step nests in (an inner step that falls back to the
    runner's execute_model is inside the window's sample_tokens)."""
    pieces = result["pieces"]
    forward = pieces["type(runner.model).forward"]["us_per_step"]
    worker = pieces["worker.execute_model"]["us_per_step"] + pieces["worker.sample_tokens"]["us_per_step"]
    return (worker - forward) / forward


def ab(args: list[str], rounds: int, out: str) -> None:
    """Alternate runs without and with a window's step 1 on the kept batch; write their shares."""
    import statistics
    import subprocess

    runs: dict[str, list[dict]] = {"runner's step 1": [], "step 1 on the kept batch": []}
    for _ in range(rounds):
        for label, extra in zip(runs, (["--no-first-step-reuse"], []), strict=True):
            proc = subprocess.run([sys.executable, __file__, *args, *extra], capture_output=True, text=True, check=True)
            result = json.loads(proc.stdout.split("RESULT ", 1)[1])
            forward = result["pieces"]["type(runner.model).forward"]["us_per_step"]
            runs[label].append({"us_per_step": result["us_per_step"], "forward_us": forward,
                                "worker_host_over_forward": worker_host_share(result)})  # fmt: skip
            print(label, runs[label][-1], flush=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pathlib import Path

    from harness import results

    summary = {
        "median_worker_host_over_forward": {
            label: statistics.median(r["worker_host_over_forward"] for r in rs) for label, rs in runs.items()
        },
        "median_us_per_step": {label: statistics.median(r["us_per_step"] for r in rs) for label, rs in runs.items()},
    }
    rows = [{"config": label, "round": i + 1, **run} for label, rs in runs.items() for i, run in enumerate(rs)]
    model, steps, batch, out_len = args[0], int(args[1]), int(args[2]), int(args[3])
    arguments = {"model": model, "steps": steps, "batch": batch, "out_len": out_len, "rounds": rounds}
    notes = ("In-process (benchmarks/step_pieces.py), one core, one torch thread; the worker's host time per step "
             "outside the forward (the worker's execute_model + sample_tokens - forward) as a share of the "
             "forward of the same run.")  # fmt: skip
    data = results.make("session", arguments=arguments, runs=rows, summary=summary, python=Path(sys.executable),
                        notes=notes)  # fmt: skip
    results.write(data, Path(out))
    print(summary)


def main() -> None:
    if "--ab" in sys.argv:
        at = sys.argv.index("--ab")
        ab(sys.argv[1:at], int(sys.argv[at + 1]), sys.argv[sys.argv.index("--json") + 1])
        return
    model, steps, batch, out_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import vllm.v1.worker.cpu.sampler as sampler_module
    import vllm.v1.worker.gpu.multi_step.kept_batch as inner_module
    import vllm.v1.worker.gpu.multi_step.window as window_module
    import vllm.v1.worker.gpu.multi_step.window_requests as requests_module
    from vllm import LLM, SamplingParams

    if "--no-first-step-reuse" in sys.argv:  # every window's step 1 through the runner's execute_model
        inner_module.KeptBatchInnerSteps._execute_first = lambda self, scheduler_output: False
    llm = LLM(model=model, dtype="float32", max_model_len=1024, seed=0,
              **({"num_scheduler_steps": steps} if steps > 1 else {}))  # fmt: skip
    core = llm.llm_engine.engine_core.engine_core
    worker = core.model_executor.driver_worker.worker
    runner = worker.model_runner
    owners = {
        "worker": worker,
        "runner": runner,
        "runner.model_state": runner.model_state,
        "runner.model": runner.model,
        "type(runner.model)": type(runner.model),
        "type(runner.sampler)": type(runner.sampler),
        "sampler_module": sampler_module,
        "window": window_module.ModelRunnerV2Windows,
        "window_module": window_module,
        "requests": requests_module.PlainRequests,
        "inner": inner_module.KeptBatchInnerSteps,
        "inner_module": inner_module,
        "scheduler": core.scheduler,
    }
    for owner_name, names in PIECES.items():
        for name in names:
            if owners[owner_name] is not None:
                wrap(owners[owner_name], name, f"{owner_name}.{name}")

    prompts = [{"prompt_token_ids": [(7 * i + j) % 200 + 10 for j in range(32)]} for i in range(batch)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    reps = 3
    TIMING[0] = True
    start = time.perf_counter()
    for _ in range(reps):
        llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    TIMING[0] = False
    num_steps = reps * out_len
    print(f"{batch * num_steps / elapsed:.0f} tok/s, {elapsed / num_steps * 1e6:.0f} us a step (in-process, one core)")
    rows = sorted(TOTAL, key=TOTAL.get, reverse=True)
    for label in rows:
        per_call, per_step = TOTAL[label] / CALLS[label] * 1e6, TOTAL[label] / num_steps * 1e6
        print(f"{label:50s} calls {CALLS[label]:6d}  per call {per_call:8.1f} us  per step {per_step:8.1f} us")
    result = {label: {"calls": CALLS[label], "us_per_step": TOTAL[label] / num_steps * 1e6} for label in rows}
    summary = {"us_per_step": elapsed / num_steps * 1e6, "pieces": result}
    print(f"worker host outside the forward: {worker_host_share(summary):.3f} of the forward")
    print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
    main()
