"""Shims of the CPU test bases of tests/support/cpu_bases.py, outside every file of vLLM.

A base wheel carries this package and ``vllm_cpu_base_shims.pth``, whose one
line, run by ``site`` at every interpreter start in the venv (engine and worker
processes included), is ``import vllm_cpu_base_shims;
vllm_cpu_base_shims.install("<flavor>")``. ``install`` sets the base's
environment defaults and puts an import hook first on ``sys.meta_path``; the
hook changes modules as they are imported, never a file on disk. So the overlay
wheel, which lays the patched vLLM files over the base (overlay/wheel.py copies
members outside ``vllm/`` as they are), runs under the same shims as the
unpatched base (the oracle).

The named shims, per flavor:

standalone
  ``x86_without_triton``: vllm/platforms/cpu.py as compiled at import, with two
  exact lines changed (each must occur once, or the import fails naming the
  shim): the check that x86 needs Triton (triton-cpu) no longer raises, and
  ``uses_standalone_cpu_model_runner`` drops its "not on x86" condition, so x86
  without Triton takes vLLM's standalone runner (vllm/v1/worker/cpu/), as
  non-x86 CPUs do upstream.
  ``standalone_ops``: after ``CpuPlatform.import_kernels`` (which loads the CPU
  wheel's ``_C``), the ops library built from the release's own csrc/cpu sources
  (``_C_standalone.so`` beside this file) is loaded; it registers the runner's
  ops that the older wheel lacks in the ``_C`` namespace.
interpreter
  ``interpreter_is_triton``: after vllm/triton_utils/importing.py has run its
  driver checks (which find no active driver), ``HAS_TRITON`` is set True when
  ``TRITON_INTERPRET=1`` (set here by default), so x86 takes its MRV2 runner
  (``CPUModelRunner``) with every Triton kernel run by Triton's interpreter.
  ``interpreter_bool_masks``: a mask of dtype other than bool (``scalar_bool &
  block_bool`` comes out int32 in the interpreter) is cast to bool before a
  masked load or store, which reject it.
  ``interpreter_range_tensors``: ``tl.range`` yields int32 (int64 past int32)
  scalar tensors, as compiled Triton's induction variable is, not Python ints,
  on which kernels' ``.to()`` fails.
both
  ``report_runner``: the CPU worker logs which model runner it built
  ("vllm_cpu_base_shims: model runner: <class> (<module>)").

Environment defaults (``os.environ.setdefault``, so a caller's value wins):
``VLLM_CACHE_ROOT`` = ``<venv>/vllm-cache`` (each base venv its own compile
cache); for interpreter, ``TRITON_INTERPRET=1``. To check what a shim is
needed for: ``VLLM_CPU_BASE_SHIMS=off`` disables every one (and the defaults),
``VLLM_CPU_BASE_SHIMS_SKIP=name,name`` the named ones.
"""

from __future__ import annotations

import os
import sys

FLAVORS = ("standalone", "interpreter")
OPS_LIBRARY = "_C_standalone.so"
# What the ops library must register (cpu_bases.py STANDALONE_OPS; checked after loading).
STANDALONE_OPS = (
    "gather_block_table_cpu", "compute_slot_mapping_cpu", "prepare_prefill_inputs_cpu",
    "get_prompt_logprobs_token_ids_cpu", "prepare_pos_seq_lens_cpu", "prepare_mrope_positions_cpu",
    "combine_sampled_and_draft_tokens_cpu", "post_update_cpu", "gumbel_sample_cpu", "apply_logit_bias_cpu",
)  # fmt: skip

# vllm/platforms/cpu.py lines the standalone flavor changes: (shim, old, new); same line count.
CPU_PY_EDITS = (
    ("x86_without_triton",
     "        if cls.get_cpu_architecture() == CpuArchEnum.X86 and not HAS_TRITON:\n"
     '            raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")\n',
     "        if False:  # vllm_cpu_base_shims x86_without_triton: x86 runs without Triton\n"
     '            raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")\n'),
    ("x86_without_triton",
     "        return not HAS_TRITON and cls.get_cpu_architecture() != CpuArchEnum.X86\n",
     "        return not HAS_TRITON  # vllm_cpu_base_shims x86_without_triton: x86 too\n"),
)  # fmt: skip

flavor: str | None = None
_ops_loaded = False


class ShimError(RuntimeError):
    pass


def install(name: str) -> None:
    """Set the base's environment defaults and hook the imports (once per process)."""
    global flavor
    if flavor is not None or os.environ.get("VLLM_CPU_BASE_SHIMS", "").lower() in ("off", "0"):
        return
    if name not in FLAVORS:
        raise ShimError(f"vllm_cpu_base_shims: unknown flavor {name!r} (known: {FLAVORS})")
    flavor = name
    skip = set(filter(None, os.environ.get("VLLM_CPU_BASE_SHIMS_SKIP", "").split(",")))
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(sys.prefix, "vllm-cache"))
    shims = {"vllm.v1.worker.cpu_worker": [(), [_report_runner]]}
    if name == "standalone":
        shims["vllm.platforms.cpu"] = [CPU_PY_EDITS, [_standalone_ops]]
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        shims["vllm.triton_utils.importing"] = [(), [_interpreter_is_triton]]
        shims["triton.runtime.interpreter"] = [(), [_interpreter_bool_masks, _interpreter_range_tensors]]
    hooks = {}
    for module, (edits, after) in shims.items():
        edits = tuple(e for e in edits if e[0] not in skip)
        after = tuple(f for f in after if f.__name__.removeprefix("_") not in skip)
        if edits or after:
            hooks[module] = (edits, after)
    sys.meta_path.insert(0, _Finder(hooks))


