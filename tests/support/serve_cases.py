"""OpenAI-client requests and comparisons shared by the server parity tests."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

from support.engines import Server

MODEL = "tiny"
PROMPTS = ["The quick brown fox", "Once upon a time there was", "Hello world!", "What is the capital of France?"]
LOGPROB_TOL = 1e-4


def client_for(server: Server):
    from openai import OpenAI

    return OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def completion(server: Server, stream: bool, **params) -> list[dict]:
    client = client_for(server)
    extra = {"return_token_ids": True, **params.pop("extra_body", {})}
    if not stream:
        out = client.completions.create(model=MODEL, prompt=PROMPTS, extra_body=extra, **params)
        return [
            {
                "index": c.index,
                "text": c.text,
                "finish_reason": c.finish_reason,
                "token_ids": getattr(c, "token_ids", None),
                "logprobs": c.logprobs.top_logprobs if c.logprobs else None,
            }
            for c in out.choices
        ]
    texts: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    for chunk in client.completions.create(model=MODEL, prompt=PROMPTS, stream=True, **params):
        for c in chunk.choices:
            texts.setdefault(c.index, []).append(c.text)
            finish[c.index] = c.finish_reason or finish.get(c.index)
    return [{"index": i, "text": "".join(t), "finish_reason": finish[i]} for i, t in sorted(texts.items())]


def chat(server: Server, stream: bool, **params) -> list[dict]:
    client = client_for(server)
    results = []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        if stream:
            parts, finish = [], None
            for chunk in client.chat.completions.create(model=MODEL, messages=messages, stream=True, **params):
                for c in chunk.choices:
                    parts.append(c.delta.content or "")
                    finish = c.finish_reason or finish
            results.append({"text": "".join(parts), "finish_reason": finish})
        else:
            out = client.chat.completions.create(model=MODEL, messages=messages, **params)
            results.append([{"text": c.message.content, "finish_reason": c.finish_reason} for c in out.choices])
    return results


def assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        if isinstance(a, dict) and a.get("logprobs"):
            la, lb = a.pop("logprobs"), b.pop("logprobs")
            for pa, pb in zip(la, lb, strict=True):
                assert pa.keys() == pb.keys()
                assert all(abs(pa[k] - pb[k]) <= LOGPROB_TOL for k in pa)
        assert a == b


GREEDY = {"temperature": 0.0, "max_tokens": 24}
SEEDED = {"temperature": 0.9, "top_p": 0.95, "seed": 11, "max_tokens": 24}
CASES = {
    "completion-greedy": (completion, False, GREEDY),
    "completion-greedy-stream": (completion, True, GREEDY),
    "completion-seeded": (completion, False, SEEDED),
    "completion-seeded-stream": (completion, True, SEEDED),
    "completion-n2": (completion, False, {**SEEDED, "n": 2}),
    "completion-logprobs": (completion, False, {**GREEDY, "logprobs": 3}),
    "completion-penalties": (completion, False, {**GREEDY, "presence_penalty": 0.7, "frequency_penalty": 0.7}),
    "chat-greedy": (chat, False, GREEDY),
    "chat-seeded-stream": (chat, True, SEEDED),
}


@contextmanager
def _serving(cmd: list, log: Path, extra_env: dict | None = None):
    server = Server(cmd, log, extra_env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _common(model: Path) -> list:
    return [model, "--dtype", "float32", "--max-model-len", "512", "--served-model-name", MODEL, "--seed", "0"]


def upstream_server(upstream_python: Path, model: Path, log: Path, args=(), extra_env: dict | None = None):
    """Upstream's api_server, the oracle (its `vllm` command cannot start), with ``args``."""
    cmd = [upstream_python, "-m", "vllm.entrypoints.openai.api_server", "--model", *_common(model), *args]
    return _serving(cmd, log, extra_env)


def overlay_server(overlay_python: Path, model: Path, log: Path, args=(), extra_env: dict | None = None):
    """The overlay's `vllm serve`, with ``args`` beyond upstream's."""
    return _serving([overlay_python.parent / "vllm", "serve", *_common(model), *args], log, extra_env)


@contextmanager
def server_pair(upstream_python: Path, overlay_python: Path, model: Path, logs: Path, overlay_args=()):
    with (
        upstream_server(upstream_python, model, logs / "up.log") as up,
        overlay_server(overlay_python, model, logs / "overlay.log", overlay_args) as ours,
    ):
        yield {"upstream": up, "overlay": ours}


def assert_disconnect_frees_the_request(overlay: Server, upstream: Server, prompt: str) -> None:
    """A client leaves a 400-token stream after 3 chunks: the request stops, no later token is
    counted, its KV blocks are freed, and the next answer is still upstream's."""
    generated_before = overlay.metric("vllm:generation_tokens_total")
    stream = client_for(overlay).completions.create(
        model=MODEL, prompt=prompt, stream=True, max_tokens=400, temperature=0, extra_body={"ignore_eos": True}
    )
    for i, _chunk in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 60
    while overlay.metric("vllm:num_requests_running") > 0 or overlay.metric("vllm:kv_cache_usage_perc") > 0:
        assert time.monotonic() < deadline, "the aborted request kept running or kept its KV blocks"
        time.sleep(0.5)
    assert overlay.metric("vllm:generation_tokens_total") - generated_before < 400
    assert_same(completion(overlay, False, **GREEDY), completion(upstream, False, **GREEDY))
