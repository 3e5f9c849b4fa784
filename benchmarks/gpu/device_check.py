"""The GPU check, run on the lent GPU machine by device_check.sh (see README.md here).

Stages, each time-boxed, each catching its own failure (the error tail goes into
the results) and writing $OUT/results.json as its jobs end:
  facts     the GPU, torch, Python and the relevant packages there
  parity    the parity engines of tests/support/parity.py through `vllm.LLM`
            (tests/support/generate.py): upstream (async scheduling on, the GPU
            default) is the oracle; overlay runs (RUNS below) are compared token
            for token with it
  bench     tiny model, batch 32, 256 greedy tokens: upstream vs overlay N=8
            (CHECK_ROUNDS rounds, alternating order), and the forward-only limit (the decode forward
            alone between device synchronizations), eager and with CUDA graphs
  smoke     (only when asked) both builds import and name themselves
Both builds run the Python code of their CUDA wheels with the same settings
(GPU_LLM, ENV): no compiled vLLM kernels exist there (stub_kernels.py says why),
so the engine is kept on paths that need none: PyTorch-native custom ops and IR
ops, Triton attention, the V1 model runner, the PyTorch sampler, no DeepGEMM.
Progress lines go to stdout as each job ends, so a timeout shows how far it got.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support.parity import ENGINES, assert_same_outputs  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/gpucheck")
MODEL = ROOT / ".gpu" / "model"
TREES = {"upstream": "/tmp/up", "overlay": "/tmp/ov"}
START = time.monotonic()
DEADLINE = START + float(os.environ.get("CHECK_BUDGET_S", "330"))
# Parity may use this share of the budget; the benchmark gets the rest.
PARITY_SHARE = float(os.environ.get("CHECK_PARITY_SHARE", "0.45"))
# Benchmark rounds per mode (upstream and N=8 alternate order each round).
ROUNDS = int(os.environ.get("CHECK_ROUNDS", "1"))

# The same engine settings for both builds, chosen so that no compiled vLLM
# kernel is reached (see the audit notes in README.md):
GPU_LLM = {
    "attention_backend": "TRITON_ATTN",  # no flash-attn/FlashInfer extension here
    "compilation_config": {"custom_ops": ["none"]},  # PyTorch-native CustomOps
    # RMSNorm dispatches through vLLM IR ops, whose CUDA default is the compiled
    # "vllm_c" kernel whenever Inductor is off; "native" is vLLM's own torch impl.
    "ir_op_priority": {"rms_norm": ["native"], "fused_add_rms_norm": ["native"], "gelu_and_mul_sparse": ["native"]},
    "kv_cache_memory_bytes": 1 << 30,  # fixed: engines share the GPU, profiling would see each other
    # Only checked against free memory at start when kv_cache_memory_bytes is
    # set: the default 0.9 of the H200 fails for the later of parallel engines.
    "gpu_memory_utilization": 0.05,
}  # fmt: skip
ENV = {
    "VLLM_USE_V2_MODEL_RUNNER": "0",  # V1 runner (the V2 one needs the compiled UVA op); multi-step runs on V1
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # else the sampler imports FlashInfer (absent): PyTorch top-k/top-p
    "VLLM_USE_DEEP_GEMM": "0",  # the vendored DeepGEMM has no extension here; the warmup would probe it
    "VLLM_USE_LAYERNAME": "0",  # plain-str layer names in vLLM's custom ops (the torch >= 2.11 opaque type is
    #                             only for torch.compile; avoids an API that changed up to 2.13)
    "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",  # xgrammar's tvm-ffi would try to JIT a torch extension (nvcc)
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",  # the sampler's small torch.compile calls: no worker pools x 20 engines
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}
# (engine, N, async_scheduling): N=1/4/8 on the main matrix, N=8 on the others.
PARITY_ENGINES = os.environ.get("CHECK_ENGINES", "llama,prefix,chunked,preempt,structured").split(",")
LLAMA_RUNS = [(1, None), (4, None), (8, None), (8, False)]
OTHER_RUNS = [(8, None), (8, False)]
GRAPHS = {"compilation_config": {"mode": 0, "custom_ops": ["none"], "cudagraph_mode": "FULL_DECODE_ONLY",
                                 "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32]},
          "kernel_config": {"enable_jit_warmup": False}}  # fmt: skip
RESULTS: dict = {"settings": {"llm": GPU_LLM, "env": ENV, "graphs": GRAPHS}}


def _t() -> str:
    return f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - START:.0f}s]"


def log(msg: str) -> None:
    print(f"{_t()} {msg}", flush=True)


def _save() -> None:
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=1))


def _env(build: str) -> dict:
    return {**os.environ, **ENV, "PYTHONPATH": f"{TREES[build]}:/tmp/site"}


def _why(rc: int, text: str, n: int = 2500) -> str:
    what = {124: "TIMED OUT (budget)", 125: "NOT STARTED (out of time)"}.get(rc, "FAILED")
    return f"rc={rc} {what}: " + _tail(text, n)


def _tail(text: str, n: int = 2500) -> str:
    """The end of a log, with the first traceback's last lines if it has one."""
    lines = [ln for ln in text.splitlines() if "DEBUG" not in ln]
    err = [i for i, ln in enumerate(lines) if ln.startswith(("Traceback", "[rank0]: Traceback"))]
    head = ""
    if err:  # the first error's exception line: often the real cause
        block = lines[err[0] : err[0] + 80]
        exc = [ln for ln in block if not ln.startswith((" ", "[rank0]:  ")) and ("Error" in ln or "Exception" in ln)]
        head = "FIRST ERROR: " + " | ".join(exc[:2]) + "\n" if exc else ""
    return head + "\n".join(lines)[-n:]


