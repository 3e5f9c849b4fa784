"""Comparison: what differs between the overlay's and the oracle's results for a batch, request by
request (exactly, structurally, as a prefix, or as a refusal)."""

from __future__ import annotations

from support.parity import LOGPROB_TOL, first_diff

from overlay.fuzz.configs import Config

# Upstream's speculative decoding applies these once per step to every draft
# position alike (e.g. min_tokens counted at the step's start), so with drafts
# they differ from single steps: measured, a greedy request with min_tokens 2
# sampled a rank-2 token where single steps sample EOS, on the overlay without
# windows as with them.
HISTORY_PER_STEP_WITH_DRAFTS = ("min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty",
                                "bad_words")  # fmt: skip

# Two modes the fuzzer's options turn on (command.py sets them before any batch runs; runner.py
# reads ORACLE_DRAFTS too).
# `fuzz --unseeded-exact`: compare unseeded random requests exactly too. Model Runner V2 (vLLM
# 0.34.0) samples by Gumbel noise keyed by (the request's seed, position) and gives an unseeded
# request a seed when the worker adds it, drawn from the worker's numpy generator: its tokens
# then hang on the order requests reach the worker, which aborts and arrival timing change.
# Measured 2026-12-03 (docs/fuzzing.md): unpatched 0.34.0 disagreed with itself in 7 of 106
# mixed batches, so it is no oracle for them there, and the default stays structural.
UNSEEDED_EXACT = False
# `fuzz --oracle-drafts`: the oracle runs the drafter configurations' drafter too (upstream
# without windows), and their requests are compared as without drafts: seeded random ones
# exactly. Model Runner V2 keys rejection sampling's draws by (seed, position), so a window that
# verified other drafts, or verified them at other positions, than single steps would differ
# even where greedy tokens cannot. Upstream agrees with itself there (measured 2026-12-04 on the
# interpreter base, docs/fuzzing.md); Model Runner V1's draft models on CPU do not.
ORACLE_DRAFTS = False


def compare_batch(config: Config, batch: dict, ours: dict, theirs: dict, kinds: dict | None = None) -> list[str]:
    """What differs between the overlay's and the oracle's results for one batch.

    ``kinds`` counts how each request was compared (exact, structural, prefix, rejected).
    """
    problems = []
    if theirs["kv_freed"] and not ours["kv_freed"]:
        problems.append("KV blocks still held after the batch (upstream's were all free)")
    batch_kinds = set()
    for request in batch["requests"]:
        rid = request["id"]
        kind, found = compare_request(config, request, ours["requests"][rid], theirs["requests"][rid])
        batch_kinds.add(kind)
        if kinds is not None:
            kinds[kind] = kinds.get(kind, 0) + 1
        problems += [f"{rid}: {problem}" for problem in found]
    # Where every token is the oracle's, so is the count (with drafts upstream
    # also counts accepted tokens past a stop string; see patch 0008).
    counted = (ours["generation_tokens"], theirs["generation_tokens"])
    if batch_kinds <= {"exact", "rejected"} and not config.drafter and counted[0] != counted[1]:
        problems.append(f"vllm:generation_tokens {counted[0]}, upstream {counted[1]}")
    return problems


def compare_request(config: Config, request: dict, ours: dict, theirs: dict) -> tuple[str, list[str]]:
    """How the request was compared, and what differs."""
    params = request["params"]
    if "rejected" in ours or "rejected" in theirs:
        same = ours.get("rejected") == theirs.get("rejected")
        found = [] if same else [f"submission: overlay {ours.get('rejected')!r}, upstream {theirs.get('rejected')!r}"]
        return "rejected", found
    random_draws = params.get("temperature", 1.0) > 0
    if config.drafter and not ORACLE_DRAFTS:  # the oracle has no drafts: exact for greedy requests
        # without per-step history
        exact = not random_draws and not any(params.get(k) for k in HISTORY_PER_STEP_WITH_DRAFTS)
    else:  # unseeded draws depend on the rest of the batch (or on the order of arrival)
        exact = not random_draws or "seed" in params or UNSEEDED_EXACT
    if ours["aborted"] or theirs["aborted"]:
        return "prefix", _prefix_problems(ours, theirs) if exact else []
    if not exact:
        return "structural", _structure_problems(params, ours)
    if _malformed_prompt_logprobs(request, theirs) and not _malformed_prompt_logprobs(request, ours):
        # Upstream's own defect (docs/fuzzing.md): every other part of the request is compared.
        return "exact, upstream's prompt logprobs malformed", _exact_problems(
            ours, theirs, compare_prompt_logprobs=False
        )
    return "exact", _exact_problems(ours, theirs)


