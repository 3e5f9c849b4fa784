"""The GPU check, run on the lent GPU machine by device_check.sh (see README.md here).

It checks the pinned release (vLLM 0.34.0: Model Runner V2, the only runner).
Stages, each time-boxed, each catching its own failure (the error tail goes into
the results) and writing $OUT/results.json as its jobs end:
  facts     the GPU, torch, Python and the relevant packages there
  parity    the parity engines of tests/support/parity.py through `vllm.LLM`
            (tests/support/generate.py): upstream (async scheduling on, the GPU
            default) is the oracle; overlay runs (PARITY_RUNS) are compared token
            for token with it: windows eager and under the runner's CUDA graphs,
            async on and off, chunked prefill, preemption, and EAGLE windows
            against upstream's EAGLE without windows
  bench     per model (CHECK_MODELS: the tiny Llama, and a Qwen3-0.6B-shaped
            random model built here) and mode (CHECK_MODES), one engine per build
            measures batch 32 and 128 (CHECK_BATCHES), 256 greedy tokens:
            upstream against overlay N = 1, 4, 8, 16 (CHECK_STEPS), CHECK_ROUNDS
            rounds in alternating order, then the forward-only limit (the decode
            forward or graph replay alone between device synchronizations)
  smoke     (only when asked) both builds import and name themselves
Both builds run the Python code of their CUDA wheels with the same settings
(GPU_LLM, ENV): no compiled vLLM kernels exist there (stub_kernels.py says why),
so the engine is kept on paths that need none: PyTorch-native custom ops and IR
ops, Triton attention, the Triton sampler, no DeepGEMM.
Progress lines go to stdout as each job ends, so a timeout shows how far it got.
CHECK_LOCAL=1 rehearses the whole script here on the CPU test bases (the suite's
venvs, CPU settings, small sizes; CHECK_LOCAL_BASE=-interpreter for the base with
drafters): it checks the script, not the GPU.
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
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
from harness.builds import MODEL_ARGS  # noqa: E402
from support.parity import ENGINES, SPEC_CASES, assert_same_outputs  # noqa: E402

from overlay.fuzz.configs import speculative_config  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/gpucheck")
LOCAL = os.environ.get("CHECK_LOCAL") == "1"
START = time.monotonic()
DEADLINE = START + float(os.environ.get("CHECK_BUDGET_S", "330"))
# Parity may use this share of the budget; the benchmark gets the rest.
PARITY_SHARE = float(os.environ.get("CHECK_PARITY_SHARE", "0.4"))
# One engine run's limit (an engine start and its cases; the interpreter base needs far more).
RUN_TIMEOUT_S = float(os.environ.get("CHECK_RUN_TIMEOUT_S", "300"))
# Benchmark rounds per mode (the builds alternate order each round).
ROUNDS = int(os.environ.get("CHECK_ROUNDS", "1"))

# The same engine settings for both builds, chosen so that no compiled vLLM
# kernel is reached (see the audit notes in README.md):
GPU_LLM = {
    "attention_backend": "TRITON_ATTN",  # no flash-attn/FlashInfer extension here
    "compilation_config": {"custom_ops": ["none"]},  # PyTorch-native CustomOps
    # RMSNorm dispatches through vLLM IR ops, whose CUDA default is the compiled
    # "vllm_c" kernel whenever Inductor is off; "native" is vLLM's own torch impl.
    "kernel_config": {"ir_op_priority": {"rms_norm": ["native"], "fused_add_rms_norm": ["native"],
                                         "gelu_and_mul_sparse": ["native"]}},
    "kv_cache_memory_bytes": 1 << 30,  # fixed: engines share the GPU, profiling would see each other
    # Only checked against free memory at start when kv_cache_memory_bytes is
    # set: the default (0.92) of the H200 fails for the later of parallel engines.
    "gpu_memory_utilization": 0.05,
}  # fmt: skip
ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # else the sampler imports FlashInfer (absent)
    "VLLM_USE_DEEP_GEMM": "0",  # the vendored DeepGEMM has no extension here; the warmup would probe it
    "VLLM_USE_LAYERNAME": "0",  # plain-str layer names in vLLM's custom ops (the torch >= 2.11 opaque type is
    #                             only for torch.compile; avoids an API that changed up to 2.14)
    "VLLM_CONFIDENTIAL_COMPUTE": "0",  # pins the NVML probe that could switch the UVA buffers off unseen
    "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",  # xgrammar's tvm-ffi would try to JIT a torch extension (nvcc)
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",  # no Inductor worker pools x 20 engines
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}
# Model Runner V2 captures its own FULL graphs of decode batches (no torch.compile).
GRAPHS = {"compilation_config": {"mode": 0, "custom_ops": ["none"], "cudagraph_mode": "FULL_DECODE_ONLY",
                                 "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128]},
          "enforce_eager": False}  # fmt: skip
# Benchmark modes: the runner's graphs; vLLM's default compilation (torch.compile and
# FULL_AND_PIECEWISE graphs, what a user gets; may not start on this torch); eager.
MODES = {"graphs": GRAPHS, "default": {"enforce_eager": False}, "eager": {"enforce_eager": True}}
TREES = {"upstream": "/tmp/up", "overlay": "/tmp/ov"}
MODEL = ROOT / ".gpu" / "model"
EAGLE = ROOT / ".gpu" / "eagle"
BIG_MODEL = Path("/tmp/gpucheck-models/qwen3-0.6b")
if LOCAL:  # the suite's CPU venvs and models, CPU settings, small sizes
    VENVS = ROOT / "build" / "venvs"
    BASE = os.environ.get("CHECK_LOCAL_BASE", "")  # "-interpreter": the base with drafters
    PYTHONS = {b: VENVS / f"{b}-0.34.0{BASE}" / "bin" / "python" for b in TREES}
    # one torch thread per engine: parallel engines on 2 cores otherwise crawl (OpenMP spin-waits)
    GPU_LLM, ENV = {}, {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    MODES = {"graphs": {}, "default": {}, "eager": {}}
    MODEL, EAGLE = ROOT / "build" / "models" / "tiny-llama", ROOT / "build" / "models" / "tiny-llama-eagle"
    BIG_MODEL = ROOT / "build" / "models" / "tiny-qwen3"
BENCH_MODELS = {"tiny": (MODEL, "float32"), "qwen3-0.6b": (BIG_MODEL, "float32" if LOCAL else "bfloat16")}
# One benchmark engine at a time: KV for batch 128 x 288 tokens of the Qwen3-0.6B shape (112 KiB a
# token in bfloat16: 4 GiB) without preemption; the parity engines' 1 GiB each would preempt.
BENCH_MEMORY = {} if LOCAL else {"kv_cache_memory_bytes": 8 << 30, "gpu_memory_utilization": 0.5}
BENCH_SIZES = {"batches": os.environ.get("CHECK_BATCHES", "4,8" if LOCAL else "32,128"),
               "out_len": 32 if LOCAL else 256, "reps": 1 if LOCAL else 3}  # fmt: skip

# (parity engine, run name) -> extra LLM kwargs of the overlay's run; the engine's
# upstream run (its oracle) has the same kwargs without num_scheduler_steps/async.
EAGLE_LLM = {"speculative_config": speculative_config("eagle", str(MODEL), {"eagle": EAGLE})}
PARITY_ENGINES = {  # name: (parity.ENGINES entry, kwargs both builds add, overlay runs)
    "llama": ("llama", {}, {"N=1": {"num_scheduler_steps": 1}, "N=4": {"num_scheduler_steps": 4},
                            "N=8": {"num_scheduler_steps": 8},
                            "N=8 async=off": {"num_scheduler_steps": 8, "async_scheduling": False}}),
    "llama-graphs": ("llama", GRAPHS if not LOCAL else {}, {"N=8": {"num_scheduler_steps": 8}}),
    "chunked": ("chunked", {}, {"N=8": {"num_scheduler_steps": 8},
                                "N=8 async=off": {"num_scheduler_steps": 8, "async_scheduling": False}}),
    "preempt": ("preempt", {}, {"N=8": {"num_scheduler_steps": 8},
                                "N=8 async=off": {"num_scheduler_steps": 8, "async_scheduling": False}}),
    "eagle": (None, EAGLE_LLM, {"N=4": {"num_scheduler_steps": 4},
                                "N=4 async=off": {"num_scheduler_steps": 4, "async_scheduling": False}}),
}  # fmt: skip
RESULTS: dict = {"settings": {"llm": GPU_LLM, "env": ENV, "modes": MODES, "local": LOCAL}}


def _t() -> str:
    return f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - START:.0f}s]"


def log(msg: str) -> None:
    print(f"{_t()} {msg}", flush=True)


def _save() -> None:
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=1))


def _env(build: str) -> dict:
    return {**os.environ, **ENV, **({} if LOCAL else {"PYTHONPATH": f"{TREES[build]}:/tmp/site"})}


def _python(build: str) -> str:
    return str(PYTHONS[build]) if LOCAL else sys.executable


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
        cmd = [_python(build), *map(str, args)]
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
    entry, both, _runs = PARITY_ENGINES[engine]
    kwargs, cases = ENGINES[entry][1:] if entry else ({}, SPEC_CASES)
    llm = {"model": str(MODEL), "dtype": "float32", "max_model_len": 512, "seed": 0, **GPU_LLM, "enforce_eager": True}
    return {"llm": {**llm, **kwargs, **both, **extra}, "cases": cases}


def _generate(build: str, engine: str, extra: dict, tag: str, deadline: float) -> dict:
    spec, out = WORK / f"{tag}-spec.json", WORK / f"{tag}-out.json"
    spec.write_text(json.dumps(_spec(engine, extra)))
    start = time.monotonic()
    args = [ROOT / "tests" / "support" / "generate.py", spec, out]
    rc, text = _run(build, args, tag, min(RUN_TIMEOUT_S, deadline - start))
    row = {"seconds": round(time.monotonic() - start, 1)}
    if rc != 0 or not out.exists():
        return {**row, "error": _why(rc, text)}
    # The overlay's startup line names the path; its window lines say that windows ran.
    path = [ln.split("Multi-step decode: ", 1)[1][:300] for ln in text.splitlines() if "Multi-step decode: " in ln]
    windows = [ln.split("Multi-step decode on Model Runner V2 ", 1)[1][:200] for ln in text.splitlines()
               if "Multi-step decode on Model Runner V2 (" in ln]  # fmt: skip
    return {**row, "result": json.loads(out.read_text()), "path": path[:1], "windows": windows[-1:]}


def stage_parity() -> None:
    deadline = START + PARITY_SHARE * (DEADLINE - START) if "bench" in _wanted() else DEADLINE
    engines = [e for e in os.environ.get("CHECK_ENGINES", ",".join(PARITY_ENGINES)).split(",") if e]
    jobs = {}
    for engine in engines:
        jobs[(engine, "upstream")] = ("upstream", engine, {})
        for name, extra in PARITY_ENGINES[engine][2].items():
            jobs[(engine, name)] = ("overlay", engine, extra)
    RESULTS["parity"] = parity = {}
    RESULTS["parity_runs"] = runs = {}
    done: dict = {}
    workers = int(os.environ.get("CHECK_PARALLEL", "2" if LOCAL else str(len(jobs))))  # 16 cores, 141 GB
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
    counters, oracle_counters = ours["counters"], theirs["counters"]
    row = {"engine_steps": counters.get("vllm:iteration_tokens_total_count", 0),
           "upstream_steps": oracle_counters.get("vllm:iteration_tokens_total_count", 0),
           "preemptions": counters.get("vllm:num_preemptions"),
           "upstream_preemptions": oracle_counters.get("vllm:num_preemptions"),
           "accepted_drafts": counters.get("vllm:spec_decode_num_accepted_tokens"),
           "upstream_accepted_drafts": oracle_counters.get("vllm:spec_decode_num_accepted_tokens"),
           "path": got["path"], "windows": got["windows"],
           "async": ours["async_scheduling"], "oracle_async": theirs["async_scheduling"]}  # fmt: skip
    try:
        assert_same_outputs(ours, theirs, engine, _spec(engine, {})["cases"])
        row["status"] = "identical"
    except AssertionError as e:
        row["status"] = "DIFFERENT"
        row["why"] = str(e)[:600]
    return row


def _bench(
    build: str, model: str, kwargs: dict, tag: str, forward_only: bool = False, extra_env: dict | None = None
) -> dict:
    path, dtype = BENCH_MODELS[model]
    llm = {**GPU_LLM, **BENCH_MEMORY, "dtype": dtype, **kwargs}
    sizes = [BENCH_SIZES["batches"], BENCH_SIZES["out_len"], BENCH_SIZES["reps"]]
    args = [ROOT / "benchmarks" / "offline_worker.py", path, json.dumps(llm), *sizes]
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if forward_only else dict(extra_env or {})
    start = time.monotonic()
    rc, text = _run(build, [*args, *(["--forward-only"] if forward_only else [])], tag, RUN_TIMEOUT_S, env)
    line = next((ln for ln in text.splitlines() if ln.startswith("RESULT ")), None)
    if rc == 0 and line:
        got = json.loads(line[7:])
        row = got.get("batches") or {BENCH_SIZES["batches"]: got}  # one size: offline_worker's flat result
    else:
        row = {"error": _why(rc, text, 1500)}
    row["seconds"] = round(time.monotonic() - start, 1)
    what = "; ".join(
        f"batch {b}: " + (f"forward {r['forward_ms']:.2f} ms" if forward_only else f"median {r['median']:.0f} tok/s")
        for b, r in row.items()
        if isinstance(r, dict)
    )
    log(f"bench {tag} ({row['seconds']} s): {what or row.get('error', '')[:300].replace(chr(10), ' | ')}")
    return row


def stage_bench(model: str, mode: str, rounds: int) -> None:
    """Upstream against the overlay's N values, each build one engine per round, then the forward alone.
    CHECK_STRUCTURED_EVERY=k also runs them with every k-th request under a grammar (offline_worker.py
    OFFLINE_STRUCTURED_EVERY): each build's tok/s beside its plain figure is what the masks cost it."""
    steps = [int(n) for n in os.environ.get("CHECK_STEPS", "8,1,16,4").split(",")]
    configs = {"upstream": ("upstream", {})} | {f"N={n}": ("overlay", {"num_scheduler_steps": n}) for n in steps}
    every = os.environ.get("CHECK_STRUCTURED_EVERY")
    if every:
        configs |= {f"{name} structured": (build, kw) for name, (build, kw) in configs.items()}
    runs: dict[str, list] = {name: [] for name in configs}
    RESULTS.setdefault("bench", {})[f"{model} {mode}"] = entry = {"kwargs": MODES[mode], "runs": runs,
                                                                  "structured_every": every}  # fmt: skip
    for r in range(rounds):
        for name in list(configs) if r % 2 == 0 else list(configs)[::-1]:
            if DEADLINE - time.monotonic() < 60:
                entry["incomplete"] = "out of time"
                break
            build, kw = configs[name]
            tag = f"bench-{model}-{mode}-{r}-{name.replace('=', '').replace(' ', '-')}"
            structured = {"OFFLINE_STRUCTURED_EVERY": every} if name.endswith("structured") else None
            runs[name].append(_bench(build, model, {**MODES[mode], **kw}, tag, extra_env=structured))
            _save()
    entry["forward_only"] = _bench("upstream", model, MODES[mode], f"bench-{model}-{mode}-forward", forward_only=True)
    entry["summary"] = _bench_summary(runs, entry["forward_only"])
    log(f"bench {model} {mode}: {json.dumps(entry['summary'])}")
    _save()


