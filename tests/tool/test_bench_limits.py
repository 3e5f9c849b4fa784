"""The benchmarks' two in-process limits, engine-free: the forward-only limit and the forward+sample limit.

forward_hooks.StepTimes puts each decode step's sampling with its forward; offline_worker.py
turns the steps into a RESULT's fields; harness/forward_only.py and harness/offline.py summarize
and report them. Results from before the forward+sample limit (no forward_sample_* fields) still
summarize and report, with the forward-only limit alone.
"""

import json
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import forward_hooks  # noqa: E402
import offline_worker  # noqa: E402
from harness import forward_only, offline, results  # noqa: E402

V1, V2 = ("compute_logits", "sample"), ("sample",)


def test_a_step_is_its_forward_plus_every_piece_of_its_sampling():
    steps = forward_hooks.StepTimes([32], V1)
    steps.record_forward(32, 1.0)
    steps.record_piece("compute_logits", 0.25)
    steps.record_piece("sample", 0.5)
    assert steps.forward[32] == [1.0] and steps.forward_sample[32] == [1.75] and steps.sampling[32] == [0.75]


def test_steps_that_are_not_full_batch_decode_steps_give_nothing():
    steps = forward_hooks.StepTimes([32], V2)
    steps.record_piece("sample", 9.0)  # a sampler with no forward before it
    steps.record_forward(1024, 5.0)  # a prefill: other rows
    steps.record_piece("sample", 9.0)
    steps.record_forward(32, 1.0)  # a dummy run's forward: no sampling after it
    steps.record_forward(32, 2.0)
    steps.record_piece("sample", 0.5)
    steps.record_piece("sample", 9.0)  # the step is over: a second sampler is not its
    assert steps.forward == {32: [1.0, 2.0]} and steps.forward_sample == {32: [2.5]}


def test_a_step_missing_a_piece_is_not_counted():
    steps = forward_hooks.StepTimes([32], V1)
    steps.record_forward(32, 1.0)
    steps.record_piece("sample", 0.5)  # its logits were not timed: the sum would be short
    steps.record_forward(32, 1.0)
    steps.record_piece("compute_logits", 0.25)
    steps.record_forward(32, 1.0)  # the next forward before the sampler
    steps.record_piece("sample", 0.5)
    assert steps.forward_sample[32] == []
    steps.clear(32)
    assert steps.forward[32] == []


@pytest.fixture
def stub_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(get_num_threads=lambda: 1))


def test_result_fields_are_medians_over_the_steps(stub_torch):
    steps = forward_hooks.StepTimes([4], V2)
    for forward, sampling in ((0.001, 0.0002), (0.003, 0.0001), (0.002, 0.0003)):
        steps.record_forward(4, forward)
        steps.record_piece("sample", sampling)
    fields = offline_worker._limits(4, steps)
    assert fields["forward_ms"] == pytest.approx(2.0) and fields["forward_limit"] == pytest.approx(2000)
    # The median of the steps' sums (1.2, 3.1, 2.3 ms), not the sum of the two medians (2.2 ms).
    assert fields["forward_sample_ms"] == pytest.approx(2.3) and fields["sampling_ms"] == pytest.approx(0.2)
    assert fields["forward_sample_limit"] == pytest.approx(4 / 0.0023)
    assert fields["forward_steps"] == fields["forward_sample_steps"] == 3 and fields["forward_threads"] == 1
    assert offline_worker._limits(4, None) == {}


def test_result_without_sampled_steps_says_none(stub_torch):
    steps = forward_hooks.StepTimes([4], V2)
    steps.record_forward(4, 0.001)
    fields = offline_worker._limits(4, steps)
    assert fields["forward_sample_ms"] is None and fields["forward_sample_limit"] is None
    assert fields["forward_sample_steps"] == 0 and json.dumps(fields)


def _limit_run(rnd: int, forward_ms: float, sample_ms: float | None = None) -> dict:
    run = {"round": rnd, "config": forward_only.CONFIG, "best": 1.0, "median": 1.0, "forward_ms": forward_ms,
           "forward_limit": 32000 / forward_ms, "forward_threads": 1, "forward_cores": [0]}  # fmt: skip
    if sample_ms is not None:
        run |= {"forward_sample_ms": sample_ms, "forward_sample_limit": 32000 / sample_ms}
    return run


def test_forward_only_summary_gives_both_limits():
    summary = forward_only.summarize([_limit_run(1, 1.0, 1.25), _limit_run(2, 2.0, 2.5), _limit_run(3, 0.5, 0.8)])
    assert summary == {
        "forward_limit": 32000.0,
        "forward_ms": 1.0,
        "forward_ms_range": [0.5, 2.0],
        "forward_sample_limit": 25600.0,
        "forward_sample_ms": 1.25,
        "forward_sample_ms_range": [0.8, 2.5],
    }
    line = forward_only.describe(_limit_run(1, 1.0, 1.25))
    assert "32000 tok/s (1.000 ms per forward" in line and "forward+sample     25600 tok/s (1.250 ms per step)" in line
    assert forward_only.median_line(summary).endswith("forward+sample 25600 tok/s, 1.250 ms per step")


