"""The run loop: rounds of batches over the chosen configurations until the deadline, each
failure minimized and recorded."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from overlay.fuzz.batches import batches_for, regressions
from overlay.fuzz.configs import CONFIGS
from overlay.fuzz.runner import Runner


def fuzz(runner: Runner, names: list[str], seed: int, per_config: int, deadline: float | None,
         minimize: bool = True, progress: Callable[[dict], None] | None = None) -> dict:  # fmt: skip
    """Rounds of ``per_config`` batches over ``names`` until ``deadline`` (one round if None).

    ``progress(report)`` is called after each configuration, so an interrupted
    run still leaves what it found.
    """
    report: dict = {"seed": seed, "batches": 0, "requests": 0, "configs": {}, "failures": [], "complete": False}
    round_ = 0
    while True:
        for name in names:
            config = CONFIGS[name]
            first = regressions(name) if round_ == 0 else []
            batches = first + batches_for(config, seed + round_, per_config)
            failures, compared = runner.check(config, batches, f"{name}-s{seed + round_}")
            entry = report["configs"].setdefault(name, {"batches": 0, "requests": 0, "failures": 0})
            entry["batches"] += compared
            entry["requests"] += sum(len(b["requests"]) for b in batches[:compared])
            report["batches"] += compared
            report["requests"] += sum(len(b["requests"]) for b in batches[:compared])
            for failure in failures:
                entry["failures"] += 1
                batch = batches[failure["batch"]]
                crashed = failure["problems"][0].startswith("overlay: ")
                small = runner.minimize(config, batch, crashed, f"{name}-s{seed + round_}") if minimize else batch
                record = {"config": name, "seed": seed + round_, "batch": failure["batch"],
                          "problems": failure["problems"], "minimized": small}  # fmt: skip
                report["failures"].append(record)
                print("[fuzz] FAILURE " + json.dumps(record), file=sys.stderr)
            if progress is not None:
                progress(report)
        round_ += 1
        if deadline is None or time.monotonic() > deadline:
            report["complete"] = True
            return report