def _malformed_prompt_logprobs(request: dict, result: dict) -> bool:
    """Prompt logprobs that are not one row per prompt token (vLLM's API: the first is None).
    Found 2026-12-04 in upstream 0.34.0 (Model Runner V2, EAGLE, async scheduling): a 1-token
    prompt that joined a running batch got 4 rows, run after run (cause not traced yet)."""
    rows = result.get("prompt_logprobs")
    return rows is not None and len(rows) != len(request["prompt"])


def _structure_problems(params: dict, ours: dict) -> list[str]:
    if not ours["finished"]:
        return ["not finished"]
    problems = []
    for i, out in enumerate(ours["outputs"]):
        n = len(out["token_ids"])
        if n > params["max_tokens"] or out["finish_reason"] not in ("stop", "length"):
            problems.append(f"completion {i}: {n} tokens, finish {out['finish_reason']!r}")
        elif out["finish_reason"] == "stop" and n < params.get("min_tokens", 0) and out["stop_reason"] is None:
            problems.append(f"completion {i}: stopped at {n} tokens before min_tokens")
    return problems


def _exact_problems(ours: dict, theirs: dict, compare_prompt_logprobs: bool = True) -> list[str]:
    if len(ours["outputs"]) != len(theirs["outputs"]):
        return [f"{len(ours['outputs'])} completions, upstream {len(theirs['outputs'])}"]
    problems = []
    if compare_prompt_logprobs:
        problems = _logprob_problems("prompt logprobs", ours["prompt_logprobs"], theirs["prompt_logprobs"])
    for i, (a, b) in enumerate(zip(ours["outputs"], theirs["outputs"], strict=True)):
        if a["token_ids"] != b["token_ids"]:
            problems.append(f"completion {i}: {first_diff(a['token_ids'], b['token_ids'])}")
            continue
        for key in ("text", "finish_reason", "stop_reason"):
            if a[key] != b[key]:
                problems.append(f"completion {i}: {key} overlay {a[key]!r}, upstream {b[key]!r}")
        # Served rows name tokens by text: the sampled ones by theirs (the same token ids here).
        sampled = a.get("sampled_texts") or a["token_ids"]
        problems += _logprob_problems(f"completion {i} logprobs", a["logprobs"], b["logprobs"], sampled)
    return problems


def _logprob_problems(what: str, a: list | None, b: list | None, sampled: list[int] | None = None) -> list[str]:
    """Per position: the same values (within LOGPROB_TOL), and the same token ids and
    ranks for every value that is not tied: which of several tokens with one value a
    row lists, and in which order, is arbitrary (e.g. tokens a grammar masks to -inf).
    The row's last rank may also tie with a token the row leaves out (found by the long
    run of 2026-12-02: Qwen3, structured output, rank 2 of 2 was token 205 in one build
    and 202 in the other, both -3.0856964588165283), so its id is not compared there;
    its value is, and the sampled token's id is compared in the token ids. ``sampled``: the
    token sampled at each position (both builds'), where the rows are a completion's, named
    as the rows name tokens (an id; through the server, its text)."""
    if (a is None) != (b is None) or len(a or []) != len(b or []):
        return [f"{what}: {None if a is None else len(a)} rows, upstream {None if b is None else len(b)}"]
    for pos, (ra, rb) in enumerate(zip(a or [], b or [], strict=True)):
        token = sampled[pos] if sampled is not None and pos < len(sampled) else None
        if token is not None:
            ra, rb = _without_ties_at_the_sampled_value(ra, rb, token)
        if (ra is None) != (rb is None) or len(ra or []) != len(rb or []):
            return [f"{what}: position {pos} has {ra} entries, upstream {rb}"]
        values_a, values_b = sorted(v for _, v, _ in ra or []), sorted(v for _, v, _ in rb or [])
        if any(not (x == y or abs(x - y) <= LOGPROB_TOL) for x, y in zip(values_a, values_b, strict=True)):
            return [f"{what}: position {pos} logprobs {values_a} vs {values_b}"]
        if _untied(ra, token) != _untied(rb, token):
            return [f"{what}: position {pos} ids/ranks {_untied(ra, token)}, upstream {_untied(rb, token)}"]
    return []


