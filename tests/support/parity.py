"""The parity matrix shared by the LLM parity tests: prompts, sampling cases, engines.

Each engine configuration runs every case in one engine start (tests/support/
generate.py in a build's venv); outputs are compared token for token, text and
finish reasons included, logprobs by token id and rank and in value within
LOGPROB_TOL.
"""

from __future__ import annotations

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
    "max3": {"temperature": 0.0, "max_tokens": 3, "ignore_eos": True},  # fewer than a multi-step window
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

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

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
    "structured": (
        "llama",
        {},
        [
            {
                "prompts": PROMPTS[:4],
                "params": {"temperature": 0.0, "max_tokens": 40, "structured_outputs": {"json": SCHEMA}},
            }
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


def assert_same_outputs(ours: dict, theirs: dict, engine: str = "", cases: list | None = None) -> None:
    """Token-for-token equality, with a readable first difference (cases: the engine's by default)."""
    cases = ENGINES[engine][2] if cases is None else cases
    for case, (our_case, their_case) in zip(cases, zip(ours["cases"], theirs["cases"], strict=True), strict=True):
        for i, (a, b) in enumerate(zip(our_case, their_case, strict=True)):
            where = f"{engine} {case['params']} prompt {i}"
            assert _logprob_rows(a["prompt_logprobs"]) == _logprob_rows(b["prompt_logprobs"]), where
            _close(a["prompt_logprobs"], b["prompt_logprobs"], where)
            for x, y in zip(a["outputs"], b["outputs"], strict=True):
                assert x["token_ids"] == y["token_ids"], f"{where}: {first_diff(x['token_ids'], y['token_ids'])}"
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


def first_diff(a: list[int], b: list[int]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"first difference at output token {i}: overlay {a[i : i + 4]} vs upstream {b[i : i + 4]}"
