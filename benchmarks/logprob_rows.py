"""Sample logprobs of a decode step on vLLM 0.34.0's standalone CPU sampler: every row scored
(upstream's `compute_topk_scores`) against only the rows that ask (patch 0018's
`compute_topk_scores_of_rows`), one after the other in one process, at several vocabulary sizes.

Run with the 0.34.0 overlay venv's python (it imports the patched vLLM; upstream's function is
still there, unchanged, so both sides run the same build):

  OVERLAY_TEST_UPSTREAM=0.34.0 build/venvs/overlay-0.34.0/bin/python benchmarks/logprob_rows.py \\
      --json benchmarks/results/logprob_rows_2026-12-06.json

Random logits, a batch of --batch rows, one in --every asking for --top logprobs (the serve-mix
production mix's share and width). Each side's median over --reps calls after a warm-up; the
result is kind "session" (an in-process comparison, not an engine benchmark). What it does not
say: how much of a served step that is (the step's forward and the rest of the engine are not
here; docs/benchmarks.md puts it next to the served runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import results  # noqa: E402
from vllm.v1.worker.cpu.logprob import compute_topk_scores  # noqa: E402
from vllm.v1.worker.cpu.requested_logprobs import compute_topk_scores_of_rows  # noqa: E402


def median_ms(call, reps: int) -> float:
    for _ in range(5):  # warm-up, torch.compile included
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(vocab: int, batch: int, every: int, top: int, reps: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, vocab, generator=generator)
    sampled = torch.randint(0, vocab, (batch,), generator=generator)
    mapping = torch.arange(batch)
    rows = np.arange(0, batch, every)
    whole = median_ms(lambda: compute_topk_scores(logits, top, sampled, expanded_idx_mapping=mapping), reps)
    asking = median_ms(
        lambda: compute_topk_scores_of_rows(rows, logits, top, sampled, expanded_idx_mapping=mapping), reps
    )
    return {"vocab": vocab, "batch": batch, "asking": len(rows), "top": top,
            "every_row_ms": whole, "asking_rows_ms": asking, "ratio": asking / whole}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[512, 32000, 128256])
    ap.add_argument("--batch", type=int, default=160)
    ap.add_argument("--every", type=int, default=10, help="one row in this many asks")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--reps", type=int, default=200)
    results.add_json_argument(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the CPU worker's share of a 2-core host; steadier than both cores
    runs = [measure(v, args.batch, args.every, args.top, args.reps) for v in args.vocab]
    for run in runs:
        print(f"vocab {run['vocab']:>6}: every row {run['every_row_ms']:.3f} ms, "
              f"the {run['asking']} asking {run['asking_rows_ms']:.3f} ms ({run['ratio']:.2f}x)")  # fmt: skip
    summary = {str(r["vocab"]): {"ratio": r["ratio"], "every_row_ms": r["every_row_ms"],
                                 "asking_rows_ms": r["asking_rows_ms"]} for r in runs}  # fmt: skip
    data = results.make("session", arguments=results.arguments(args), runs=runs, summary=summary,
                        python=Path(sys.executable))  # fmt: skip
    results.write(data, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
