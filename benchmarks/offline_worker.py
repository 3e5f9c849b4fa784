"""Runs inside one build's venv: decode throughput of `vllm.LLM`, or the forward-only time.

Usage: python offline_worker.py MODEL '{"LLM kwargs"}' BATCH OUT_LEN REPS [--forward-only | --worker-forward]
       [--serve] [--decode-phase]
Prints one line "RESULT {json}". Throughput: BATCH prompts of 32 token ids,
OUT_LEN tokens each (ignore_eos, greedy), best and median output tokens/s of
REPS runs after a warm-up. --forward-only runs the engine in-process and times
the model's forward passes of full-batch decode steps alone: BATCH / that time
is the physical limit no scheduling can beat. The same steps also give the
forward+sample limit: BATCH / (the forward's time + the time of upstream's
sampling of the same step, the logits and the sampler as the runner calls them,
added up per step: forward_hooks.py `StepTimes`), the floor of a decode loop that
keeps upstream's sampling. Both are medians over the steps (fields forward_ms,
forward_limit, forward_sample_ms, forward_sample_limit; sampling_ms the sampling
alone; forward_steps and forward_sample_steps how many steps each is of; the
forward+sample fields null where no step's sampling was timed). It runs the forward as the served
worker does: one torch thread on one core (the multiprocess CPU worker binds
itself so; in-process the engine would otherwise keep every core), which the
caller sets with OMP_NUM_THREADS=1 and this script with the CPU affinity.
On a CUDA device the forward is timed between device synchronizations (the
GPU's time, not the launch's) and no affinity is set. --worker-forward times the
forward inside the served worker process instead (benchmarks/worker_forward_timer,
CPU: no device synchronization) and adds its median to the result beside the
throughput of the same runs. BATCH may list several sizes ("32,128"): one engine
start measures each in turn, and RESULT maps each size to its own result.

--serve keeps the engine up for a caller that interleaves several engines
(benchmarks/harness/worker.py `Served`): after the warm-up (a full-length
generate() too, untimed) it prints "READY", then answers each line "run" on
stdin with one timed generate() of BATCH prompts, printed as one line
"RATE {json}" (the fields of RESULT, from that one call), until stdin closes.
--decode-phase also gives the decode phase's tokens/s ("decode_median": see
`_timed_generate`), at the cost of a shorter call before each timed one.
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
    model, kwargs = sys.argv[1], json.loads(sys.argv[2])
    batches, (out_len, reps) = [int(b) for b in sys.argv[3].split(",")], map(int, sys.argv[4:6])
    steps = _time_steps(batches) if "--forward-only" in sys.argv else None
    if "--worker-forward" in sys.argv and len(batches) > 1:
        sys.exit("--worker-forward times one batch size (its forwards are told apart by their rows only)")
    timer_dir = _time_worker_forward(batches[0]) if "--worker-forward" in sys.argv else None
    from vllm import LLM

    spec = "speculative_config" in kwargs  # then also report the acceptance (engine stats on)
    llm = LLM(**{"model": model, "dtype": "float32", "max_model_len": 1024, "seed": 0, **kwargs}
              | ({"disable_log_stats": False} if spec else {}))  # fmt: skip
    decode_phase = "--decode-phase" in sys.argv
    if "--serve" in sys.argv:
        _serve(llm, batches[0], out_len, steps, decode_phase)
        return
    results = {}
    for batch in batches:
        results[batch] = _measure(llm, batch, out_len, reps, steps, decode_phase)
        if spec:
            results[batch]["acceptance_length"] = _acceptance_length(llm)
    if timer_dir is not None:
        # One file per process, one full-batch forward's seconds per line.
        times = [float(t) for f in timer_dir.glob("*.txt") for t in f.read_text().split()]
        shutil.rmtree(timer_dir)
        results[batches[0]]["worker_forward_ms"] = statistics.median(times) * 1000 if times else None
        results[batches[0]]["worker_forwards"] = len(times)
    result = results[batches[0]] if len(batches) == 1 else {"batches": results}
    print("RESULT " + json.dumps(result), flush=True)


def _measure(llm, batch: int, out_len: int, reps: int, steps, decode_phase: bool) -> dict:
    """Output tokens/s of REPS runs of BATCH prompts after a warm-up; with steps (forward_hooks.StepTimes),
    the limits of the last run's steps."""
    timed = _timed_generate(llm, batch, out_len, steps, decode_phase)
    rates, decode_rates = [], []
    for _ in range(reps):
        rate, decode_rate = timed()
        rates.append(rate)
        decode_rates.append(decode_rate)
    decode = {"decode_median": statistics.median(decode_rates)} if None not in decode_rates else {}
    return {"best": max(rates), "median": statistics.median(rates)} | decode | _limits(batch, steps)


def _serve(llm, batch: int, out_len: int, steps, decode_phase: bool) -> None:
    """One timed generate() per "run" line on stdin, after a full-length warm-up (see the docstring)."""
    timed = _timed_generate(llm, batch, out_len, steps, decode_phase)
    timed()  # untimed: the first full-length call is slower than the rest
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            sys.exit(f"offline_worker.py --serve: unknown command {line.strip()!r} (expected 'run')")
        rate, decode_rate = timed()
        decode = {"decode_median": decode_rate} if decode_rate is not None else {}
        print("RATE " + json.dumps({"best": rate, "median": rate} | decode | _limits(batch, steps)), flush=True)