def _run(build: str, args: list, tag: str, timeout: float, extra_env: dict | None = None) -> tuple[int, str]:
    """Run python ARGS with BUILD's tree; the log goes to WORK/TAG.log."""
    timeout = min(timeout, DEADLINE - time.monotonic())
    log_path = WORK / f"{tag}.log"
    if timeout < 10:
        return 125, "not started: out of time"
    with log_path.open("w") as f:
        env = {**_env(build), **(extra_env or {})}
        cmd = [sys.executable, *map(str, args)]
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=WORK, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = 124
        try:  # the engine core child too, so nothing lingers into the timed runs
            os.killpg(proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    return rc, log_path.read_text(errors="replace")


def stage_facts() -> None:
    import importlib.util

    import torch

    sys.path.insert(0, "/tmp/site")  # as the engines see it (PYTHONPATH=tree:/tmp/site)
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:  # noqa: BLE001
        smi = f"nvidia-smi failed: {e!r}"
    facts = {"gpu": smi, "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    for mod in ("triton", "torchvision", "flashinfer", "deep_gemm", "cutlass", "flash_attn", "xgrammar", "tvm_ffi"):
        try:  # only find the module: importing some of these is what the run must not depend on
            facts[mod] = "present" if importlib.util.find_spec(mod) else "absent"
        except Exception as e:  # noqa: BLE001
            facts[mod] = f"error {e!r}"
    for mod in ("triton", "torchvision", "transformers"):  # imported on the engine path (kernel warmups)
        try:
            facts[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            facts[mod] = f"import failed: {e!r}"[:300]
    spec = importlib.util.spec_from_file_location("stub_probe", ROOT / "benchmarks" / "gpu" / "stub_kernels.py")
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)  # the torch APIs it fills in, if any, on this torch
    facts["torch_shims"] = stub.TORCH_SHIMS
    RESULTS["facts"] = facts
    log(f"facts: {json.dumps(facts)}")


def stage_smoke() -> None:
    code = "import vllm, vllm.platforms as p; print('SMOKE', vllm.__version__, p.current_platform.device_name)"
    RESULTS["smoke"] = {}
    for build in TREES:
        rc, text = _run(build, ["-c", code], f"smoke-{build}", 120)
        line = next((ln for ln in text.splitlines() if ln.startswith("SMOKE")), None)
        RESULTS["smoke"][build] = line or _why(rc, text)
        log(f"smoke {build}: {RESULTS['smoke'][build][:200]}")


def _spec(engine: str, extra: dict) -> dict:
    _model, kwargs, cases = ENGINES[engine]
    llm = {"model": str(MODEL), "dtype": "float32", "max_model_len": 512, "seed": 0, **GPU_LLM, "enforce_eager": True}
    return {"llm": {**llm, **kwargs, **extra}, "cases": cases}


def _generate(build: str, engine: str, extra: dict, tag: str, deadline: float) -> dict:
    spec, out = WORK / f"{tag}-spec.json", WORK / f"{tag}-out.json"
    spec.write_text(json.dumps(_spec(engine, extra)))
    start = time.monotonic()
    rc, text = _run(build, [ROOT / "tests" / "support" / "generate.py", spec, out], tag, min(300, deadline - start))
    row = {"seconds": round(time.monotonic() - start, 1)}
    if rc != 0 or not out.exists():
        return {**row, "error": _why(rc, text)}
    return {**row, "result": json.loads(out.read_text()), "lean": "run as lean steps" in text,
            "not_lean": "not covered by the lean inner step" in text}  # fmt: skip


def stage_parity() -> None:
    deadline = START + PARITY_SHARE * (DEADLINE - START) if "bench" in _wanted() else DEADLINE
    jobs = {}
    for engine in PARITY_ENGINES:
        jobs[(engine, "upstream")] = ("upstream", engine, {})
        for n, async_mode in LLAMA_RUNS if engine == "llama" else OTHER_RUNS:
            extra = {"num_scheduler_steps": n} | ({} if async_mode is None else {"async_scheduling": async_mode})
            jobs[(engine, f"N={n} async={'off' if async_mode is False else 'on'}")] = ("overlay", engine, extra)
    RESULTS["parity"] = parity = {}
    RESULTS["parity_runs"] = runs = {}
    done: dict = {}
    workers = int(os.environ.get("CHECK_PARALLEL", str(len(jobs))))  # all at once: 16 cores, 141 GB
    with ThreadPoolExecutor(min(workers, len(jobs))) as pool:
        futures = {pool.submit(_generate, *job, f"{key[0]}-{key[1].replace(' ', '_').replace('=', '')}", deadline): key
                   for key, job in jobs.items()}  # fmt: skip
        for future in as_completed(futures):
            key = futures[future]
            try:
                done[key] = future.result()
            except Exception:  # noqa: BLE001
                done[key] = {"error": traceback.format_exc()[-2000:]}
            got = done[key]
            runs[f"{key[0]} {key[1]}"] = {"seconds": got.get("seconds"), "ok": "error" not in got,
                                          **({"error": got["error"]} if "error" in got else {})}  # fmt: skip
            what = "ok" if "error" not in got else got["error"][:300].replace("\n", " | ")
            log(f"parity run {key[0]} {key[1]} ({got.get('seconds')} s): {what}")
            _fill_parity(parity, done)
            _save()
    _fill_parity(parity, done)
    log("parity: " + json.dumps({k: v["status"] for k, v in parity.items()}))


def _fill_parity(parity: dict, done: dict) -> None:
    for (engine, name), got in done.items():
        if name != "upstream" and (engine, "upstream") in done:
            parity[f"{engine} {name}"] = _compare(engine, got, done[(engine, "upstream")])


def _compare(engine: str, got: dict, oracle: dict) -> dict:
    if "error" in oracle:
        return {"status": "no oracle", "why": oracle["error"][-1500:]}
    if "error" in got:
        return {"status": "overlay failed", "why": got["error"][-1500:]}
    ours, theirs = got["result"], oracle["result"]
    steps = ours["counters"].get("vllm:iteration_tokens_total_count", 0)
    row = {"engine_steps": steps, "upstream_steps": theirs["counters"].get("vllm:iteration_tokens_total_count", 0),
           "preemptions": ours["counters"].get("vllm:num_preemptions"),
           "upstream_preemptions": theirs["counters"].get("vllm:num_preemptions"),
           "prefix_hits": ours["counters"].get("vllm:prefix_cache_hits"), "lean_steps_logged": got["lean"],
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
    start = time.monotonic()
    rc, text = _run(build, [*args, *(["--forward-only"] if forward_only else [])], tag, 200, env)
    line = next((ln for ln in text.splitlines() if ln.startswith("RESULT ")), None)
    row = json.loads(line[7:]) if rc == 0 and line else {"error": _why(rc, text, 1500)}
    row["seconds"] = round(time.monotonic() - start, 1)
    if "forward_ms" in row:
        what = f"forward {row['forward_ms']:.2f} ms"
    elif "median" in row:
        what = f"median {row['median']:.0f} tok/s"
    else:
        what = row["error"][:300].replace("\n", " | ")
    log(f"bench {tag} ({row['seconds']} s): {what}")
    return row


def stage_bench(mode: str, kwargs: dict, rounds: int) -> None:
    runs: dict[str, list] = {"upstream": [], "overlay N=8": []}
    configs = {"upstream": ("upstream", kwargs), "overlay N=8": ("overlay", {**kwargs, "num_scheduler_steps": 8})}
    RESULTS[f"bench_{mode}"] = entry = {"kwargs": kwargs, "runs": runs}
    for r in range(rounds):
        for name in list(configs) if r % 2 == 0 else list(configs)[::-1]:
            build, kw = configs[name]
            runs[name].append(_bench(build, kw, f"bench-{mode}-{r}-{name.replace(' ', '_').replace('=', '')}"))
            _save()
    medians = {
        n: statistics.median(x["median"] for x in v) for n, v in runs.items() if v and all("median" in x for x in v)
    }
    if len(medians) == 2:
        entry["n8_vs_upstream"] = medians["overlay N=8"] / medians["upstream"]
    _save()
    entry["forward_only"] = _bench("upstream", kwargs, f"bench-{mode}-forward", forward_only=True)
    if "overlay N=8" in medians and "forward_limit" in entry["forward_only"]:
        entry["limit_over_n8"] = entry["forward_only"]["forward_limit"] / medians["overlay N=8"]
    _save()


def _wanted() -> list[str]:
    return os.environ.get("CHECK_STAGES", "facts,parity,bench").split(",")


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    stages = [
        ("facts", stage_facts),
        ("smoke", stage_smoke),
        ("parity", stage_parity),
        ("bench eager", lambda: stage_bench("eager", {"enforce_eager": True}, ROUNDS)),
        ("bench graphs", lambda: stage_bench("cudagraphs", GRAPHS, ROUNDS)),
    ]
    log(f"device_check: budget {DEADLINE - START:.0f} s, stages {_wanted()}")
    for name, stage in stages:
        if name.split()[0] not in _wanted():
            continue
        if DEADLINE - time.monotonic() < 45:
            RESULTS.setdefault("skipped", []).append(name)
            log(f"{name}: skipped, out of time")
            continue
        start = time.monotonic()
        log(f"{name}: start")
        try:
            stage()
        except Exception:  # report and go on: each stage stands alone
            RESULTS.setdefault("stage_errors", {})[name] = traceback.format_exc()[-2000:]
            log(f"{name}: FAILED {traceback.format_exc()[-500:]}")
        RESULTS.setdefault("stage_seconds", {})[name] = round(time.monotonic() - start, 1)
        log(f"{name}: done in {time.monotonic() - start:.0f} s")
        _save()
    with tarfile.open(OUT / "logs.tar.gz", "w:gz") as tf:
        for path in sorted(WORK.glob("*.log")):
            tf.add(path, arcname=path.name)
    summary = {k: v for k, v in RESULTS.items() if k not in ("parity_runs", "settings")}
    print(json.dumps(summary, indent=1)[:8000])


if __name__ == "__main__":
    main()
