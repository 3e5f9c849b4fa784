"""Running batches on both builds: one engine start per build and configuration, the oracle's
results shared per family, a failing batch minimized."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from support.engines import generate

from overlay.fuzz import compare
from overlay.fuzz.compare import compare_batch
from overlay.fuzz.configs import Config, speculative_config


@dataclass
class Runner:
    """Runs batches on both builds; one engine start per build and config per call."""

    pythons: dict[str, Path]  # "upstream" / "overlay" -> venv python
    models: dict[str, Path]
    work: Path
    # Run the oracle twice on every new batch list; batches it disagrees with itself on do not count.
    repeat_oracle: bool = False
    oracle_cache: dict = field(default_factory=dict)
    kinds: dict = field(default_factory=dict)  # requests by how they were compared
    oracle_unstable: int = 0  # batches left out: upstream disagreed with itself
    # shared(build, config, batches): results from an engine started for other tests too, or None
    shared: Callable[[str, Config, list[dict]], dict | None] | None = None

    def run(self, build: str, config: Config, batches: list[dict], tag: str) -> dict:
        """{"batches": [...], "failure": None | {...}}: what ran, and how it ended."""
        if self.shared is not None and (out := self.shared(build, config, batches)) is not None:
            return out
        if build == "overlay":
            llm = config.overlay_llm(self.models)
        else:
            llm = config.oracle_llm(str(self.models[config.model]))
            if compare.ORACLE_DRAFTS and config.drafter:
                llm["speculative_config"] = speculative_config(config.drafter, llm["model"], self.models)
        spec = {"llm": llm, "batches": batches}
        timeout = 180 + 30 * len(batches)  # an engine start and generous batches; past it, a hang
        try:
            out, _log = generate(self.pythons[build], spec, self.work, f"{build}-{tag}", timeout=timeout)
            return out
        except AssertionError:  # crashed or hung: what it wrote before, and why
            out_file, log_file = (self.work / f"{build}-{tag}-{part}" for part in ("out.json", "log.txt"))
            out = json.loads(out_file.read_text()) if out_file.exists() else {"batches": [], "failure": None}
            out["failure"] = out.get("failure") or {"batch": len(out["batches"]), "error": "engine hung or died"}
            out["failure"]["root_cause"] = _root_cause(log_file.read_text() if log_file.exists() else "")
            return out

    def check(self, config: Config, batches: list[dict], tag: str) -> tuple[list[dict], int]:
        """Failures found in ``batches`` (each: index, problems) and how many batches were compared."""
        ours = self.run("overlay", config, batches, tag)
        theirs, unstable = self.oracle(config, batches, tag)
        failures = []
        if ours["failure"] is not None and (theirs["failure"] or {}).get("batch") != ours["failure"]["batch"]:
            failure = ours["failure"]
            problems = [f"overlay: {failure['root_cause']}", failure["error"][-2000:]]
            failures.append({"batch": failure["batch"], "problems": problems})
        compared = min(len(ours["batches"]), len(theirs["batches"]))
        for i in range(compared):
            if i in unstable:
                continue
            problems = compare_batch(config, batches[i], ours["batches"][i], theirs["batches"][i], self.kinds)
            if problems:
                failures.append({"batch": i, "problems": problems})
        if theirs["failure"] is not None:
            print(f"[fuzz] {config.name}: upstream failed on batch {theirs['failure']['batch']} "
                  f"(not counted): {theirs['failure']['root_cause']}", file=sys.stderr)  # fmt: skip
        return failures, compared - len(unstable)

    def oracle(self, config: Config, batches: list[dict], tag: str) -> tuple[dict, set[int]]:
        """Upstream's results (one run per family and batch list) and the batches it is no oracle for."""
        drafter = config.drafter if compare.ORACLE_DRAFTS else None
        key = json.dumps([config.model, config.oracle_llm(""), drafter, batches], sort_keys=True)
        if key not in self.oracle_cache:
            theirs = self.run("upstream", config, batches, tag)
            unstable: set[int] = set()
            if self.repeat_oracle:
                again = self.run("upstream", config, batches, tag + "-again")
                for i in range(min(len(theirs["batches"]), len(again["batches"]))):
                    if compare_batch(config, batches[i], again["batches"][i], theirs["batches"][i]):
                        unstable.add(i)
                self.oracle_unstable += len(unstable)
            self.oracle_cache[key] = theirs, unstable
        return self.oracle_cache[key]

    def minimize(self, config: Config, batch: dict, crashed: bool, tag: str, rounds: int = 6) -> dict:
        """A smaller batch that still fails: requests dropped, halves first, while it fails.

        Each round runs every reduction of the current batch in one engine start
        per build (the overlay alone when the batch crashed it) and keeps the
        first that still fails.
        """
        for r in range(rounds):
            requests = batch["requests"]
            sizes = sorted({max(1, len(requests) >> k) for k in range(1, len(requests).bit_length() + 1)}, reverse=True)
            candidates = [
                {"requests": requests[:start] + requests[start + size :]}
                for size in sizes
                for start in range(0, len(requests), size)
                if size < len(requests)
            ]
            if not candidates:
                break
            if crashed:
                failure = self.run("overlay", config, candidates, f"{tag}-min{r}")["failure"]
                if failure is None:
                    break
                batch = candidates[failure["batch"]]
                continue
            failures, _ = self.check(config, candidates, f"{tag}-min{r}")
            if not failures:
                break
            batch = candidates[failures[0]["batch"]]
        return batch


def _root_cause(log: str) -> str:
    """The first error an engine process logged (the driver only sees EngineDeadError)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "Error" in line and "EngineDeadError" not in line:
            return " | ".join(text.strip()[-300:] for text in lines[max(0, i - 2) : i + 1])
    return log[-500:]
