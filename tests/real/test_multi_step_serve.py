"""Multi-step decode through `vllm serve --num-scheduler-steps 8` with the `openai` client.

Against upstream's server (single step, the oracle): every case of the server
parity set (completions and chat, streaming and not, greedy, seeded, n=2,
logprobs, penalties), stop strings inside a window, requests that arrive
while another request's windows are running, and a client that disconnects
mid-window: the request must stop, no token after the abort may be counted,
and the KV cache must be empty again. Then the fuzzer's served batches
(overlay/fuzz/served.py): the mixed-logprobs batch that once killed the
server, and seeded random mixed batches with staggered arrivals and clients
that leave mid-stream.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
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
from support.venvs import windows_runner

from overlay import fuzz

# Multi-step windows only (skipped, with the reason, on a release that has none); on every
# supported release (apply.py test), each on its own runner.
pytestmark = [pytest.mark.every_release, pytest.mark.usefixtures("windows")]

STEPS = 8


@pytest.fixture(scope="module")
def servers(served):
    with served("--num-scheduler-steps", str(STEPS)) as pair:
        yield pair


@pytest.mark.parametrize("case", list(CASES))
def test_multi_step_server_matches_upstream(servers, case):
    fn, stream, params = CASES[case]
    assert_same(fn(servers["overlay"], stream, **dict(params)), fn(servers["upstream"], stream, **dict(params)))


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_inside_a_window(servers, stream):
    params = {**GREEDY, "max_tokens": 40, "stop": ["e", "th"]}
    theirs = completion(servers["upstream"], stream, **params)
    assert any(len(c["text"]) < 20 for c in theirs)  # the stop strings cut some answers short
    assert_same(completion(servers["overlay"], stream, **params), theirs)


def _stream_text(server, prompt: str, max_tokens: int, arrivals=None) -> str:
    """Stream one completion; after its 5th chunk, run `arrivals` (requests arriving mid-window)."""
    parts = []
    chunks = client_for(server).completions.create(
        model=MODEL, prompt=prompt, stream=True, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True}
    )
    result = None
    with ThreadPoolExecutor(4) as pool:
        for i, chunk in enumerate(chunks):
            parts.append(chunk.choices[0].text)
            if i == 5 and arrivals is not None:
                result = pool.submit(arrivals)
    return "".join(parts), (result.result() if result else None)


def test_requests_arriving_mid_window(servers):
    """The arrivals get upstream's answers, and so does the request whose windows they cut. On
    Model Runner V2 the windows yield to them; three arrivals beside one running request are
    admitted in a single step (their first tokens' wait in a window would outweigh the step
    boundary it saves: multi_step_join's default) and decode in the next windows (the cut windows
    and the tokens made in windows on /metrics); on Model Runner V1 they wait for the window in
    flight and are admitted in a single step."""

    def arrivals(server):
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(completion, server, False, **{**GREEDY, "max_tokens": 30}) for _ in range(3)]
            return [f.result() for f in futures]

    overlay = servers["overlay"]
    counts = _window_counts(overlay)
    ours_long, ours_new = _stream_text(overlay, PROMPTS[1], 300, lambda: arrivals(overlay))
    theirs_long, _ = _stream_text(servers["upstream"], PROMPTS[1], 300)
    assert ours_long == theirs_long
    theirs_new = completion(servers["upstream"], False, **{**GREEDY, "max_tokens": 30})
    assert all(answer == theirs_new for answer in ours_new)
    if windows_runner() == "mrv2":
        grown = {name: value - counts[name] for name, value in _window_counts(overlay).items()}
        assert grown["yielded"] >= 1 and grown["windows"] > grown["yielded"], grown
        # most tokens made in windows; the admitting single steps made the arrivals' first tokens
        # (each arrival is a completion of len(PROMPTS) requests) and, at most one such step per
        # arrival, a token for each request running beside them
        num_arrived = 3 * len(PROMPTS)
        assert grown["window"] >= 300 and grown["window"] >= 0.9 * grown["generated"], grown
        assert num_arrived <= grown["arrival"] <= num_arrived + 3 * (1 + num_arrived), grown


def _window_counts(server) -> dict[str, float]:
    """The multi-step counters on the server's /metrics."""
    tokens = "vllm:multi_step_generation_tokens_total"
    return {
        "windows": server.metric("vllm:multi_step_windows_total"),
        "yielded": server.metric("vllm:multi_step_windows_yielded_total"),
        "window": server.metric(tokens, reason="window"),
        "arrival": server.metric(tokens, reason="arrival"),
        "generated": server.metric(tokens),
    }


def test_client_disconnect_mid_window(servers):
    assert_disconnect_frees_the_request(servers["overlay"], servers["upstream"], PROMPTS[0])


def test_fuzzed_mixed_batches_through_the_server(servers):
    """Issue 18's served crash (sixteen concurrent completions, logprobs on the
    three shortest) and seeded random mixed batches: every request answered as
    upstream's server answers it, the KV cache empty after each batch, the
    generation-token count upstream's, the server alive throughout."""
    report = fuzz.served_batches(servers, 1801, 6)
    assert not report["failures"], report["failures"]
    kinds = report["requests_compared"]
    assert kinds.get("exact", 0) > 30 and kinds.get("prefix", 0) > 0, kinds
