"""The text of logprobs' token ids in the frontend: upstream's `convert_ids_list_to_tokens` (each id
decoded at every position) against patch 0019's (each id decoded once per tokenizer), one after the
other in one process, on the benchmark model's tokenizer through the API server's pooled tokenizer.

Run with the 0.34.0 overlay venv's python (it imports the patched vLLM; upstream's function is
still there as `_convert_ids_list_to_tokens`, so both sides run the same build):

  build/venvs/overlay-0.34.0/bin/python benchmarks/logprob_texts.py \\
      --json benchmarks/results/logprob_texts_2026-12-06.json

Each position is the sampled token and its top --top ids, drawn from a Zipf law over the
vocabulary (a server's logprobs meet the same ids again and again); --positions positions, each
side's median per position over --reps passes after one warm-up pass (the cached side's warm-up
decodes the ids it meets first). The result is kind "session" (an in-process comparison, not an
engine benchmark). What it does not say: how much of a served request's time that is
(docs/benchmarks.md puts it beside the served runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import results  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from vllm.tokenizers.detokenizer_utils import (  # noqa: E402
    _convert_ids_list_to_tokens,
    convert_ids_list_to_tokens,
)
from vllm.tokenizers.hf import maybe_make_thread_pool  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def positions_of(vocab: int, count: int, top: int, seed: int) -> list[list[int]]:
    """`count` positions of 1 + `top` ids each, Zipf-distributed over the vocabulary."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(vocab)  # which ids are frequent: not the low ones
    ranks = np.minimum(rng.zipf(1.2, size=(count, 1 + top)) - 1, vocab - 1)
    return order[ranks].tolist()


def per_position_us(convert, tokenizer, positions: list[list[int]], reps: int) -> float:
    for ids in positions:  # warm-up
        convert(tokenizer, ids)
    passes = []
    for _ in range(reps):
        start = time.perf_counter()
        for ids in positions:
            convert(tokenizer, ids)
        passes.append((time.perf_counter() - start) / len(positions))
    return statistics.median(passes) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--model", default=str(ROOT / "build" / "models" / "bench-tiny"),
                    help="a local model folder whose tokenizer to use (the benchmark model's)")  # fmt: skip
    ap.add_argument("--positions", type=int, default=2000)
    ap.add_argument("--top", type=int, default=5, help="the serve-mix logprobs requests' top_logprobs")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    results.add_json_argument(ap)
    args = ap.parse_args()
    # The API server's tokenizer: vLLM wraps the fast tokenizer in its thread-safe pool.
    tokenizer = maybe_make_thread_pool(AutoTokenizer.from_pretrained(args.model))
    positions = positions_of(len(tokenizer), args.positions, args.top, args.seed)
    distinct = len({token_id for ids in positions for token_id in ids})
    upstream = per_position_us(_convert_ids_list_to_tokens, tokenizer, positions, args.reps)
    cached = per_position_us(convert_ids_list_to_tokens, tokenizer, positions, args.reps)
    run = {"vocab": len(tokenizer), "positions": args.positions, "ids_per_position": 1 + args.top,
           "distinct_ids": distinct, "upstream_us_per_position": upstream,
           "cached_us_per_position": cached, "ratio": cached / upstream}  # fmt: skip
    print(f"vocab {run['vocab']}, {distinct} distinct ids: {upstream:.1f} us a position decoding "
          f"every id, {cached:.2f} us decoding each once ({run['ratio']:.3f}x)")  # fmt: skip
    data = results.make("session", arguments=results.arguments(args), runs=[run],
                        summary={"ratio": run["ratio"], "upstream_us_per_position": upstream,
                                 "cached_us_per_position": cached},
                        python=Path(sys.executable))  # fmt: skip
    results.write(data, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