def _bench_summary(runs: dict[str, list], forward_only: dict) -> dict:
    """Per batch size: each N's median tok/s over upstream's, and the forward-only limit over N = 8's."""
    summary = {}
    for batch in BENCH_SIZES["batches"].split(","):
        medians = {name: statistics.median(r[batch]["median"] for r in rows)
                   for name, rows in runs.items() if rows and all(batch in r for r in rows)}  # fmt: skip
        row: dict = {"tok_s": {name: round(m) for name, m in medians.items()}}
        if "upstream" in medians:
            row["vs_upstream"] = {n: round(m / medians["upstream"], 3) for n, m in medians.items()
                                  if n != "upstream" and not n.endswith("structured")}  # fmt: skip
        # each build's tok/s with the structured share over its plain tok/s
        plain_of = {n: n.removesuffix(" structured") for n in medians if n.endswith(" structured")}
        row["structured_over_plain"] = {p: round(medians[n] / medians[p], 3)
                                        for n, p in plain_of.items() if p in medians}  # fmt: skip
        limit = forward_only.get(batch, {}).get("forward_limit")
        if limit and "N=8" in medians:
            row["forward_limit"], row["limit_over_n8"] = round(limit), round(limit / medians["N=8"], 3)
        summary[batch] = row
    return summary