def _without_ties_at_the_sampled_value(ra: list | None, rb: list | None, token: int) -> tuple[list | None, list | None]:
    """Both rows without the entries whose logprob is exactly the sampled token's, and without
    the sampled token's rank, where either row has such an entry.

    Found by the long run of 2026-12-03 (0.34.0, preemption, N = 8 and N = 4 async off;
    deterministic on replay): with logprobs=1 the sampled token 202 was rank 1 and alone in one
    build's row, rank 3 beside token 201 (rank 1) in the other's, both at -1.1378294229507446 in
    both builds. Raw logits a few ulps apart (the preempted request's KV recomputed at another
    step, in another batch) round to one logprob and still order the tied tokens, so which of
    them is top-1, whether the sampled token is listed apart from the top-k, and its rank are
    arbitrary there. The sampled token's value and every entry at another value are still
    compared (its id is compared in the token ids). Through the server a row names tokens by
    text and has no ranks (found by the run of 2026-12-06, JSON schema and logprobs=1: upstream
    listed the sampled "\n" alone, the overlay "\t" beside it, both at -1.2601168155670166, the
    tiny model's zero output rows); ``token`` is then the sampled token's text."""
    mine = [next((e for e in row or [] if e[0] == token), None) for row in (ra, rb)]
    if None in mine or mine[0][1] != mine[1][1]:
        return ra, rb
    value = mine[0][1]
    if not any(e[1] == value and e[0] != token for e in (ra or []) + (rb or [])):
        return ra, rb
    return tuple(sorted([[token, value, None], *(e for e in row if e[1] != value)]) for row in (ra, rb))


def _untied(row: list | None, sampled=None) -> list[tuple[int, int]]:
    """(token id, rank) of the entries whose value is unique, -inf aside (a vocab of ties), and
    that are not the row's last top-k entry (a tie with a token outside the row). ``sampled``:
    the position's sampled token, as the row names it (None: not known)."""
    row = row or []
    values = [v for _, v, _ in row]
    return [(t, r) for t, v, r in row
            if values.count(v) == 1 and v != float("-inf") and not _is_last(row, v, r, sampled)]  # fmt: skip


def _is_last(row: list, value: float, rank: int | None, sampled=None) -> bool:
    """The row's last top-k entry: its largest rank within the row's length, or, where the row
    has no ranks (through the server), its lowest value, or the lowest of the entries other than
    the sampled token's, which the row lists apart from the top-k when it ranks lower (found by
    the served run of 2026-12-06, JSON schema, logprobs=1: top-1 was "\\n" in the overlay's row and
    "\\t" in upstream's, tied, above the sampled token)."""
    ranks = [r for _, _, r in row if r is not None]
    if rank is not None:
        return rank == max((r for r in ranks if r <= len(row)), default=0)
    if ranks:
        return False
    others = [v for t, v, _ in row if t != sampled]
    return value == min(v for _, v, _ in row) or value == min(others, default=None)


def _prefix_problems(ours: dict, theirs: dict) -> list[str]:
    for i, (a, b) in enumerate(zip(ours["outputs"], theirs["outputs"], strict=False)):
        short, long_ = sorted((a["token_ids"], b["token_ids"]), key=len)
        if long_[: len(short)] != short:
            return [f"aborted completion {i}: tokens are not a prefix of the other build's"]
    return []
