"""Run prompts through ``vllm.LLM`` and write the outputs as JSON.

Runs inside a venv holding one vLLM build (upstream or overlay), so the same
spec can be run on both and the outputs compared token for token.

Usage: python generate.py SPEC.json OUT.json, where SPEC is
{"llm": {LLM kwargs}, "cases": [{"prompts": [...], "params": {SamplingParams kwargs}}]}
(and optionally "env": variables set for the engine, e.g. each rank's CPU threads)
and/or "batches" (the fuzzer's, run by engine_batches.py after the cases, so one
engine start serves a parity run and the fuzzer's slice);
or python generate.py --serve, which runs one such job per line of standard
input ({"spec": SPEC.json, "out": OUT.json, "log": LOG}) in this one process, so
vLLM is imported once for all of them (about 10 s per engine start on the test
machines). Each job's engine is shut down before the next starts, its output
(this process's and its engine processes') goes to its own log, and the
environment is restored after it; "ok" or "error" answers each line.
OUT holds, per case and prompt, each completion's token ids, text, finish
reason and logprobs, the prompt logprobs, the engine's resolved async
scheduling setting, and the engine's counters after all cases (preemptions,
prefix-cache hits, spec-decode acceptance, engine steps) and what each case
added to them ("case_counters"), so tests can show a feature was really
exercised, by one case of an engine shared by several tests.
"""

import json
import os
import sys
import traceback
from contextlib import contextmanager


def _logprobs(entries) -> list | None:
    """Per position: [[token_id, logprob, rank], ...] sorted by token id."""
    if entries is None:
        return None
    return [None if pos is None else sorted([tid, lp.logprob, lp.rank] for tid, lp in pos.items()) for pos in entries]


_GAUGES: set[str] = set()  # names _counters saw as gauges (a value, not a running total)


def _counters(llm) -> dict[str, float]:
    from vllm.v1.metrics.reader import Counter, Gauge, Histogram

    totals: dict[str, float] = {}
    for metric in llm.get_metrics():
        if isinstance(metric, (Counter, Gauge)):
            totals[metric.name] = totals.get(metric.name, 0) + metric.value
            if isinstance(metric, Gauge):
                _GAUGES.add(metric.name)
        elif isinstance(metric, Histogram):  # e.g. vllm:iteration_tokens_total_count: engine steps
            totals[metric.name + "_count"] = totals.get(metric.name + "_count", 0) + metric.count
    return totals


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """What one case added to each counter (a gauge: its value after the case)."""
    return {k: v if k in _GAUGES else v - before.get(k, 0) for k, v in after.items()}


def run(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    from vllm import LLM

    os.environ.update(spec.get("env", {}))  # e.g. the CPU threads each rank binds; --serve restores it
    # The multiprocessing executor, as without VLLM_ENABLE_V1_MULTIPROCESSING=0 (engines.py):
    # the model runs in its own worker process behind the shared-memory queues.
    llm = LLM(**{"disable_log_stats": False, "distributed_executor_backend": "mp", **spec["llm"]})
    try:
        out = {"async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling)}
        if "cases" in spec:
            out["cases"], out["case_counters"] = [], []
            for case in spec["cases"]:
                before = _counters(llm)
                out["cases"].append(_case(llm, case))
                out["case_counters"].append(_delta(_counters(llm), before))
            out["counters"] = _counters(llm)  # the cases' alone: batches run after them
        if "batches" in spec:  # the fuzzer's: per-request parameters, arrivals, aborts
            from engine_batches import run_batches

            out = run_batches(llm, spec["batches"], out_path, sys.modules[__name__], out)
        out.setdefault("counters", _counters(llm))
        out["gauges"] = sorted(_GAUGES)
    finally:  # the next job of --serve must not start beside this engine's processes
        llm.llm_engine.engine_core.shutdown()
    with open(out_path, "w") as f:
        json.dump(out, f)


def _case(llm, case: dict) -> list[dict]:
    """One batch: the same parameters for every prompt, or a list of them (one per prompt); a
    prompt is text or token ids."""
    params = case["params"]
    sampling = [_sampling(p) for p in params] if isinstance(params, list) else _sampling(params)
    prompts = [p if isinstance(p, str) else {"prompt_token_ids": p} for p in case["prompts"]]
    results = llm.generate(prompts, sampling, use_tqdm=False)
    return [{"prompt_logprobs": prompt_logprobs(r), "outputs": [output(c) for c in r.outputs]} for r in results]


def _sampling(params: dict):
    from vllm import SamplingParams

    params = dict(params)
    if "structured_outputs" in params:  # e.g. {"json": schema}
        from vllm.sampling_params import StructuredOutputsParams

        params["structured_outputs"] = StructuredOutputsParams(**params["structured_outputs"])
    if "logit_bias" in params:  # JSON keys are strings
        params["logit_bias"] = {int(k): v for k, v in params["logit_bias"].items()}
    return SamplingParams(**params)


def prompt_logprobs(result) -> list | None:
    return _logprobs(result.prompt_logprobs)


def output(completion) -> dict:
    """One completion: token ids, text, finish and stop reasons, logprobs."""
    return {
        "token_ids": list(completion.token_ids),
        "text": completion.text,
        "finish_reason": completion.finish_reason,
        "stop_reason": completion.stop_reason,
        "logprobs": _logprobs(completion.logprobs),
    }


@contextmanager
def _output_to(log_path: str):
    """This process's stdout and stderr (fds 1 and 2, which engine processes inherit) to a file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def serve() -> None:
    import vllm  # noqa: F401  (imported once, for every job)

    # Replies get the pipe to themselves: anything else this process prints
    # between jobs (a late log line) goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        job = json.loads(line)
        environ = dict(os.environ)  # vLLM's platform setup writes to it
        status = "ok"
        with _output_to(job["log"]):
            try:
                run(job["spec"], job["out"])
            except Exception:
                traceback.print_exc()
                status = "error"
        os.environ.clear()
        os.environ.update(environ)
        print(status, file=replies, flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        run(sys.argv[1], sys.argv[2])
