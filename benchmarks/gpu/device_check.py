"""The GPU check, run on the lent GPU machine by device_check.sh (see README.md here).

Stages, each time-boxed, each writing into $OUT/results.json as it ends:
  facts     the GPU, torch and Python there
  smoke     both builds import and name themselves
  parity    the parity engines of tests/support/parity.py through `vllm.LLM`
            (tests/support/generate.py): upstream (async scheduling on, the GPU
            default) is the oracle; overlay N=1, 4, 8 with async on and N=8 with
            async off are compared token for token with it
  bench     tiny model, batch 32, 256 greedy tokens: upstream vs overlay N=8 in
            alternating rounds, and the forward-only limit (the decode forward
            alone between device synchronizations), eager and with CUDA graphs
Both builds run the Python code of their CUDA wheels with PyTorch-native custom
ops and Triton attention (no compiled vLLM kernels: stub_kernels.py says why).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support.parity import ENGINES, assert_same_outputs  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/gpucheck")
MODEL = ROOT / ".gpu" / "model"
TREES = {"upstream": "/tmp/up", "overlay": "/tmp/ov"}
# The same settings for both builds: no compiled vLLM kernels exist there.
GPU_LLM = {
    "attention_backend": "TRITON_ATTN",
    "compilation_config": {"custom_ops": ["none"]},
    "kv_cache_memory_bytes": 1 << 30,  # fixed: engines share the GPU, profiling would see each other
}
PARITY_ENGINES = os.environ.get("CHECK_ENGINES", "llama,prefix,chunked,preempt,structured").split(",")
OVERLAY_RUNS = [(1, None), (4, None), (8, None), (8, False)]  # (N, async_scheduling)
RESULTS: dict = {}
DEADLINE = time.monotonic() + float(os.environ.get("CHECK_BUDGET_S", "500"))


def _save() -> None:
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=1))


def _env(build: str) -> dict:
    return {**os.environ, "PYTHONPATH": f"{TREES[build]}:/tmp/site", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}  # fmt: skip


def _run(build: str, args: list, tag: str, timeout: float, extra_env: dict | None = None) -> tuple[int, str]:
    """Run python ARGS with BUILD's tree; the log goes to WORK/TAG.log."""
    timeout = max(5.0, min(timeout, DEADLINE - time.monotonic()))
    log = WORK / f"{tag}.log"
    with log.open("w") as f:
        env = {**_env(build), **(extra_env or {})}
        try:
            cmd = [sys.executable, *map(str, args)]
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=WORK).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, log.read_text()


def stage_facts() -> None:
    import torch

    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    RESULTS["facts"] = {"gpu": smi, "torch": torch.__version__, "cuda": torch.version.cuda,
                        "python": sys.version.split()[0]}  # fmt: skip


def stage_smoke() -> None:
    code = "import vllm, vllm.platforms as p; print('SMOKE', vllm.__version__, p.current_platform.device_name)"
    RESULTS["smoke"] = {}
    for build in TREES:
        rc, log = _run(build, ["-c", code], f"smoke-{build}", 120)
        RESULTS["smoke"][build] = next(
            (ln for ln in log.splitlines() if ln.startswith("SMOKE")), f"rc={rc} " + log[-1500:]
        )


def _spec(engine: str, extra: dict) -> dict:
    _model, kwargs, cases = ENGINES[engine]
    llm = {"model": str(MODEL), "dtype": "float32", "max_model_len": 512, "seed": 0, **GPU_LLM, "enforce_eager": True}
    return {"llm": {**llm, **kwargs, **extra}, "cases": cases}


def _generate(build: str, engine: str, extra: dict, tag: str) -> dict:
    spec, out = WORK / f"{tag}-spec.json", WORK / f"{tag}-out.json"
    spec.write_text(json.dumps(_spec(engine, extra)))
    rc, log = _run(build, [ROOT / "tests" / "support" / "generate.py", spec, out], tag, 240)
    if rc != 0 or not out.exists():
        return {"error": f"rc={rc}: " + log[-2500:]}
    return {"result": json.loads(out.read_text()), "lean": "run as lean steps" in log,
            "not_lean": "not covered by the lean inner step" in log}  # fmt: skip


