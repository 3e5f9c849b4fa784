"""Batch generation: seeded random mixed batches drawn from the whole SamplingParams surface, and
the regression batches (crashes the fuzzer found once) each configuration runs first."""

from __future__ import annotations

import random

from support.parity import STOP_IDS, STRUCTURED_OPTIONS

from overlay.fuzz.configs import Config

VOCAB = range(4, 512)  # the tiny models' tokens past <s> </s> <unk> <pad>
STOP_STRINGS = ["e", " the", "a", "o", "s t", "\n"]
BAD_WORDS = ["e", "a", "t", " the", "o"]


def random_params(rng: random.Random, config: Config) -> dict:
    """One request's SamplingParams, drawn from the whole surface."""
    kinds = ["greedy", "greedy", "seeded", "seeded", "unseeded"] if config.seeded_random else ["greedy", "unseeded"]
    kind = rng.choice(kinds)
    p: dict = {"max_tokens": rng.choice([1, 2, 3, 5, 8, 12, 17, 24, 33, 40])}
    if kind == "greedy":
        p["temperature"] = 0.0
    else:
        p["temperature"] = round(rng.uniform(0.3, 1.5), 2)
        if rng.random() < 0.4:
            p["top_p"] = round(rng.uniform(0.5, 1.0), 2)
        if rng.random() < 0.4:
            p["top_k"] = rng.choice([1, 5, 20, 100])
        if rng.random() < 0.3 and not config.draft_params:
            p["min_p"] = round(rng.uniform(0.0, 0.2), 3)
        if kind == "seeded":
            p["seed"] = rng.randrange(1 << 20)
    if rng.random() < 0.25:
        p["presence_penalty"] = round(rng.uniform(-1.0, 1.5), 2)
    if rng.random() < 0.25:
        p["frequency_penalty"] = round(rng.uniform(-1.0, 1.5), 2)
    if rng.random() < 0.25:
        p["repetition_penalty"] = round(rng.uniform(0.8, 1.6), 2)
    if rng.random() < 0.15 and not config.draft_params:
        p["logit_bias"] = {str(t): round(rng.uniform(-5, 5), 1) for t in rng.sample(VOCAB, rng.randint(1, 5))}
    if rng.random() < 0.08:
        p["allowed_token_ids"] = sorted(rng.sample(VOCAB, rng.randint(5, 80)))
    if rng.random() < 0.1:
        p["bad_words"] = rng.sample(BAD_WORDS, rng.randint(1, 3))
    if rng.random() < 0.2:
        p["min_tokens"] = rng.randint(0, p["max_tokens"])
    if rng.random() < 0.3:
        p["stop_token_ids"] = rng.sample(STOP_IDS, rng.randint(1, len(STOP_IDS)))
    if rng.random() < 0.2:
        p["stop"] = rng.sample(STOP_STRINGS, rng.randint(1, 2))
        p["include_stop_str_in_output"] = rng.random() < 0.5
    if rng.random() < 0.35:
        p["logprobs"] = rng.choice([0, 1, 2, 5, 8])
    if rng.random() < 0.15:
        p["prompt_logprobs"] = rng.choice([0, 1, 3])
    if rng.random() < 0.1:
        p["n"] = rng.choice([2, 3])
    p["ignore_eos"] = rng.random() < 0.5
    if config.structured and rng.random() < 0.12:
        # Any option, greedy or sampled: windows hold structured requests on Model Runner V2,
        # each inner step masked by the worker's copy of the grammar.
        option = rng.choice(list(STRUCTURED_OPTIONS))
        p.update(structured_outputs=STRUCTURED_OPTIONS[option], max_tokens=rng.choice([8, 24, 40]))
        # Masks that may leave the grammar no token to take (min_tokens masks the EOS a finished
        # grammar wants): upstream then samples a token the grammar rejects and ends the request
        # with an error, which the structural check of unseeded requests cannot tell from ours.
        for key in ("allowed_token_ids", "bad_words", "min_tokens"):
            p.pop(key, None)
    return p


def random_batch(rng: random.Random, config: Config) -> dict:
    num_requests = rng.choice([1, 2, 3, 4, 6, 8, 12, 16])
    staggered = rng.random() < 0.5
    prefix = [rng.choice(VOCAB) for _ in range(rng.randint(130, 200))] if config.shared_prefix else []
    requests = []
    for i in range(num_requests):
        length = rng.choice([rng.randint(1, 8), rng.randint(9, 40), rng.randint(40, 120)])
        prompt = [rng.choice(VOCAB) for _ in range(length)]
        if prefix and rng.random() < 0.8:
            prompt = prefix + prompt[: rng.randint(1, 20)]
        requests.append(
            {
                "id": f"r{i}",
                "prompt": prompt,
                "params": random_params(rng, config),
                "arrive": rng.randint(0, 24) if staggered else 0,
                "abort": rng.randint(1, 10) if rng.random() < 0.08 else None,
            }
        )
    return {"requests": requests}


