"""The tool's own times: build (warm and cold), apply, check and export, with pytest-benchmark.

Installs requirements/bench.txt (pytest-benchmark, pinned) into the running Python if it is
missing, runs pytest on benchmarks/tool_timings/test_tool_timings.py (what each benchmark
does is in its docstring; nothing there writes the repository), saves the run with
pytest-benchmark's own storage under benchmarks/results/tool_timings/ (--benchmark-autosave,
one file per run, named by counter and commit), compares it there with the newest saved run
when there is one (--benchmark-compare, pytest-benchmark's table across commits), and writes
a result file (kind "tool-timings") with each benchmark's median, min, max and raw rounds.

  .tool-venv/bin/python benchmarks/bench.py build
  .tool-venv/bin/python benchmarks/bench.py build --min-rounds 2 --max-time 0.5
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import results
from harness.paths import BENCHMARKS, RESULTS, ROOT

HELP = "the tool's own times (build warm and cold, apply, check, export) with pytest-benchmark"
REQUIREMENTS = ROOT / "requirements" / "bench.txt"
TESTS = BENCHMARKS / "tool_timings" / "test_tool_timings.py"
STORAGE = RESULTS / "tool_timings"  # pytest-benchmark's saved runs: <machine>/<NNNN>_<commit>_<date>.json


def ensure_pytest_benchmark() -> None:
    if importlib.util.find_spec("pytest_benchmark") is None:
        print(f"installing {REQUIREMENTS.relative_to(ROOT)} into {sys.executable}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)


def saved_runs() -> list[Path]:
    """pytest-benchmark's saved runs of this kind of machine (what it compares with), oldest first."""
    from pytest_benchmark.utils import get_machine_id  # its folder name for this machine and Python

    return sorted((STORAGE / get_machine_id()).glob("*.json"), key=lambda p: p.name)


def summarize(runs: list[dict]) -> dict:
    """Seconds per benchmark: median, min and max of its rounds."""
    return {stat: {r["name"]: r["stats"][stat] for r in runs} for stat in ("median", "min", "max")} | {
        "rounds": {r["name"]: r["stats"]["rounds"] for r in runs}
    }


def add_arguments(ap) -> None:
    ap.add_argument("--min-rounds", type=int, default=5, help="pytest-benchmark --benchmark-min-rounds (5)")
    ap.add_argument("--max-time", type=float, default=1.0, help="pytest-benchmark --benchmark-max-time, s (1.0)")
    ap.add_argument("--no-compare", action="store_true", help="do not compare with the newest saved run")
    ap.add_argument("-k", dest="select", help="only the benchmarks pytest -k selects (e.g. 'warm or check')")
    results.add_json_argument(ap)


def main(args) -> int:
    ensure_pytest_benchmark()
    before = saved_runs()
    storage = STORAGE.relative_to(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "benchmarks.json"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS.relative_to(ROOT)),
               "--benchmark-autosave", f"--benchmark-storage={storage}", f"--benchmark-json={report}",
               f"--benchmark-min-rounds={args.min_rounds}", f"--benchmark-max-time={args.max_time}",
               "--benchmark-columns=median,min,max,rounds"]  # fmt: skip
        if before and not args.no_compare:
            cmd.append("--benchmark-compare")  # with the newest saved run
        if args.select:
            cmd += ["-k", args.select]
        print(f"comparing with {before[-1].relative_to(ROOT)}" if "--benchmark-compare" in cmd else
              "no saved run to compare with", flush=True)  # fmt: skip
        if (rc := subprocess.run(cmd, cwd=ROOT).returncode) != 0:
            return rc
        run = json.loads(report.read_text())
    saved = [p for p in saved_runs() if p not in before]
    runs = [
        {"name": b["name"], "fullname": b["fullname"], "stats": {k: v for k, v in b["stats"].items() if k != "data"},
         "rounds_s": b["stats"]["data"], "extra_info": b["extra_info"]}
        for b in run["benchmarks"]
    ]  # fmt: skip
    summary = summarize(runs) | {
        "pytest_benchmark": {
            "version": run["version"],
            "saved_run": str(saved[-1].relative_to(ROOT)) if saved else None,
            "compared_with": str(before[-1].relative_to(ROOT)) if "--benchmark-compare" in cmd else None,
            "commit": run["commit_info"].get("id"),
            "dirty": run["commit_info"].get("dirty"),
        }
    }
    built = next((r["extra_info"] for r in runs if "overlay" in r["extra_info"]), None)
    build = (built["overlay"], built["upstream"]) if built else results.UNKNOWN_BUILD
    notes = "Seconds per `python3 apply.py COMMAND -q`; " + (
        "overlay and upstream: the warm build's wheel's provenance." if built else "no build ran: overlay unknown."
    )
    data = results.make("tool-timings", arguments=results.arguments(args), runs=runs, summary=summary, build=build,
                        notes=notes)  # fmt: skip
    results.write(data, args.json)
    return 0
