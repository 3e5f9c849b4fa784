"""Send one mix of requests to an OpenAI-compatible server and time each one.

Runs under a vLLM venv's python (it needs the `aiohttp` vLLM brings), started by
benchmarks/harness/serve_mix.py. `vllm bench serve` sends one set of sampling parameters to
every request; a server's traffic mixes them, so this client draws each request's kind:

  plain       sampled (temperature 0.8, seeded), 48-192 output tokens, EOS ignored
  production  70% as plain, 10% with the top-5 logprobs of each token, 10% JSON schema
              (structured outputs: it ends at the schema's end), 10% with stop strings
  long        as plain, with 512-1536-token prompts (retrieval, chat histories): prompts that
              need several chunks of the token budget
  production-lengths
              production's requests (same prompts and seeds) sent as plain ones, each asking for
              the output length its production twin got (--lengths: the token counts of a
              production run with the same seed, which every build gives alike): production's
              lengths without its logprobs, grammars and stop strings. Production's JSON and
              stop-string requests end early, so it has fewer tokens to decode than plain; this
              mix tells what production's work costs a build from what its lengths do.

Prompts are random token ids of the tiny models' vocabulary; arrivals are Poisson at --rate
requests/s ("inf": all at once). Per request: time to first token, time per output token after
it (its stream's last token minus its first, over the tokens between), output tokens, error.

The client shares the host's cores with the server, so it reads the stream as `vllm bench serve`
does: aiohttp and one `json.loads` per event. The `openai` client, which builds typed objects of
every event, took 1.6 CPU-seconds of a 2-second run on a 2-core host (0.4 s this way).

Usage: python traffic_client.py --base-url URL --model NAME --mix production --rate 32 \
           --num-prompts 160 --seed 0 --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.parity import SCHEMA  # noqa: E402  (the schema the parity tests use)

VOCAB = range(4, 512)
LENGTHS_MIX = "production-lengths"
MIXES = {
    "plain": [("sampled", 1.0)],
    "production": [("sampled", 0.7), ("logprobs", 0.1), ("json", 0.1), ("stop", 0.1)],
    "long": [("sampled", 1.0)],
    LENGTHS_MIX: [],  # production's own draw (requests_of)
    "logprobs10": [("sampled", 0.9), ("logprobs", 0.1)],
    "json10": [("sampled", 0.9), ("json", 0.1)],
    "stop10": [("sampled", 0.9), ("stop", 0.1)],
}


def requests_of(mix: str, num_prompts: int, seed: int, lengths: list[int] | None = None) -> list[dict]:
    """Each request's kind, prompt and parameters (the same for every server given the seed;
    production-lengths: given the output ``lengths`` of production's requests too)."""
    if mix == LENGTHS_MIX:
        return _as_plain(requests_of("production", num_prompts, seed), lengths)
    rng = random.Random(f"{seed}:{mix}")
    kinds, weights = zip(*MIXES[mix], strict=True)
    out = []
    for i in range(num_prompts):
        kind = rng.choices(kinds, weights)[0]
        length = rng.randint(512, 1536) if mix == "long" else rng.randint(16, 64)
        params: dict = {"max_tokens": rng.randint(48, 192), "temperature": 0.8, "seed": i}
        body: dict = {"ignore_eos": True}
        if kind == "logprobs":
            params["logprobs"] = 5
        elif kind == "json":
            body = {"structured_outputs": {"json": SCHEMA}}
        elif kind == "stop":
            params["stop"] = ["e ", "an"]
            body = {}
        out.append({"kind": kind, "prompt": [rng.choice(VOCAB) for _ in range(length)], "params": params,
                    "body": body})  # fmt: skip
    return out


def _as_plain(production: list[dict], lengths: list[int] | None) -> list[dict]:
    """``production``'s requests as plain ones, each with its twin's output length."""
    if lengths is None or len(lengths) != len(production):
        raise SystemExit(f"{LENGTHS_MIX} needs --lengths: one output length per production request")
    return [
        {**request, "kind": "plain-as-" + request["kind"], "body": {"ignore_eos": True},
         "params": {"max_tokens": max(length, 1), "temperature": 0.8, "seed": request["params"]["seed"]}}
        for request, length in zip(production, lengths, strict=True)
    ]  # fmt: skip


async def one(session, url: str, model: str, request: dict, delay: float) -> dict:
    await asyncio.sleep(delay)
    payload = {"model": model, "prompt": request["prompt"], "stream": True,
               "stream_options": {"include_usage": True}, **request["params"], **request["body"]}  # fmt: skip
    start = time.perf_counter()
    first = last = None
    tokens = 0
    try:
        async with session.post(url, json=payload) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    raise RuntimeError(chunk["error"])
                choices = chunk.get("choices")
                if choices and choices[0].get("text"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except Exception as e:  # the error is the measurement
        return {"kind": request["kind"], "error": f"{type(e).__name__}: {e}"[:300]}
    ttft = (first - start) if first else None
    tpot = (last - first) / (tokens - 1) if first and tokens > 1 else None
    return {"kind": request["kind"], "ttft": ttft, "tpot": tpot, "tokens": tokens, "error": None}


async def run(args) -> dict:
    import aiohttp

    url = args.base_url + "/v1/completions"
    lengths = json.loads(Path(args.lengths).read_text()) if args.lengths else None
    requests = requests_of(args.mix, args.num_prompts, args.seed, lengths)
    rng = random.Random(args.seed)
    delays, t = [], 0.0
    for _ in requests:
        delays.append(t)
        if args.rate != "inf":
            t += rng.expovariate(float(args.rate))
    # No connection limit: all at once means every request open together.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(one(session, url, args.model, r, d) for r, d in zip(requests, delays, strict=True))
        )
        duration = time.perf_counter() - start
    return {"mix": args.mix, "rate": args.rate, "duration": duration, "requests": results,
            "summary": summarize(results, duration)}  # fmt: skip


def summarize(results: list[dict], duration: float) -> dict:
    ok = [r for r in results if r["error"] is None]
    ttfts = sorted(r["ttft"] for r in ok if r["ttft"] is not None)
    tpots = [r["tpot"] for r in ok if r["tpot"] is not None]
    return {
        "output_throughput": sum(r["tokens"] for r in ok) / duration,
        "median_ttft_ms": 1000 * statistics.median(ttfts) if ttfts else float("nan"),
        "p90_ttft_ms": 1000 * ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else float("nan"),
        "median_tpot_ms": 1000 * statistics.median(tpots) if tpots else float("nan"),
        "errors": len(results) - len(ok),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mix", choices=MIXES, required=True)
    ap.add_argument("--rate", default="inf")
    ap.add_argument("--num-prompts", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", help=f"{LENGTHS_MIX}: a JSON list, each production request's output tokens")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(json.dumps(out["summary"]))


if __name__ == "__main__":
    main()
