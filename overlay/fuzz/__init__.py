"""Differential fuzzing of the overlay against the upstream wheel.

Seeded random batches, each run on unpatched upstream vLLM (the oracle) and on
the overlay, compared request by request. A batch mixes per-request
SamplingParams drawn from the whole surface (greedy, seeded and unseeded
random with temperature / top-p / top-k / min-p, the three penalties,
logit_bias, allowed_token_ids, bad_words, min_tokens, stop ids, stop strings
with and without include_stop_str_in_output, logprobs of several widths,
prompt_logprobs, n > 1, max_tokens 1 to past a window, ignore_eos, structured
output), prompt lengths, arrivals (all at once or staggered over engine steps)
and aborts. One engine per configuration runs all of its batches
(tests/support/engine_batches.py); the overlay configurations cover multi-step N from 1 to
16, async scheduling on and off, small max_num_seqs and
max_num_batched_tokens (chunked prefill), a KV cache small enough to preempt,
prefix caching with shared prefixes, a max_model_len cap, and speculative
decoding with ngram, a draft model, an EAGLE head and an MTP layer.

What is compared (compare.py's `compare_request`): a request both builds ran to the end
must match in token ids, text, finish and stop reasons, and logprobs (ids and
ranks exactly, values within LOGPROB_TOL), prompt logprobs included. Where the
oracle cannot be exact it is not used: unseeded random requests (their draws
depend on the batch) and random requests of a speculative configuration (draft
model, ngram, EAGLE or MTP; its oracle is upstream without drafts, exact for greedy only:
upstream's own draft-model runs disagree run to run on CPU, and its ngram runs
die on its top-k bug) get structural checks only
(finished, within max_tokens and min_tokens); an aborted request's tokens must
be a prefix of the other build's. A request rejected at submission must be
rejected by both. Any crash, a hang, or KV blocks still held after a batch is
a failure. A failing batch is minimized (requests dropped while it still
fails) and printed with its seed.

Usage (from the repository root, through apply.py):
  python3 apply.py fuzz --minutes 60 --report benchmarks/results/fuzz_long.json

The package, by job:
  configs   the engine configurations (CONFIGS) and their oracles
  batches   batch generation: seeded random mixed batches, and the regression batches
  compare   what differs between the two builds' results, request by request
  runner    one engine start per build and configuration for a list of batches; minimizing
  rounds    the run loop: rounds over the configurations until the deadline
  served    the same batches through `vllm serve`
  ci_slice  the fixed-seed slice the test run fuzzes, on the parity runs' engines
  report    the run as a result file (benchmarks/harness/results.py's schema)
  command   `apply.py fuzz` (the tool's side) and `python -m overlay.fuzz` (the fuzzer's options)

The fuzzer drives engines through the test support modules (tests/support: the venvs, the
engine runner, the parity cases) and writes its report with the benchmarks' harness: importing
this package puts tests/ and benchmarks/ on sys.path, the one place that does. The names below
are what the test suite uses (tests/real/test_fuzz.py, test_multi_step_serve.py).
"""

import sys

from overlay import ROOT

for _path in (str(ROOT / "tests"), str(ROOT / "benchmarks")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from overlay.fuzz.batches import REGRESSIONS, batches_for  # noqa: E402
from overlay.fuzz.ci_slice import (  # noqa: E402
    CI_PER_CONFIG,
    CI_SEED,
    ci_configs,
    parity_key,
    slice_batches,
    slice_results,
)
from overlay.fuzz.compare import compare_batch, compare_request  # noqa: E402
from overlay.fuzz.configs import CONFIGS, Config, speculative_config  # noqa: E402
from overlay.fuzz.rounds import fuzz  # noqa: E402
from overlay.fuzz.runner import Runner  # noqa: E402
from overlay.fuzz.served import served_batches  # noqa: E402

__all__ = [
    "CI_PER_CONFIG", "CI_SEED", "CONFIGS", "REGRESSIONS", "Config", "Runner", "batches_for", "ci_configs",
    "compare_batch", "compare_request", "fuzz", "parity_key", "served_batches", "slice_batches", "slice_results",
    "speculative_config",
]  # fmt: skip