def batches_for(config: Config, seed: int, count: int) -> list[dict]:
    rng = random.Random(f"{seed}:{config.family}")
    return [random_batch(rng, config) for _ in range(count)]


def _regressions() -> dict[str, list[dict]]:
    """Batches that once took the engine down, by config: run before each config's random batches."""
    rng = random.Random(18)
    prompts = [[rng.choice(VOCAB) for _ in range(rng.randint(3, 30))] for _ in range(16)]
    # Issue 18, first crash: logprobs on the three shortest requests only; the
    # window's steps after they finished had no logprobs (_merge_logprobs).
    mixed_logprobs = {"requests": [
        {"id": f"r{i}", "prompt": prompts[i], "arrive": 0, "abort": None,
         "params": {"temperature": 0.0, "max_tokens": 5, "logprobs": 2} if i < 3
         else {"temperature": 0.0, "max_tokens": 16 + 3 * i, "ignore_eos": True}}
        for i in range(16)
    ]}  # fmt: skip
    # Issue 18, second crash: draft model, k = 3, N = 4, max_num_batched_tokens
    # 64, four requests: windows left out the draft model's slot per request.
    draft_budget = {"requests": [
        {"id": f"r{i}", "prompt": prompts[i], "arrive": 0, "abort": None,
         "params": {"temperature": 0.0, "max_tokens": 32, "ignore_eos": True}}
        for i in range(4)
    ]}  # fmt: skip
    # Found by the fuzzer (patch 0009), upstream's own with drafts: a random
    # request with top-k (uninitialized per-token top-k), and one whose last
    # step gets no drafts (top-k over no rows).
    # fuzz seed 1800, minimized to this one request
    found = [
        57, 112, 397, 471, 326, 115, 308, 355, 264, 253, 113, 156, 9, 469, 462, 261, 436, 298, 81, 417, 437,
        276, 218, 265, 95, 252, 363, 344, 95, 377, 377, 493, 455, 141, 468, 96, 201, 217, 167, 249, 263, 479,
    ]  # fmt: skip
    top_k = [
        {"requests": [{"id": "r0", "prompt": prompt, "arrive": 0, "abort": None,
                       "params": {"temperature": t, "top_k": k, "max_tokens": 3, "ignore_eos": True, **extra}}]}
        for prompt, t, k, extra in ((prompts[0], 0.87, 5, {}), (found, 0.9, 100, {"repetition_penalty": 0.99}))
    ]  # fmt: skip
    # Found by the fuzzer (patch 0010), upstream's own under async scheduling: a
    # min_tokens request runs alone (a placeholder per step, none replaced), then a
    # penalties request joins and its first step shrank the first one's output to
    # one token, so min_tokens kept masking its stop ids. Nearly every token is a
    # stop id here: the request must end right at min_tokens + 1 tokens (measured
    # without the patch: 40 to 48 tokens).
    stops_after_min = {"requests": [
        {"id": "r0", "prompt": prompts[3], "arrive": 0, "abort": None,
         "params": {"temperature": 0.0, "max_tokens": 48, "min_tokens": 30, "stop_token_ids": list(VOCAB)[8:]}},
        {"id": "r1", "prompt": prompts[4], "arrive": 1, "abort": None,
         "params": {"temperature": 0.0, "max_tokens": 5, "frequency_penalty": 1.0, "ignore_eos": True}},
    ]}  # fmt: skip
    return {
        "default-N8": [mixed_logprobs, stops_after_min],
        "default-N8-sync": [mixed_logprobs, stops_after_min],
        # the same shapes in single steps: where patch 0010's file is gone (vLLM 0.34.0), the
        # runner that replaced it must keep min_tokens right when a penalties request joins
        "default-N1": [mixed_logprobs, stops_after_min],
        "draft-N4-budget64": [draft_budget, *top_k],
    }


# Model Runner V2 (vLLM 0.34.0) holds at most 128 stop ids (EOS included) for a request with
# min_tokens; upstream's worker raises past that and the engine dies (an upstream bug this batch
# found on 0.34.0: docs/fuzzing.md). On that runner the slice's regressions stay under the cap.
MRV2_MAX_STOP_IDS_WITH_MIN_TOKENS = 128


def _capped_stops(batch: dict) -> dict:
    """``batch`` with each request's stop ids cut to MRV2's cap (one place left for EOS)."""

    def capped(request):
        params = dict(request["params"])
        params["stop_token_ids"] = params["stop_token_ids"][: MRV2_MAX_STOP_IDS_WITH_MIN_TOKENS - 1]
        return {**request, "params": params}

    return {**batch, "requests": [capped(r) if "stop_token_ids" in r["params"] else r for r in batch["requests"]]}


REGRESSIONS = _regressions()


def regressions(name: str) -> list[dict]:
    """A configuration's regression batches, as the release under test's runner takes them
    (Model Runner V2's cap on stop ids, above)."""
    from support.venvs import windows_runner

    found = REGRESSIONS.get(name, [])
    return found if windows_runner() == "v1" else [_capped_stops(batch) for batch in found]
