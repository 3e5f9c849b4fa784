"""bench.py serve-mix's paired summary (--repeats), engine-free: each mix against the run of the
first mix beside it in the same server."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import serve_mix  # noqa: E402


def _run(arm: str, round_: int, repeat: int, mix: str, duration: float, rate: str = "inf") -> dict:
    return {"arm": arm, "round": round_, "repeat": repeat, "mix": mix, "rate": rate, "duration": duration}


def test_each_run_is_paired_with_the_first_mix_beside_it_in_the_same_server():
    runs = []
    for repeat, (plain, production) in enumerate([(2.0, 2.5), (4.0, 4.0), (1.0, 2.0)], start=1):
        runs += [_run("N8", 1, repeat, "plain", plain), _run("N8", 1, repeat, "production", production)]
    # another server, slower overall: its pairs are its own
    runs += [_run("N1", 1, 1, "production", 3.0), _run("N1", 1, 1, "plain", 6.0)]
    out = serve_mix.paired(runs, "plain")
    assert set(out) == {"N8 production@inf", "N1 production@inf"}
    n8 = out["N8 production@inf"]
    assert (n8["first"], n8["pairs"], n8["median"]) == ("plain", 3, 0.8)  # 0.5, 0.8, 1.0
    assert n8["quartiles"] == [0.5, 1.0]  # nearest ranks n // 4 and 3n // 4
    assert out["N1 production@inf"]["median"] == 2.0


def test_a_run_without_a_partner_is_left_out_and_rates_pair_apart():
    runs = [
        _run("N8", 1, 1, "plain", 2.0, "inf"),
        _run("N8", 1, 1, "production", 4.0, "inf"),
        _run("N8", 1, 1, "production", 1.0, "32"),  # no plain run at 32 req/s
        _run("N8", 1, 2, "json10", 1.0, "inf"),  # no plain run in repeat 2
    ]
    assert serve_mix.paired(runs, "plain") == {
        "N8 production@inf": {"first": "plain", "pairs": 1, "median": 0.5, "quartiles": [0.5, 0.5]}
    }


def test_the_summary_gives_each_arms_median_cores_per_process():
    def run(arm: str, worker: float, api: float, rest: float) -> dict:
        metrics = dict.fromkeys(serve_mix.METRICS, 1.0)
        usage = {"server_processes_cores": {"VLLM::Worker": worker, "vllm": api}, "rest_cores": rest}
        return {"arm": arm, "mix": "plain", "rate": "inf", **metrics, "cpu": usage}

    runs = [run("N8", 0.9, 0.2, 0.1), run("N8", 1.0, 0.1, 0.2), run("N8", 0.5, 0.3, 0.3), run("N1", 0.6, 0.5, 0.4)]
    cores = serve_mix.summarize(runs)["plain@inf"]["cores"]
    assert cores == {
        "N8": {"VLLM::Worker": 0.9, "vllm": 0.2, "rest": 0.2},
        "N1": {"VLLM::Worker": 0.6, "vllm": 0.5, "rest": 0.4},
    }


def test_production_lengths_are_kept_from_the_seeds_first_run_and_later_runs_checked(tmp_path):
    lengths = serve_mix.ProductionLengths(tmp_path)
    first = [{"tokens": 5}, {"tokens": 48}]
    assert lengths.record(3, first) is None  # kept
    assert serve_mix.json.loads(lengths.path(3).read_text()) == [5, 48]
    assert lengths.record(3, first) is True
    assert lengths.record(3, [{"tokens": 5}, {"tokens": 47}]) is False  # not token-identical
    assert serve_mix.json.loads(lengths.path(3).read_text()) == [5, 48]  # the first run's stay
    # a failed request has no length: nothing kept, nothing checked
    assert lengths.record(4, [{"tokens": 5}, {"error": "HTTP 500"}]) is None
    assert not lengths.path(4).exists()


def test_production_lengths_sends_productions_requests_as_plain_ones_of_its_lengths():
    import traffic_client

    production = traffic_client.requests_of("production", 40, 7)
    lengths = list(range(len(production)))
    twins = traffic_client.requests_of(traffic_client.LENGTHS_MIX, 40, 7, lengths)
    assert {r["kind"] for r in production} == {"sampled", "logprobs", "json", "stop"}
    for request, twin, length in zip(production, twins, lengths, strict=True):
        assert twin["prompt"] == request["prompt"] and twin["kind"] == "plain-as-" + request["kind"]
        assert twin["params"] == {"max_tokens": max(length, 1), "temperature": 0.8, "seed": request["params"]["seed"]}
        assert twin["body"] == {"ignore_eos": True}  # runs to its length: no grammar, stop or EOS
    with pytest.raises(SystemExit, match="needs --lengths"):
        traffic_client.requests_of(traffic_client.LENGTHS_MIX, 40, 7, lengths[:-1])
