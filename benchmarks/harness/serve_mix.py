"""Served traffic mixes: upstream, overlay N = 1 and overlay N = 8, one server at a time.

Each arm's server (upstream: the unpatched build; N = 1: the overlay's defaults; N = 8: with
--num-scheduler-steps 8) runs every mix at every rate, then stops before the next starts (an
idle vLLM server's worker still takes CPU). The requests come from benchmarks/traffic_client.py
(`vllm bench serve` gives every request the same parameters; a server's traffic mixes them):
plain, production (70% sampled, 10% logprobs, 10% JSON schema, 10% stop strings) and long
prompts, Poisson arrivals at each --rates value ("inf": all at once). Every run a server sees
has prompts of its own (the client's seed is the run's place in the server's sequence, the same
for every arm): a prompt sent twice to one server comes from its prefix cache, as the long
prompts of every run but a server's first did before 2026-12-07 (docs/benchmarks.md). Arms
alternate order each round; the report gives each arm's medians over rounds, per mix and rate,
and the ratios N = 8 / upstream, N = 1 / upstream and N = 8 / N = 1 (machines here are noisy:
ratios travel, absolute numbers do not), with the N = 8 server's share of tokens made in windows
(/metrics).

--repeats K sends every mix K times to each server, one block of all mixes after another, the
mixes' order alternating, so that each run of a mix has a run of the first mix (plain by default)
in the same block on the same server, seconds apart. The summary's "paired" then gives, per arm,
mix and rate, the first mix's duration over the mix's in each block (median and quartiles): how
much longer the mix takes than plain traffic on the same server, which this host's drift between
server starts (2x over minutes) does not blur as it blurs ratios of medians taken across servers.

--mixes production-lengths sends production's requests as plain ones, each asking for the
output length its production twin got (the seed's first production run gives them; the
harness runs one first, unrecorded, where none has run). Production's JSON and stop-string
requests end early, so production decodes fewer tokens than plain, which alone moves a build's
tokens/s: this mix's N = 8 / N = 1 beside production's tells what production's work (logprobs,
grammars, stop strings) costs windows apart from its lengths.

Each run also records the cores each of the server's processes used while its requests ran
(harness/cpu_use.py; "rest" is mostly the client): on a 2-core host the runs all at once are a
contest for the cores between the worker, the engine core, the API server and the client.

  .tool-venv/bin/python benchmarks/bench.py --upstream 0.34.0 serve-mix --rounds 2 \
      --mixes production --rates 32 inf
  .tool-venv/bin/python benchmarks/bench.py --upstream 0.34.0 serve-mix --rounds 2 --repeats 8 \
      --arms N1 N8 --mixes plain production --rates inf
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from support.engines import Server, run_env
from traffic_client import LENGTHS_MIX

from harness import builds, results
from harness.cpu_use import CpuMonitor
from harness.paths import BENCHMARKS
from harness.serve import server_command

HELP = "served traffic mixes (plain, production, long prompts) at several rates: upstream, overlay N = 1 and N = 8"
ARMS = {"upstream": None, "N1": [], "N8": ["--num-scheduler-steps", "8"]}
# Not run by default: N = 8 with the other multi_step_join policies (docs/benchmarks.md)
ARMS |= {f"N8-join-{mode}": [*ARMS["N8"], "--additional-config", json.dumps({"multi_step_join": value})]
         for mode, value in (("always", "always"), ("off", False))}  # fmt: skip
# ... and N = 1 and N = 8 without async scheduling (its one step of pipelining before a prompt)
ARMS |= {f"{arm}-sync": [*ARMS[arm], "--no-async-scheduling"] for arm in ("N1", "N8")}
# ... and N = 8 with the engine core spinning while a step runs, as upstream's does
ARMS["N8-spin"] = [*ARMS["N8"], "--additional-config", json.dumps({"multi_step_engine_core_parks": False})]
DEFAULT_ARMS = ["upstream", "N1", "N8"]
METRICS = ["output_throughput", "median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "errors"]
RATIOS = [("N8", "upstream"), ("N1", "upstream"), ("N8", "N1"), ("N8", "N8-spin"), ("N8-spin", "upstream")]
CLIENT_TIMEOUT_S = 1800


def start_server(arm: str, pythons: dict[str, Path], model: Path, tmp: Path) -> Server:
    upstream = ARMS[arm] is None
    python = pythons[builds.UPSTREAM if upstream else builds.OVERLAY]
    # 2048 tokens: the long-prompt mix's prompts and outputs
    server = Server(server_command(python, upstream, model, 2048, ARMS[arm] or ()), tmp / f"{arm}.log")
    server.wait_ready()
    return server


class ProductionLengths:
    """Each seed's production output lengths, which the production-lengths mix asks for: those of
    the seed's first production run. Every build gives every production request of a seed the
    same tokens at any rate (token identity), so a later run that gets other lengths is counted
    in its row (``lengths_match``)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def path(self, seed: int) -> Path:
        return self.tmp / f"production-lengths-{seed}.json"

    def record(self, seed: int, requests: list[dict]) -> bool | None:
        """Keep a production run's lengths; whether they match those kept (None: none were, or
        a request failed and has no length)."""
        tokens = [request.get("tokens") for request in requests]
        if None in tokens:
            return None
        path = self.path(seed)
        if not path.exists():
            path.write_text(json.dumps(tokens))
            return None
        return json.loads(path.read_text()) == tokens