def stage_models() -> None:
    """Build the Qwen3-0.6B-shaped model here (~1.2 GB: more than a call carries)."""
    if "qwen3-0.6b" not in _models() or LOCAL:
        return
    args = [ROOT / "tests" / "support" / "tiny_model.py", BIG_MODEL, *MODEL_ARGS["qwen3-0.6b"]]
    rc, text = _run("upstream", args, "build-qwen3-0.6b", 240)
    RESULTS["models"] = {"qwen3-0.6b": "built" if rc == 0 else _why(rc, text)}
    log(f"models: {RESULTS['models']}")


def _wanted() -> list[str]:
    return os.environ.get("CHECK_STAGES", "facts,parity,bench").split(",")


def _models() -> list[str]:
    return os.environ.get("CHECK_MODELS", "tiny,qwen3-0.6b").split(",")


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    stages = [("facts", stage_facts), ("smoke", stage_smoke), ("parity", stage_parity), ("bench models", stage_models)]
    for model in _models():
        for mode in os.environ.get("CHECK_MODES", "graphs").split(","):
            stages.append((f"bench {model} {mode}", lambda m=model, md=mode: stage_bench(m, md, ROUNDS)))
    log(f"device_check: budget {DEADLINE - START:.0f} s, stages {_wanted()}, local {LOCAL}")
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
