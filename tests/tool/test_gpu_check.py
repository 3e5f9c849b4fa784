"""The prepared GPU check (benchmarks/gpu/device_check.py) stays in step with what it reads here.

No engine and no device: a device session has 15 minutes in all, so a check that dies on a name
the suite renamed (the 0.32.0 script still asked for parity engines "prefix" and "structured"
after they merged into "llama") costs a whole session. Every parity row must build its engine
spec from tests/support/parity.py, every benchmark model's build arguments must be options of
tests/support/tiny_model.py, and the benchmark summary must compute its ratios per batch size.
"""

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

from support import tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def check(monkeypatch_module):
    monkeypatch_module.delenv("CHECK_LOCAL", raising=False)  # the device's settings, not the rehearsal's
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "benchmarks" / "gpu" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_every_parity_row_builds_its_engine(check):
    for engine, (_entry, _both, runs) in check.PARITY_ENGINES.items():
        oracle = check._spec(engine, {})
        assert oracle["cases"], engine
        assert "num_scheduler_steps" not in oracle["llm"], engine
        for name, extra in runs.items():
            llm = check._spec(engine, extra)["llm"]
            assert llm["num_scheduler_steps"] > 1 or name == "N=1", (engine, name)
            assert {k: v for k, v in llm.items() if k not in extra} == oracle["llm"], (engine, name)
    graphs = check._spec("llama-graphs", {})["llm"]
    assert graphs["compilation_config"]["cudagraph_mode"] == "FULL_DECODE_ONLY" and not graphs["enforce_eager"]
    eagle = check._spec("eagle", {})["llm"]["speculative_config"]
    assert eagle["method"] == "eagle" and eagle["model"] == str(check.EAGLE)


def _outputs(cases: list[dict], token: int) -> dict:
    """What generate.py writes, in the fields the comparison reads: one token per completion."""
    completion = {"token_ids": [token], "text": "x", "finish_reason": "length", "stop_reason": None, "logprobs": None}
    per_case = [[{"prompt_logprobs": None, "outputs": [completion]} for _ in case["prompts"]] for case in cases]
    return {"result": {"cases": per_case, "counters": {}, "async_scheduling": True}, "path": [], "windows": []}


def test_every_parity_row_is_compared_with_its_cases(check):
    for engine, (_entry, _both, runs) in check.PARITY_ENGINES.items():
        cases = check._spec(engine, {})["cases"]
        for name in runs:
            assert check._compare(engine, _outputs(cases, 5), _outputs(cases, 5))["status"] == "identical", name
            assert check._compare(engine, _outputs(cases, 5), _outputs(cases, 6))["status"] == "DIFFERENT", name


def test_device_settings_leave_model_runner_v2_on(check):
    """0.34.0 refuses VLLM_USE_V2_MODEL_RUNNER=0 (Model Runner V1 is gone)."""
    assert "VLLM_USE_V2_MODEL_RUNNER" not in check.ENV
    assert "ir_op_priority" not in check.GPU_LLM  # deprecated at the top level in 0.34.0


def test_benchmark_models_are_options_of_the_model_builder(check):
    options = {"--" + name.replace("_", "-") for name in inspect.signature(tiny_model.build_model).parameters}
    for name, args in check.MODEL_ARGS.items():
        assert {a for a in args if a.startswith("--")} <= options, name
    assert set(check.BENCH_MODELS) <= set(check.MODEL_ARGS) | {"tiny"}


def test_benchmark_summary_is_per_batch(check):
    def run(tok_s_32, tok_s_128):
        return {"32": {"median": tok_s_32}, "128": {"median": tok_s_128}}

    runs = {
        "upstream": [run(100, 400), run(120, 380)],
        "N=8": [run(200, 700), run(260, 740)],
        "N=1": [run(110, 400), {"error": "rc=1 FAILED"}],
    }
    summary = check._bench_summary(runs, {"32": {"forward_limit": 460.0}, "128": {}})
    assert summary["32"]["tok_s"] == {"upstream": 110, "N=8": 230}  # N=1 failed a round: left out
    assert summary["32"]["vs_upstream"] == {"N=8": round(230 / 110, 3)}
    assert summary["32"]["limit_over_n8"] == 2.0
    assert summary["128"]["vs_upstream"] == {"N=8": round(720 / 390, 3)}
    assert "limit_over_n8" not in summary["128"]


def test_benchmark_summary_sets_structured_runs_beside_plain_ones(check):
    runs = {
        "upstream": [{"32": {"median": 100}}],
        "N=8": [{"32": {"median": 250}}],
        "upstream structured": [{"32": {"median": 80}}],
        "N=8 structured": [{"32": {"median": 150}}],
    }
    summary = check._bench_summary(runs, {})["32"]
    assert summary["vs_upstream"] == {"N=8": 2.5}  # plain over plain only
    assert summary["structured_over_plain"] == {"upstream": 0.8, "N=8": 0.6}