def send(server: Server, client_python: Path, mix: str, rate: str, seed: int, args, tmp: Path) -> dict:
    lengths = ProductionLengths(tmp)
    extra: list = []
    if mix == LENGTHS_MIX:
        if not lengths.path(seed).exists():  # a production run of the seed first, not recorded
            send(server, client_python, "production", rate, seed, args, tmp)
        extra = ["--lengths", lengths.path(seed)]
    out = tmp / f"{mix}-{rate}.json"
    with CpuMonitor(server.proc.pid) as cpu:
        proc = run_env(
            client_python, BENCHMARKS / "traffic_client.py", "--base-url", server.base, "--model", "m", "--mix", mix,
            "--rate", rate, "--num-prompts", str(args.num_prompts), "--seed", str(seed), "--out", out, *extra,
            timeout=CLIENT_TIMEOUT_S,
        )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    data = json.loads(out.read_text())
    row = {**data["summary"], "duration": data["duration"], "cpu": cpu.usage(data["duration"])}
    if mix == "production" and (match := lengths.record(seed, data["requests"])) is not None:
        row["lengths_match"] = match
    return row


def window_share(server: Server) -> float | None:
    """The share of generated tokens the server made in windows (None: no windows)."""
    window = server.metric("vllm:multi_step_generation_tokens_total", reason="window")
    total = server.metric("vllm:generation_tokens_total")
    return window / total if total else None


def summarize(runs: list[dict]) -> dict:
    """Per mix and rate: each arm's medians over rounds, and the ratios of RATIOS."""
    out: dict = {}
    for mix, rate in dict.fromkeys((r["mix"], r["rate"]) for r in runs):
        cell = [r for r in runs if (r["mix"], r["rate"]) == (mix, rate)]
        med = {arm: {k: statistics.median(r[k] for r in cell if r["arm"] == arm) for k in METRICS}
               for arm in dict.fromkeys(r["arm"] for r in cell)}  # fmt: skip
        ratios = {f"{a}/{b}": {k: med[a][k] / med[b][k] for k in METRICS[:-1] if med[b][k]}
                  for a, b in RATIOS if a in med and b in med}  # fmt: skip
        cores = {arm: _median_cores([r["cpu"] for r in cell if r["arm"] == arm]) for arm in med}
        out[f"{mix}@{rate}"] = {"median": med, "ratios": ratios, "cores": cores}
    return out


def _median_cores(usages: list[dict]) -> dict:
    """The median cores each server process, and the rest of the machine, used over ``usages``."""
    names = dict.fromkeys(name for u in usages for name in u["server_processes_cores"])
    cores = {name: statistics.median(u["server_processes_cores"].get(name, 0.0) for u in usages) for name in names}
    return cores | {"rest": statistics.median(u["rest_cores"] for u in usages)}


def paired(runs: list[dict], first: str) -> dict:
    """Per arm, mix other than ``first`` and rate: ``first``'s duration over the mix's in each
    block of runs (same server, round, repeat and rate), median and quartiles."""
    by_key = {(r["arm"], r["round"], r["repeat"], r["rate"]): r for r in runs if r["mix"] == first}
    out: dict = {}
    for run in runs:
        partner = by_key.get((run["arm"], run["round"], run["repeat"], run["rate"]))
        if run["mix"] != first and partner is not None:
            out.setdefault(f"{run['arm']} {run['mix']}@{run['rate']}", []).append(partner["duration"] / run["duration"])
    return {cell: {"first": first, **_spread(ratios)} for cell, ratios in out.items()}


def _spread(values: list[float]) -> dict:
    """Median and quartiles (the nearest ranks n // 4 and 3n // 4) of ``values``."""
    ordered = sorted(values)
    n = len(ordered)
    return {"pairs": n, "median": statistics.median(ordered), "quartiles": [ordered[n // 4], ordered[(3 * n) // 4]]}


def add_arguments(ap) -> None:
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mixes", nargs="+", default=["plain", "production", "long"])
    ap.add_argument("--rates", nargs="+", default=["8", "32", "64", "inf"])
    ap.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    ap.add_argument("--num-prompts", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=1, help="each mix this many times per server (see above)")
    results.add_json_argument(ap)


def main(args) -> int:
    pythons = builds.venvs()
    model = builds.build_model(pythons[builds.UPSTREAM], "tiny")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for r in range(args.rounds):
            for arm in args.arms if r % 2 == 0 else args.arms[::-1]:
                server = start_server(arm, pythons, model, tmp)
                try:
                    for repeat in range(args.repeats):
                        for mix in args.mixes if (r + repeat) % 2 == 0 else args.mixes[::-1]:
                            for i, rate in enumerate(args.rates):
                                seed = repeat * len(args.rates) + i  # fresh prompts (see above)
                                res = send(server, pythons[builds.OVERLAY], mix, rate, seed, args, tmp)
                                runs.append({"round": r + 1, "repeat": repeat + 1, "arm": arm, "mix": mix,
                                             "rate": rate, **res})  # fmt: skip
                                print(f"round {r + 1}.{repeat + 1} {arm:8} {mix:10} rate {rate:>4}: {json.dumps(res)}",
                                      flush=True)  # fmt: skip
                    if arm == "N8":  # over the server's whole life: every mix and rate
                        runs[-1]["window_share"] = window_share(server)
                finally:
                    server.stop()
    summary = summarize(runs)
    for cell, figures in summary.items():
        print(cell, json.dumps(figures["ratios"]))
    if args.repeats > 1 and len(args.mixes) > 1:
        summary["paired"] = paired(runs, args.mixes[0])
        for cell, spread in summary["paired"].items():
            print(f"paired {cell}: {spread['first']} duration over this mix's {spread['median']:.3f}", flush=True)
    data = results.make("serve-mix", arguments=results.arguments(args), runs=runs, summary=summary,
                        python=pythons[builds.OVERLAY])  # fmt: skip
    results.write(data, args.json)
    return 0
