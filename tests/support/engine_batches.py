"""Run fuzzer batches through one engine: per-request parameters, arrivals, aborts.

Runs inside a venv holding one vLLM build, imported by generate.py for a spec
with "batches" (overlay/fuzz/ writes them). One ``LLM`` serves every
batch; each batch drives its ``LLMEngine`` step by step, so arrivals and
aborts happen at engine steps:

    {"requests": [{"id": "r0", "prompt": [token ids], "params": {SamplingParams},
                   "arrive": engine step, "abort": steps after arrival or null}]}

Each batch's result is written to OUT as soon as it is done, so a crash or a
hang still leaves what ran before it:

    {"batches": [{"requests": {id: {"rejected": message} or {"finished": bool,
      "aborted": bool, "prompt_logprobs": ..., "outputs": [...]}}, "kv_freed": bool,
      "generation_tokens": the batch's vllm:generation_tokens, "steps": int}],
     "failure": null or {"batch": index, "error": traceback}}
"""

from __future__ import annotations

import json
import traceback

# A batch that has not finished after this many engine steps is a hang.
MAX_STEPS = 4000


def run_batches(llm, batches: list[dict], out_path: str, completion, result: dict | None = None) -> dict:
    """Every batch on ``llm``, added to ``result`` (what ran before them, written with
    them); ``completion`` turns a CompletionOutput into JSON."""
    result = {**(result or {}), "batches": [], "failure": None}
    for index, batch in enumerate(batches):
        try:
            result["batches"].append(_run_batch(llm, batch, f"b{index}-", completion))
        except Exception:
            result["failure"] = {"batch": index, "error": traceback.format_exc()}
            _write(out_path, result)
            raise
        _write(out_path, result)
    return result


def _write(path: str, result: dict) -> None:
    with open(path, "w") as f:
        json.dump(result, f)


def _run_batch(llm, batch: dict, prefix: str, completion) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    engine = llm.llm_engine
    generated_before = _metric(llm, "vllm:generation_tokens")
    pending = sorted(batch["requests"], key=lambda r: r["arrive"])
    results: dict[str, dict] = {}
    abort_at: dict[str, int] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests():  # step() would wait for output that never comes
            step = max(step, pending[0]["arrive"])
        while pending and pending[0]["arrive"] <= step:
            request = pending.pop(0)
            params = dict(request["params"])
            try:
                if "structured_outputs" in params:
                    params["structured_outputs"] = StructuredOutputsParams(**params["structured_outputs"])
                engine.add_request(prefix + request["id"], {"prompt_token_ids": request["prompt"]},
                                   SamplingParams(**params))  # fmt: skip
            except Exception as e:  # refused at submission: what a client gets back as a 400
                results[request["id"]] = {"rejected": type(e).__name__}
                continue
            results[request["id"]] = {"finished": False, "aborted": False, "outputs": [], "prompt_logprobs": None}
            if request.get("abort") is not None:
                abort_at[request["id"]] = step + request["abort"]
        for req_id, when in list(abort_at.items()):
            if when <= step:
                del abort_at[req_id]
                if not results[req_id]["finished"]:
                    engine.abort_request([prefix + req_id])
                    results[req_id]["aborted"] = True
        if not engine.has_unfinished_requests():  # all rejected or aborted
            continue
        for output in engine.step():
            result = results[output.request_id.removeprefix(prefix)]
            result["finished"] = output.finished
            if output.prompt_logprobs is not None:
                result["prompt_logprobs"] = completion.prompt_logprobs(output)
            # With n > 1 an output carries only the completions that moved in
            # this step (each cumulative); keep every completion's latest.
            by_index = {c["index"]: c for c in result["outputs"]}
            by_index.update({c.index: {"index": c.index, **completion.output(c)} for c in output.outputs})
            result["outputs"] = [by_index[i] for i in sorted(by_index)]
        step += 1
        if step > MAX_STEPS:
            raise RuntimeError(f"batch still running after {MAX_STEPS} engine steps")
    return {
        "requests": results,
        # Succeeds only when every KV block is free again (it also empties the
        # prefix cache, alike on both builds: hits happen within a batch).
        "kv_freed": llm.reset_prefix_cache(),
        "generation_tokens": _metric(llm, "vllm:generation_tokens") - generated_before,
        "steps": step,
    }


def _metric(llm, name: str) -> float:
    """A counter's value, summed over its label sets."""
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == name)
