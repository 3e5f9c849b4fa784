"""The served benchmark's client (benchmarks/traffic_client.py) against upstream's server: it
reads every request's stream to the end, counts its tokens as the server's usage does, times its
first token, and turns a request the server refuses into an error entry instead of a crash."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from support.serve_cases import MODEL  # noqa: E402
from traffic_client import requests_of  # noqa: E402

CLIENT = ROOT / "benchmarks" / "traffic_client.py"
NUM_PROMPTS = 24


def test_every_request_of_the_production_mix_is_read_to_its_end(upstream_server, upstream_python, tmp_path):
    out = tmp_path / "result.json"
    subprocess.run(
        [upstream_python, CLIENT, "--base-url", upstream_server.base, "--model", MODEL, "--mix", "production",
         "--rate", "inf", "--num-prompts", str(NUM_PROMPTS), "--seed", "0", "--out", out],
        check=True, timeout=300,
    )  # fmt: skip
    result = json.loads(out.read_text())
    sent = requests_of("production", NUM_PROMPTS, 0)
    assert result["summary"]["errors"] == 0, [r["error"] for r in result["requests"] if r["error"]]
    assert {r["kind"] for r in result["requests"]} == {"sampled", "logprobs", "json", "stop"}
    for request, got in zip(sent, result["requests"], strict=True):
        assert got["kind"] == request["kind"]
        assert got["ttft"] > 0
        # EOS is ignored: a request without a structured end or a stop string runs to its limit.
        if request["kind"] in ("sampled", "logprobs"):
            assert got["tokens"] == request["params"]["max_tokens"]
            assert got["tpot"] > 0
        else:
            assert 0 < got["tokens"] <= request["params"]["max_tokens"]
    assert result["summary"]["output_throughput"] == sum(r["tokens"] for r in result["requests"]) / result["duration"]


def test_a_refused_request_is_an_error_entry(upstream_server, upstream_python):
    # More output tokens than the model's length: upstream answers 400 before it streams.
    script = (
        "import asyncio, json, sys, aiohttp\n"
        f"sys.path.insert(0, {str(CLIENT.parent)!r})\n"
        "import traffic_client\n"
        "async def main():\n"
        "    async with aiohttp.ClientSession() as session:\n"
        "        request = {'kind': 'sampled', 'prompt': [5, 6, 7], 'params': {'max_tokens': 100000}, 'body': {}}\n"
        f"        print(json.dumps(await traffic_client.one(session, {upstream_server.base + '/v1/completions'!r}, "
        f"{MODEL!r}, request, 0.0)))\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run([upstream_python, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["kind"] == "sampled"
    assert got["error"].startswith("RuntimeError: HTTP 400"), got