def test_older_forward_only_runs_give_the_forward_only_limit_alone():
    old = [_limit_run(1, 1.0), _limit_run(2, 2.0)]
    old[1].pop("forward_ms")  # the oldest offline results have no forward_ms either
    summary = forward_only.summarize(old)
    assert summary == {"forward_limit": 24000.0, "forward_ms": 1.0, "forward_ms_range": [1.0, 1.0]}
    assert "forward+sample" not in forward_only.describe(_limit_run(1, 1.0))
    assert "forward+sample" not in forward_only.median_line(summary)
    # A run whose sampling was not timed (null fields) counts for the forward-only limit only.
    mixed = forward_only.summarize([_limit_run(1, 1.0, 2.0), _limit_run(2, 2.0) | {"forward_sample_ms": None}])
    assert mixed["forward_sample_ms"] == 2.0 and mixed["forward_limit"] == 24000.0


def _offline_runs(sample: bool) -> list[dict]:
    runs = []
    for rnd in (1, 2, 3):
        runs.append({"round": rnd, "config": "upstream", "median": 4000.0, "decode_median": 4000.0})
        runs.append({"round": rnd, "config": "overlay N=8", "median": 8000.0, "decode_median": 10000.0})
        runs.append(_limit_run(rnd, 1.0, 1.25 if sample else None))
    return runs


def test_offline_summary_has_the_distance_from_each_limit():
    summary = offline.summarize(_offline_runs(sample=True))
    assert summary["limit_over"] == {"upstream": 8.0, "overlay N=8": 4.0}
    assert summary["forward_sample_limit"] == 25600.0
    assert summary["forward_sample_limit_over"] == {"upstream": 6.4, "overlay N=8": 3.2}
    assert summary["forward_ms"] == 1.0 and summary["forward_sample_ms"] == 1.25
    old = offline.summarize(_offline_runs(sample=False))
    assert old["limit_over"] == summary["limit_over"] and old["forward_ms"] == 1.0
    assert not {"forward_sample_limit", "forward_sample_limit_over", "forward_sample_ms"} & set(old)


def test_offline_report_has_a_forward_sample_column_and_row():
    lines = offline.report_lines(offline.summarize(_offline_runs(sample=True)), batch=32)
    assert lines[0].split() == ["config", "tok/s", "vs", "upstream", "limit/this", "fwd+smp", "limit/this",
                                "decode", "phase"]  # fmt: skip
    rows = {line[:16].strip(): line[16:].split() for line in lines[1:]}
    assert rows["overlay N=8"] == ["8000", "2.00x", "4.00x", "3.20x", "2.50x"]
    assert rows["forward-only"] == ["32000", "8.00x", "1.00x", "0.80x"]
    assert rows["forward+sample"] == ["25600", "6.40x", "1.25x", "1.00x"]
    old = offline.report_lines(offline.summarize(_offline_runs(sample=False)), batch=32)
    assert "fwd+smp" not in old[0] and "forward+sample" not in "".join(old) and len(old) == 4
    # The worker's forward columns: the limits' rows give the in-process forward.
    with_worker = offline.report_lines(offline.summarize(_offline_runs(sample=True)), batch=32, worker_forward=True)
    assert with_worker[-1].split()[-2:] == ["1.000", "80%"] and with_worker[-2].split()[-2:] == ["1.000", "100%"]


def test_offline_report_of_a_result_without_a_limit():
    runs = [{"round": 1, "config": "upstream", "median": 98.0}, {"round": 1, "config": "overlay N=8", "median": 89.0}]
    assert [line.split() for line in offline.report_lines(offline.summarize(runs), batch=32)][1:] == [
        ["upstream", "98", "1.00x"],
        ["overlay", "N=8", "89", "0.91x"],
    ]


def _fake_limit(python, model, kwargs, *, batch, out_len, reps, forward_only=False, **_):
    assert forward_only
    run = _limit_run(0, 1.0 * batch / 32, 1.25 * batch / 32) | {"forward_steps": 3, "forward_sample_steps": 3}
    return {k: v for k, v in run.items() if k not in ("round", "config")}


def test_forward_only_subcommand_writes_both_limits(tmp_path, monkeypatch, capsys):
    import bench
    from harness import builds, worker

    monkeypatch.setattr(builds, "venvs", lambda: {"upstream": tmp_path / "python", "overlay": tmp_path / "python"})
    monkeypatch.setattr(builds, "build_model", lambda python, name: tmp_path / f"model-{name}")
    monkeypatch.setattr(results, "provenance", lambda python: results.UNKNOWN_BUILD)
    monkeypatch.setattr(worker, "run", _fake_limit)
    out = tmp_path / "f.json"
    assert bench.main(["forward-only", "--rounds", "2", "--json", str(out)]) == 0
    data = results.read(out)
    assert data["summary"]["forward_limit"] == 32000.0 and data["summary"]["forward_sample_limit"] == 25600.0
    assert all(r["round"] in (1, 2) and r["forward_sample_steps"] == 3 for r in data["runs"])
    assert "median 32000 tok/s, 1.000 ms per forward; forward+sample 25600 tok/s, 1.250 ms per step" in (
        capsys.readouterr().out
    )
