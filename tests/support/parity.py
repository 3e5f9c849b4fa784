"""The parity matrix shared by the LLM parity tests: prompts, sampling cases, engines.

Each engine configuration runs every case in one engine start (tests/support/
generate.py in a build's venv); outputs are compared token for token, text and
finish reasons included, logprobs by token id and rank and in value within
LOGPROB_TOL.
"""

from __future__ import annotations

import json

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
# Few sequences and a small budget: long prompts run in chunks (also the budget of
# issue 18's second crash; the fuzzer's chunked configs use it too).
CHUNKED = {"enable_chunked_prefill": True, "max_num_batched_tokens": 64, "max_num_seqs": 4}
# 6 blocks of 128 tokens for 8 requests growing to ~170 tokens (2 blocks) each
PREEMPT = {"num_gpu_blocks_override": 6, "block_size": 128, "max_num_seqs": 8}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# Prefix caching is on by default: shared prefixes hit the cache (and so does
# every case after the first, with the same prompts).
PREFIX_CASES = [
    {"prompts": SHARED_PREFIX, "params": CASES["greedy"]},
    {"prompts": SHARED_PREFIX, "params": CASES["seeded"]},
]
# Each structured-output option vLLM takes (StructuredOutputsParams fields), as the structured
# tests and the fuzzer send them.
CHOICES = ["alpha beta gamma", "delta epsilon", "zeta"]
STRUCTURED_OPTIONS = {
    "json": {"json": SCHEMA},
    "json_object": {"json_object": True},
    "regex": {"regex": r"[a-z]{3,8}( [0-9]{1,3}){2,5}"},
    "choice": {"choice": CHOICES},
    "grammar": {"grammar": 'root ::= "(" expr ")"\nexpr ::= [a-z]+ | [a-z]+ " " expr'},
    "structural_tag": {
        "structural_tag": json.dumps(
            {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f"]}
        )
    },
}
STRUCTURED_CASE = {
    "prompts": PROMPTS[:4],
    "params": {"temperature": 0.0, "max_tokens": 40, "structured_outputs": {"json": SCHEMA}},
}
# Greedy cases for speculative decoding inside windows (tests/real/test_multi_step_spec.py,
# whose oracle is this engine's upstream run: drafts may change speed, never tokens).
SPEC_CASES = [
    {"prompts": REPETITIVE + PROMPTS, "params": {**CASES["greedy"], "max_tokens": 48}},
    {"prompts": PROMPTS, "params": CASES["stop_ids"]},  # stops inside windows, inside accepted drafts
    {"prompts": PROMPTS, "params": CASES["max3"]},  # fewer tokens than a window
    {"prompts": PROMPTS, "params": {**CASES["logprobs"], "prompt_logprobs": None}},  # rows per accepted token
]
# Outputs past the first KV block (128 tokens on CPU): a window's step 1 brings new blocks
# for a batch that is otherwise the window before's (vllm/v1/worker/gpu/multi_step/kept_batch.py
# gathers the block tables again then).
PAST_A_BLOCK_CASE = {"prompts": PROMPTS, "params": {**CASES["greedy"], "max_tokens": 136}}
# Cases only the overlay runs, after the engine's own: upstream 0.32.0 on CPU dies on a seeded
# request whose prompt is prefilled in chunks (patch 0017 mends it), so their oracle is upstream's
# run of the same requests prefilled whole (the llama engine's CHUNKED_SEEDED_CASE). The prompts
# (LONG_PROMPTS' words backwards: 140-150 tokens) share no prefix with the chunked engine's other
# cases, so no cached block shortens them below the 64-token budget.
CHUNKED_SEEDED_CASE = {
    "prompts": [" ".join(reversed(p.split())) for p in LONG_PROMPTS[:3]],
    "params": CASES["seeded"],
}
OVERLAY_CASES = {"chunked": [CHUNKED_SEEDED_CASE]}
# name: (model, extra LLM kwargs, cases). One engine start runs every case of an
# engine: the Llama's sampling matrix, shared prefixes, structured output and the
# spec-decode cases (case_index finds one).
ENGINES = {
    "llama": (
        "llama",
        {},
        SAMPLING + PREFIX_CASES + [STRUCTURED_CASE] + SPEC_CASES + [PAST_A_BLOCK_CASE, CHUNKED_SEEDED_CASE],
    ),
    "chunked": (
        "llama",
        CHUNKED,
        # No seeded sampling here: upstream 0.32 on CPU crashes when a seeded
        # request has a partial prefill chunk ("CPU Generator does not use
        # offset", gpu_model_runner.py:3499), with async scheduling on or off.
        # The overlay runs it (OVERLAY_CASES).
        [
            {"prompts": LONG_PROMPTS, "params": CASES["greedy"]},
            {"prompts": LONG_PROMPTS, "params": CASES["penalties"]},
            {"prompts": LONG_PROMPTS, "params": {**CASES["logprobs"], "prompt_logprobs": 1}},
        ],
    ),
    "preempt": (
        "llama",
        PREEMPT,
        [
            {"prompts": PROMPTS, "params": {**CASES["greedy"], "max_tokens": 160}},
            {"prompts": PROMPTS, "params": {**CASES["seeded"], "max_tokens": 160}},
        ],
    ),
}
# Overlay runs: async scheduling by default (None: the engine decides) and forced off.
ASYNC_MODES = {"default": None, "off": False}


def engine_with(model: str, extra: dict) -> str | None:
    """The ENGINES entry that runs ``model`` with these LLM kwargs beyond BASE, if any."""
    return next((name for name, (m, llm, _) in ENGINES.items() if (m, llm) == (model, extra)), None)


def case_index(engine: str, case: dict) -> int:
    """Where ``case`` is in ``engine``'s cases (and so in its outputs' "cases" and "case_counters")."""
    return ENGINES[engine][2].index(case)


def case_outputs(outputs: dict, engine: str, cases: list[dict]) -> dict:
    """``outputs`` of ``engine`` cut to ``cases`` (consecutive there), with their counters summed."""
    start = case_index(engine, cases[0])
    assert ENGINES[engine][2][start : start + len(cases)] == cases, cases
    counters: dict[str, float] = {}
    for case in outputs["case_counters"][start : start + len(cases)]:
        for name, value in case.items():  # a gauge: its value after the last case
            counters[name] = value if name in outputs["gauges"] else counters.get(name, 0) + value
    return {**outputs, "cases": outputs["cases"][start : start + len(cases)], "counters": counters}


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