# The shorter call the decode phase is measured against: tokens per request.
SHORT_LEN = 16


def _timed_generate(llm, batch: int, out_len: int, steps, decode_phase: bool):
    """After a short warm-up, a function that times one generate() of BATCH prompts of OUT_LEN
    tokens each (greedy, ignore_eos): its output tokens/s, and with decode_phase the decode
    phase's alone (else None). With steps (forward_hooks.StepTimes), it holds the steps of that
    one full call when the function returns.

    The decode phase's tok/s is the difference of two calls with the same prompts: the same
    prompts for SHORT_LEN tokens each are timed first, and the tokens the full call adds per
    request (OUT_LEN - SHORT_LEN) are divided by the time it adds. Both calls pay the batch's
    prefill and whatever the first steps after it cost, so neither counts. Multi-step decode and
    async scheduling act on that phase; the prefill (the same work in every build) weighs more in
    a faster build's total. None where OUT_LEN is not above SHORT_LEN.
    """
    prompts = [{"prompt_token_ids": [(7 * i + j) % 200 + 10 for j in range(32)]} for i in range(batch)]
    params = _params(batch, out_len)
    short = _params(batch, SHORT_LEN)
    llm.generate(prompts, short, use_tqdm=False)

    def timed() -> tuple[float, float | None]:
        short_elapsed = None
        if decode_phase and out_len > SHORT_LEN:
            start = time.perf_counter()
            llm.generate(prompts, short, use_tqdm=False)
            short_elapsed = time.perf_counter() - start
        if steps is not None:  # the full call's steps only, not the short call's
            steps.clear(batch)
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        rate = sum(len(o.outputs[0].token_ids) for o in outs) / elapsed
        if short_elapsed is None:
            return rate, None
        return rate, len(outs) * (out_len - SHORT_LEN) / (elapsed - short_elapsed)

    return timed


# OFFLINE_STRUCTURED_EVERY=k: every k-th request of a batch is constrained by a regular expression
# with no end (structured outputs through the engine's grammar backend: every step of a batch that
# holds one is masked), so that it runs its OUT_LEN tokens like the others.
STRUCTURED_REGEX = r"[a-z ]+"


def _params(batch: int, max_tokens: int):
    """Each request's SamplingParams: greedy, ignore_eos, structured where OFFLINE_STRUCTURED_EVERY says."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    every = int(os.environ.get("OFFLINE_STRUCTURED_EVERY", "0"))
    plain = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    if not every:
        return plain
    regex = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                           structured_outputs=StructuredOutputsParams(regex=STRUCTURED_REGEX))  # fmt: skip
    return [regex if i % every == 0 else plain for i in range(batch)]


def _time_steps(batches: list[int]):
    """Time every forward, and the sampling after it, of the in-process engine (forward_hooks.StepTimes),
    on one core (CPU) or between device synchronizations (CUDA)."""
    import forward_hooks
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else None
    if not torch.cuda.is_available():
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    return forward_hooks.time_steps(batches, sync)


def _limits(batch: int, steps) -> dict:
    """The limits' fields of a result (none without steps): the medians over the full-batch decode
    steps of the forward, of the forward + sampling and of the sampling alone, the limits they
    give (BATCH / that time) and how many steps each median is of."""
    if steps is None:
        return {}
    import torch

    forward, both, sampling = steps.forward[batch], steps.forward_sample[batch], steps.sampling[batch]
    return {
        "forward_ms": statistics.median(forward) * 1000,
        "forward_limit": batch / statistics.median(forward),
        "forward_sample_ms": statistics.median(both) * 1000 if both else None,
        "forward_sample_limit": batch / statistics.median(both) if both else None,
        "sampling_ms": statistics.median(sampling) * 1000 if sampling else None,
        "forward_steps": len(forward),
        "forward_sample_steps": len(both),
        "forward_threads": torch.get_num_threads(),
        "forward_cores": sorted(os.sched_getaffinity(0)),
    }


def _acceptance_length(llm) -> float | None:
    """Tokens per verified step so far: the bonus token plus the accepted drafts."""
    totals = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    drafts = totals.get("vllm:spec_decode_num_drafts", 0)
    accepted = totals.get("vllm:spec_decode_num_accepted_tokens", 0)
    return 1 + accepted / drafts if drafts else None


def _time_worker_forward(batch: int) -> Path:
    """Have the engine processes spawned from here time their forwards."""
    timer_dir = Path(tempfile.mkdtemp(prefix="worker-forward-"))
    here = Path(__file__).resolve().parent  # the hook, and forward_hooks.py it imports
    path = [str(here / "worker_forward_timer"), str(here), os.environ.get("PYTHONPATH")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, path))
    os.environ["OVERLAY_BENCH_FORWARD_DIR"] = str(timer_dir)
    os.environ["OVERLAY_BENCH_FORWARD_BATCH"] = str(batch)
    return timer_dir


if __name__ == "__main__":
    main()
