"""Batches through `vllm serve`: the same batches sent to upstream's server and the overlay's
(`--num-scheduler-steps 8`) with the `openai` client, compared as the engines' results are."""

from __future__ import annotations

import time
from pathlib import Path

from overlay.fuzz.batches import batches_for, regressions
from overlay.fuzz.compare import compare_batch
from overlay.fuzz.configs import Config

# Served batches: requests start ARRIVAL_S apart per engine step of "arrive";
# an "abort" is a client that closes its stream after that many chunks.
ARRIVAL_S = 0.02
OPENAI_FIELDS = {"max_tokens", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty",
                 "logprobs", "stop", "n", "logit_bias"}  # fmt: skip
# batches for `vllm serve --num-scheduler-steps 8` (structured outputs in the request's body)
SERVED = Config("served-N8", "llama", {}, 8)


def run_served(server, batch: dict, model: str) -> dict:
    """``batch`` through an OpenAI-compatible server, each request from its own thread.

    Returns engine_batches.py's result shape; KV usage (the gauge, as of the
    server's last step) and the generation-token count are read from /metrics
    once the server is idle again.
    """
    from concurrent.futures import ThreadPoolExecutor

    generated_before = server.metric("vllm:generation_tokens_total")
    with ThreadPoolExecutor(len(batch["requests"])) as pool:
        futures = {r["id"]: pool.submit(_served_request, server, r, model) for r in batch["requests"]}
        results = {rid: f.result() for rid, f in futures.items()}
    deadline = time.monotonic() + 120
    while server.metric("vllm:num_requests_running") + server.metric("vllm:num_requests_waiting") > 0:
        if time.monotonic() > deadline:
            raise AssertionError("the server still runs requests 120 s after every client left")
        time.sleep(0.2)
    return {
        "requests": results,
        "kv_freed": server.metric("vllm:kv_cache_usage_perc") == 0,  # as of the server's last step
        "generation_tokens": server.metric("vllm:generation_tokens_total") - generated_before,
    }


def _served_request(server, request: dict, model: str) -> dict:
    import openai
    from support.serve_cases import client_for

    params = dict(request["params"])
    body = {k: params.pop(k) for k in list(params) if k not in OPENAI_FIELDS}
    body["return_token_ids"] = True
    time.sleep(request["arrive"] * ARRIVAL_S)
    client = client_for(server)
    try:
        if request.get("abort") is not None:  # the client leaves mid-stream
            stream = client.completions.create(model=model, prompt=request["prompt"], stream=True,
                                               extra_body=body, **params)  # fmt: skip
            for i, _chunk in enumerate(stream):
                if i + 1 >= request["abort"]:
                    break
            stream.close()
            return {"finished": False, "aborted": True, "outputs": [], "prompt_logprobs": None}
        response = client.completions.create(model=model, prompt=request["prompt"], extra_body=body, **params)
    except openai.BadRequestError:
        return {"rejected": "BadRequestError"}
    outputs = [
        {
            "token_ids": list(c.token_ids or []),
            "text": c.text,
            "finish_reason": c.finish_reason,
            "stop_reason": getattr(c, "stop_reason", None),
            "logprobs": None if c.logprobs is None else
            [sorted([t, lp, None] for t, lp in pos.items()) for pos in c.logprobs.top_logprobs],
            # each position's sampled token as the rows name it (its text), for ties with it
            "sampled_texts": None if c.logprobs is None else list(c.logprobs.tokens or []),
        }
        for c in sorted(response.choices, key=lambda c: c.index)
    ]  # fmt: skip
    return {"finished": True, "aborted": False, "outputs": outputs, "prompt_logprobs": None}


def fuzz_served(pythons: dict[str, Path], model: Path, work: Path, seed: int, count: int) -> dict:
    """``count`` batches through upstream's server and the overlay's `vllm serve --num-scheduler-steps 8`."""
    from support.serve_cases import server_pair

    with server_pair(pythons["upstream"], pythons["overlay"], model, work, ["--num-scheduler-steps", "8"]) as pair:
        return served_batches(pair, seed, count)


def served_batches(pair: dict, seed: int, count: int) -> dict:
    """The mixed-logprobs regression batch and ``count`` random ones on both servers of ``pair``."""
    from support.serve_cases import MODEL

    batches = regressions("default-N8") + batches_for(SERVED, seed, count)
    kinds: dict[str, int] = {}
    failures = []
    ran = 0  # batches sent; the count reported, so a run cut short does not count what it never sent
    for i, batch in enumerate(batches):
        ran += 1
        try:
            ours = run_served(pair["overlay"], batch, MODEL)
        except Exception as e:  # the server died or hung, or the client failed: nothing after this batch runs
            failures.append({"config": SERVED.name, "seed": seed, "batch": i, "minimized": batch,
                             "problems": [f"overlay server: {type(e).__name__}: {e}"]})  # fmt: skip
            break
        problems = compare_batch(SERVED, batch, ours, run_served(pair["upstream"], batch, MODEL), kinds)
        if problems:
            failures.append({"config": SERVED.name, "seed": seed, "batch": i, "problems": problems,
                             "minimized": batch})  # fmt: skip
    return {"batches": ran, "requests_compared": kinds, "failures": failures}