def stage_parity() -> None:
    jobs = {}
    for engine in PARITY_ENGINES:
        jobs[(engine, "upstream")] = ("upstream", engine, {})
        for n, async_mode in OVERLAY_RUNS:
            extra = {"num_scheduler_steps": n} | ({} if async_mode is None else {"async_scheduling": async_mode})
            jobs[(engine, f"N={n} async={'off' if async_mode is False else 'on'}")] = ("overlay", engine, extra)
    with ThreadPoolExecutor(10) as pool:
        futures = {key: pool.submit(_generate, *job, f"{key[0]}-{key[1].replace(' ', '_').replace('=', '')}")
                   for key, job in jobs.items()}  # fmt: skip
        done = {key: f.result() for key, f in futures.items()}
    RESULTS["parity"] = {}
    for engine in PARITY_ENGINES:
        oracle = done[(engine, "upstream")]
        for key, got in done.items():
            if key[0] != engine or key[1] == "upstream":
                continue
            RESULTS["parity"][f"{engine} {key[1]}"] = _compare(engine, got, oracle)
    _save()


def _compare(engine: str, got: dict, oracle: dict) -> dict:
    if "error" in oracle:
        return {"status": "no oracle", "why": oracle["error"]}
    if "error" in got:
        return {"status": "overlay failed", "why": got["error"]}
    ours, theirs = got["result"], oracle["result"]
    steps = ours["counters"].get("vllm:iteration_tokens_total_count", 0)
    row = {"engine_steps": steps, "upstream_steps": theirs["counters"].get("vllm:iteration_tokens_total_count", 0),
           "kv_usage_after": ours["counters"].get("vllm:kv_cache_usage_perc"), "lean_steps_logged": got["lean"],
           "async": ours["async_scheduling"], "oracle_async": theirs["async_scheduling"]}  # fmt: skip
    try:
        assert_same_outputs(ours, theirs, engine)
        row["status"] = "identical"
    except AssertionError as e:
        row["status"] = "DIFFERENT"
        row["why"] = str(e)[:600]
    return row


def _bench(build: str, kwargs: dict, tag: str, forward_only: bool = False) -> dict:
    args = [ROOT / "benchmarks" / "offline_worker.py", MODEL, json.dumps({**GPU_LLM, **kwargs}), 32, 256, 3]
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if forward_only else {}
    rc, log = _run(build, [*args, *(["--forward-only"] if forward_only else [])], tag, 200, env)
    line = next((ln for ln in log.splitlines() if ln.startswith("RESULT ")), None)
    return json.loads(line[7:]) if rc == 0 and line else {"error": f"rc={rc}: " + log[-1500:]}


def stage_bench(mode: str, kwargs: dict, rounds: int) -> None:
    runs: dict[str, list] = {"upstream": [], "overlay N=8": []}
    configs = {"upstream": ("upstream", kwargs), "overlay N=8": ("overlay", {**kwargs, "num_scheduler_steps": 8})}
    RESULTS[f"bench_{mode}"] = entry = {"runs": runs}
    for r in range(rounds):
        for name in list(configs) if r % 2 == 0 else list(configs)[::-1]:
            build, kw = configs[name]
            runs[name].append(_bench(build, kw, f"bench-{mode}-{r}-{name.replace(' ', '_').replace('=', '')}"))
            _save()
    entry["forward_only"] = _bench("upstream", kwargs, f"bench-{mode}-forward", forward_only=True)
    medians = {n: statistics.median(x["median"] for x in v) for n, v in runs.items() if all("median" in x for x in v)}
    if len(medians) == 2:
        entry["n8_vs_upstream"] = medians["overlay N=8"] / medians["upstream"]
        if "forward_limit" in entry["forward_only"]:
            entry["limit_over_n8"] = entry["forward_only"]["forward_limit"] / medians["overlay N=8"]
    _save()


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    stages = [
        ("facts", stage_facts),
        ("smoke", stage_smoke),
        ("parity", stage_parity),
        ("bench eager", lambda: stage_bench("eager", {"enforce_eager": True}, 1)),
        ("bench graphs", lambda: stage_bench("cudagraphs", {"compilation_config": {
            "custom_ops": ["none"], "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32]}}, 1)),
    ]  # fmt: skip
    wanted = os.environ.get("CHECK_STAGES")
    for name, stage in stages:
        if wanted and name.split()[0] not in wanted.split(","):
            continue
        if DEADLINE - time.monotonic() < 30:
            RESULTS.setdefault("skipped", []).append(name)
            continue
        start = time.monotonic()
        try:
            stage()
        except Exception as e:  # report and go on: each stage stands alone
            RESULTS.setdefault("stage_errors", {})[name] = f"{type(e).__name__}: {e}"
        RESULTS.setdefault("stage_seconds", {})[name] = round(time.monotonic() - start, 1)
        print(f"[{time.strftime('%H:%M:%S')}] {name} done in {time.monotonic() - start:.0f} s", flush=True)
        _save()
    with tarfile.open(OUT / "logs.tar.gz", "w:gz") as tf:
        for log in sorted(WORK.glob("*.log")):
            tf.add(log, arcname=log.name)
    print(json.dumps(RESULTS, indent=1)[:6000])


if __name__ == "__main__":
    main()
