"""The fuzzer's command line: `apply.py fuzz [--upstream VERSION] [options]`.

Two sides. ``cmd_fuzz`` runs in the tool's process: it starts ``python -m overlay.fuzz`` with the
rest of the arguments, in a process of its own as `apply.py test` starts pytest, so the fuzzer's
exit code and output are its own and the release it tests is chosen the way the suite's is (the
TEST_RELEASE_ENV variable tests/support/venvs.py reads). ``main`` is that process: the fuzzer's
options, then rounds of batches until the deadline, the JSON report rewritten after each
configuration, so an interrupted run still leaves what it found.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from overlay import ROOT
from overlay.fuzz import compare
from overlay.fuzz.ci_slice import ci_configs
from overlay.fuzz.configs import CONFIGS
from overlay.fuzz.report import result_file
from overlay.fuzz.rounds import fuzz
from overlay.fuzz.runner import Runner
from overlay.fuzz.served import fuzz_served
from overlay.testrun import TEST_RELEASE_ENV


def cmd_fuzz(args: argparse.Namespace) -> int:
    """`python -m overlay.fuzz` with the rest of the arguments; --upstream picks the release its venvs hold."""
    from overlay import releases

    env = dict(os.environ)
    if args.upstream is not None:
        env[TEST_RELEASE_ENV] = releases.select(ROOT, args.upstream).version
    cmd = [sys.executable, "-m", "overlay.fuzz", *args.passed_on]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="apply.py fuzz", description="Differential fuzzing of the overlay against upstream vLLM."
    )
    ap.add_argument("--minutes", type=float, default=10, help="run rounds until this much time has passed")
    ap.add_argument("--seed", type=int, default=0, help="first round's seed (each round adds one)")
    ap.add_argument("--per-config", type=int, default=20, help="batches per configuration per round")
    ap.add_argument("--configs", default="all", help="comma-separated names, 'ci', or 'all': " + ", ".join(CONFIGS))
    ap.add_argument("--report", type=Path, help="write the JSON report here")
    ap.add_argument("--served", type=int, default=0, help="also this many batches through `vllm serve` (N = 8)")
    ap.add_argument(
        "--repeat-oracle",
        action="store_true",
        help="run upstream twice per batch list; batches it disagrees with itself on do not count",
    )
    ap.add_argument(
        "--unseeded-exact",
        action="store_true",
        help="compare unseeded random requests exactly too (Model Runner V2 keys their draws by a seed "
        "drawn when each is added; with --repeat-oracle, see where upstream agrees with itself)",
    )
    ap.add_argument(
        "--oracle-drafts",
        action="store_true",
        help="run the drafter configurations' oracle with the same drafter (no windows) and compare "
        "their seeded random requests exactly too (Model Runner V2, where upstream agrees with itself)",
    )
    ap.add_argument(
        "--base",
        choices=("interpreter",),
        help="run both builds on this CPU base instead of the release's default one: 'interpreter' "
        "runs Model Runner V2's GPU code under Triton's interpreter (vLLM 0.34.0 on: its drafters, "
        "which the standalone CPU runner lacks; about 100-300 ms a step)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    compare.UNSEEDED_EXACT = args.unseeded_exact
    compare.ORACLE_DRAFTS = args.oracle_drafts
    names = {"all": list(CONFIGS), "ci": ci_configs()}.get(args.configs) or args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")

    from support.venvs import draft_models, test_builds

    pythons, models = test_builds(args.base)
    if any(CONFIGS[n].drafter in ("eagle", "mtp") for n in names):
        models |= draft_models(pythons["upstream"], models["llama"])
    work = ROOT / "build" / "fuzz"
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    runner = Runner(pythons, models, work, repeat_oracle=args.repeat_oracle)
    from harness import results  # the schema of every file in benchmarks/results/

    build = results.provenance(pythons["overlay"])
    command = "python3 apply.py fuzz " + shlex.join(sys.argv[1:] if argv is None else argv)

    def write(report: dict) -> None:
        report.update(requests_compared=runner.kinds, oracle_unstable_batches=runner.oracle_unstable,
                      minutes=round((time.monotonic() - start) / 60, 1))  # fmt: skip
        if args.report:
            results.write(result_file(report, results.arguments(args), build, command), args.report)

    report = fuzz(runner, names, args.seed, args.per_config, start + args.minutes * 60, progress=write)
    if args.served:
        report["served"] = fuzz_served(pythons, models["llama"], work, args.seed, args.served)
        report["failures"] += report["served"]["failures"]
    write(report)
    summary = f"{report['batches']} batches, {report['requests']} requests, {len(report['configs'])} configs, " \
              f"{len(report['failures'])} failures"  # fmt: skip
    print(summary)
    return 1 if report["failures"] else 0
