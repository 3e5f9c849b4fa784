"""The report: a fuzz run as a result file in benchmarks/results/'s schema (benchmarks/harness/
results.py), its failures beside the summary (tests/tool/test_bench_results.py reads them)."""

from __future__ import annotations

from overlay.fuzz.served import SERVED


def result_file(report: dict, arguments: dict, build: tuple[dict, dict], command: str) -> dict:
    """``report`` as a result file (benchmarks/harness/results.py), its failures beside the summary."""
    from harness import results

    runs = [{"config": name, **entry} for name, entry in report["configs"].items()]
    if "served" in report:
        served = report["served"]
        runs.append({"config": SERVED.name, "batches": served["batches"], "failures": len(served["failures"]),
                     "requests_compared": served["requests_compared"]})  # fmt: skip
    summary = {
        "batches": report["batches"] + report.get("served", {}).get("batches", 0),
        "requests": report["requests"],
        "configs": len(report["configs"]) + ("served" in report),
        "failures": len(report["failures"]),
        "complete": report["complete"],
        "minutes": report["minutes"],
        "requests_compared": report["requests_compared"],
        "oracle_unstable_batches": report["oracle_unstable_batches"],
    }
    data = results.make("fuzz", arguments=arguments, runs=runs, summary=summary, build=build, command=command)
    return data | {"failures": report["failures"]}