class _Finder:
    """Finds the hooked modules as the path finder does, with a loader that applies the shims."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.hooks:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "get_source"):
            return spec
        edits, after = self.hooks[fullname]
        spec.loader = _Loader(spec.loader, edits, after)
        return spec


class _Loader:
    def __init__(self, inner, edits, after):
        self.inner, self.edits, self.after = inner, edits, after

    def __getattr__(self, name):  # get_source, get_filename, ...: the file's own
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        if self.edits:
            name = module.__name__
            source = edited(name, self.inner.get_source(name), self.edits)
            exec(compile(source, self.inner.get_filename(name), "exec", dont_inherit=True), module.__dict__)
        else:
            self.inner.exec_module(module)
        for shim in self.after:
            shim(module)


def edited(module: str, source: str, edits) -> str:
    """``source`` with each (shim, old, new) edit made; each ``old`` must occur exactly once."""
    for shim, old, new in edits:
        if source.count(old) != 1:
            raise ShimError(
                f"vllm_cpu_base_shims {shim}: {module} has {source.count(old)} copies of the line(s) "
                f"it changes, not 1 (a patch changed them?):\n{old}"
            )
        assert old.count("\n") == new.count("\n")  # line numbers stay the file's
        source = source.replace(old, new)
    return source


def _log(message: str, *args) -> None:
    import logging

    logging.getLogger("vllm.cpu_base_shims").info("vllm_cpu_base_shims: " + message, *args)


def _standalone_ops(module) -> None:
    """standalone_ops: the release's standalone-runner ops, after the CPU wheel's _C."""
    platform = module.CpuPlatform
    original = platform.import_kernels.__func__

    def import_kernels(cls) -> None:
        original(cls)
        load_standalone_ops()

    platform.import_kernels = classmethod(import_kernels)


def load_standalone_ops() -> None:
    global _ops_loaded
    if _ops_loaded:
        return
    import torch

    path = os.path.join(os.path.dirname(__file__), OPS_LIBRARY)
    if not os.path.exists(path):
        raise ShimError(f"vllm_cpu_base_shims standalone_ops: {path} is missing from the base wheel")
    torch.ops.load_library(path)
    missing = [op for op in STANDALONE_OPS if not hasattr(torch.ops._C, op)]
    if missing:
        raise ShimError(f"vllm_cpu_base_shims standalone_ops: {path} did not register {missing}")
    _ops_loaded = True


def _interpreter_is_triton(module) -> None:
    """interpreter_is_triton: Triton's interpreter counts as a working Triton."""
    if os.environ.get("TRITON_INTERPRET") == "1" and not module.HAS_TRITON:
        from importlib.util import find_spec

        if find_spec("triton") is None:
            raise ShimError("vllm_cpu_base_shims interpreter_is_triton: Triton is not installed")
        module.HAS_TRITON = True
        # A warning, as vLLM's "Disabling Triton" just before it: vLLM's logging is not set up yet.
        module.logger.warning("vllm_cpu_base_shims interpreter_is_triton: Triton's interpreter "
                              "(TRITON_INTERPRET=1) counts as Triton: HAS_TRITON = True")  # fmt: skip


def _interpreter_bool_masks(interp) -> None:
    """interpreter_bool_masks: masked loads and stores take any mask as bool."""
    import numpy as np

    builder = interp.InterpreterBuilder

    def as_bool(mask):
        if mask is None or mask.data.dtype == np.bool_:
            return mask
        return interp.TensorHandle(mask.data.astype(np.bool_), interp.tl.int1)

    load, store = builder.create_masked_load, builder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, as_bool(mask), cache_policy)

    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store


def _interpreter_range_tensors(interp) -> None:
    """interpreter_range_tensors: ``tl.range`` yields scalar tensors, as compiled Triton's does."""
    import numpy as np

    tl, patch_core = interp.tl, interp._patch_lang_core

    def _patch_lang_core(lang, scope):
        patch_core(lang, scope)
        python_range = lang.range  # the interpreter's: Python ints

        def tensor_range(arg1, arg2=None, step=None, **kwargs):
            wide = any(isinstance(a, tl.tensor) and a.dtype == tl.int64 for a in (arg1, arg2, step))
            for i in python_range(arg1, arg2, step, **kwargs):
                dtype = tl.int64 if wide or not -(2**31) <= i < 2**31 else tl.int32
                np_dtype = np.int64 if dtype == tl.int64 else np.int32
                yield tl.tensor(interp.TensorHandle(np.array([i], dtype=np_dtype), dtype), dtype)

        scope.set_attr(lang, "range", tensor_range)

    interp._patch_lang_core = _patch_lang_core


def _report_runner(module) -> None:
    """report_runner: the CPU worker names the model runner it built."""
    worker = module.CPUWorker
    original = worker.init_device

    def init_device(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        runner = type(getattr(self, "model_runner", None))
        _log("model runner: %s (%s), %s base", runner.__name__, runner.__module__, flavor)
        return result

    worker.init_device = init_device
