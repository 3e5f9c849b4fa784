# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Resolve and validate multi-step decode (`--num-scheduler-steps N`).

Multi-step decode must give exactly the tokens single-step decoding gives.
Options whose per-step state the window cannot reproduce are refused here, at
startup, with the reason, rather than silently degraded.
"""

import importlib.util
from typing import TYPE_CHECKING

import vllm.envs as envs
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config.vllm import VllmConfig

logger = init_logger(__name__)

# The spelling of the option in the V1 multi-step proposal, kept as an alias.
ADDITIONAL_CONFIG_KEY = "multi_step"
# Inner steps on the device (Model Runner V1:
# vllm/v1/worker/model_runner_v1_multi_step/device_window.py): on unless this
# additional_config key is false (then every window runs step by step). On
# Model Runner V2 it is read as BATCH_REUSE_KEY where that is not given.
DEVICE_WINDOW_KEY = "multi_step_device_window"
# Model Runner V2: a window's steps on StandaloneCPUModelRunner's kept batch
# (vllm/v1/worker/gpu/multi_step/kept_batch.py): on unless this key is false
# (then the runner's execute_model builds every step's batch).
BATCH_REUSE_KEY = "multi_step_batch_reuse"
# Model Runner V2: a window ends after the inner step in flight when a request
# arrives (vllm/v1/core/sched/arrivals.py): on unless this key is false (then
# an arrival waits for the windows in flight, as on Model Runner V1).
YIELD_KEY = "multi_step_yield"
# Model Runner V2: a schedule that admits requests is step 1 of a window, the
# admitted prompts' first tokens sampled there (vllm/v1/core/sched/multi_step.py,
# `join`). true (the default): where the running requests outnumber the admitted
# ones enough to pay for their first tokens' wait; "always": wherever the budget
# allows; false: never (such a schedule is a single step).
JOIN_KEY = "multi_step_join"
JOIN_MODES = {True: "auto", "always": "always", False: "off"}
# Model Runner V2: structured-output requests run in windows, the worker masking
# each inner step with its own copy of the request's grammar
# (vllm/v1/worker/gpu/multi_step/window_grammar.py): on unless this key is false
# (then a batch that holds one runs single steps). Not with drafts.
STRUCTURED_OUTPUT_KEY = "multi_step_structured_output"
# While a step runs, the engine core waits for its output parked, not spinning
# (vllm/v1/engine/engine_core_park.py): by default on CPU, where it was
# measured; true or false sets it on any device.
ENGINE_CORE_PARK_KEY = "multi_step_engine_core_parks"
# How many inner steps the device loop runs between looks at its alive mask.
# On a CPU a look reads a host tensor (no sync: a few microseconds a step, so
# every step); on an accelerator it is a host sync, so every 8 steps, the
# interval tpu-inference uses (not measured here: no accelerator was lent).
STOP_CHECK_KEY = "multi_step_stop_check_interval"
DEFAULT_STOP_CHECK_INTERVAL = {"cpu": 1}
DEFAULT_STOP_CHECK_INTERVAL_ACCELERATOR = 8
# The runner the V1 worker side of multi-step decode
# (vllm/v1/worker/model_runner_v1_multi_step/) drives. Where vLLM has no such
# runner (0.34.0 removed it), windows run on Model Runner V2
# (vllm/v1/worker/gpu/multi_step/), the only runner there.
V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
# Drafters whose inner-step drafts the window can feed back exactly
# (vllm/v1/worker/model_runner_v1_multi_step/ on Model Runner V1,
# vllm/v1/worker/gpu/multi_step/ on Model Runner V2); the others are untested
# in windows.
# EAGLE heads and MTP layers share one proposer; EAGLE-3 (auxiliary hidden
# states), suffix and ngram_gpu are untested in windows, so they stay refused.
SPEC_METHODS_IN_WINDOWS = ("ngram", "draft_model", "eagle", "mtp")


def _steps_from_additional_config(vllm_config: "VllmConfig") -> int | None:
    additional = vllm_config.additional_config
    if not isinstance(additional, dict) or ADDITIONAL_CONFIG_KEY not in additional:
        return None
    value = additional[ADDITIONAL_CONFIG_KEY]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"additional_config['{ADDITIONAL_CONFIG_KEY}'] must be an integer "
            f">= 1 (the number of decode steps per scheduler call), got {value!r}."
        )
    return value


def multi_step_requested(vllm_config: "VllmConfig") -> bool:
    """Whether more than one decode step per scheduler call is asked for, by the
    option or the alias. VllmConfig reads it (to pick the V1 runner) before
    resolve_multi_step applies the alias."""
    alias = _steps_from_additional_config(vllm_config) or 1
    return max(vllm_config.scheduler_config.num_scheduler_steps, alias) > 1


def _bool_option(additional: dict, key: str, default: bool = True) -> bool:
    value = additional.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(
            f"additional_config['{key}'] must be true or false, got {value!r}."
        )
    return value


def _additional(vllm_config: "VllmConfig") -> dict:
    additional = vllm_config.additional_config
    return additional if isinstance(additional, dict) else {}


def batch_reuse_enabled(vllm_config: "VllmConfig") -> bool:
    """Whether Model Runner V2 windows may keep the step before's batch
    (BATCH_REUSE_KEY, else its alias DEVICE_WINDOW_KEY). Raises ValueError
    naming the key for a value of the wrong type."""
    additional = _additional(vllm_config)
    key = BATCH_REUSE_KEY if BATCH_REUSE_KEY in additional else DEVICE_WINDOW_KEY
    return _bool_option(additional, key)


def yield_enabled(vllm_config: "VllmConfig") -> bool:
    """Whether windows yield to arriving requests (YIELD_KEY). Raises
    ValueError naming the key for a value of the wrong type."""
    return _bool_option(_additional(vllm_config), YIELD_KEY)


def join_mode(vllm_config: "VllmConfig") -> str:
    """When admitted requests join windows (JOIN_KEY): "auto", "always" or
    "off". Raises ValueError for any other value."""
    value = _additional(vllm_config).get(JOIN_KEY, True)
    # bool first: 1 == True would otherwise pass as a key of JOIN_MODES
    if not isinstance(value, bool | str) or value not in JOIN_MODES:
        raise ValueError(
            f"additional_config['{JOIN_KEY}'] must be true, false or "
            f'"always", got {value!r}.'
        )
    return JOIN_MODES[value]


def structured_output_enabled(vllm_config: "VllmConfig") -> bool:
    """Whether windows hold structured-output requests (STRUCTURED_OUTPUT_KEY).
    Raises ValueError naming the key for a value of the wrong type."""
    return _bool_option(_additional(vllm_config), STRUCTURED_OUTPUT_KEY)


def engine_core_parks(vllm_config: "VllmConfig") -> bool:
    """Whether the engine core waits for a step's output parked
    (ENGINE_CORE_PARK_KEY): never without windows. Raises ValueError naming
    the key for a value of the wrong type."""
    if vllm_config.scheduler_config.num_scheduler_steps <= 1:
        return False
    measured = vllm_config.device_config.device_type == "cpu"
    return _bool_option(_additional(vllm_config), ENGINE_CORE_PARK_KEY, measured)


def device_window_options(vllm_config: "VllmConfig") -> tuple[bool, int]:
    """Whether inner steps may run on the device, and the stop-check interval.

    Raises ValueError naming the key for a value of the wrong type.
    """
    additional = _additional(vllm_config)
    enabled = _bool_option(additional, DEVICE_WINDOW_KEY)
    device_type = vllm_config.device_config.device_type
    interval = additional.get(
        STOP_CHECK_KEY,
        DEFAULT_STOP_CHECK_INTERVAL.get(
            device_type, DEFAULT_STOP_CHECK_INTERVAL_ACCELERATOR
        ),
    )
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(
            f"additional_config['{STOP_CHECK_KEY}'] must be an integer >= 1 (inner "
            f"steps between checks for a window's end), got {interval!r}."
        )
    return enabled, interval


def windows_on_v1_runner() -> bool:
    """Whether windows run on Model Runner V1 (vLLM up to 0.33.0) rather than on
    Model Runner V2."""
    return importlib.util.find_spec(V1_RUNNER_MODULE) is not None


def _unsupported_reasons(vllm_config: "VllmConfig") -> list[str]:
    """Options multi-step decode cannot run exactly with, on the runner it uses."""
    on_runner = (
        _v1_runner_reasons if windows_on_v1_runner() else _model_runner_v2_reasons
    )
    return [*_common_reasons(vllm_config), *on_runner(vllm_config)]


def _common_reasons(vllm_config: "VllmConfig") -> list[str]:
    reasons = []
    model_config = vllm_config.model_config
    if model_config is not None and model_config.runner_type == "pooling":
        reasons.append("pooling models (multi-step decode is for generation)")
    if model_config is not None and model_config.is_encoder_decoder:
        reasons.append("encoder-decoder models")
    if model_config is not None and (
        model_config.is_hybrid or model_config.is_attention_free
    ):
        # Their recurrent state advances per scheduled chunk and prefix
        # caching aligns it to blocks; windows are untested against both.
        reasons.append("hybrid and attention-free (Mamba-style) models")
    if vllm_config.aux_output_config.enabled:
        reasons.append("auxiliary outputs such as routed experts (per step)")
    parallel_config = vllm_config.parallel_config
    if parallel_config.pipeline_parallel_size > 1:
        reasons.append("pipeline parallelism")
    if parallel_config.data_parallel_size > 1:
        reasons.append("data parallelism (ranks would run different step counts)")
    if vllm_config.kv_transfer_config is not None:
        reasons.append("KV transfer connectors")
    return reasons


def _v1_runner_reasons(vllm_config: "VllmConfig") -> list[str]:
    reasons = _spec_method_reasons(vllm_config)
    if getattr(envs, "VLLM_USE_V2_MODEL_RUNNER", None):
        reasons.append("VLLM_USE_V2_MODEL_RUNNER=1 (multi-step runs on the V1 runner)")
    if vllm_config.attention_config.hisparse_config is not None:
        reasons.append("HiSparse attention (needs the V2 model runner)")
    if getattr(vllm_config, "watermark_config", None) is not None:
        reasons.append("watermarking (needs the V2 model runner)")
    return reasons


def _model_runner_v2_reasons(vllm_config: "VllmConfig") -> list[str]:
    """What windows on Model Runner V2 (vllm/v1/worker/gpu/multi_step/) do not
    run yet: each is per-step state the window has not been checked against."""
    reasons = _model_runner_v2_spec_reasons(vllm_config)
    model_config = vllm_config.model_config
    if model_config is not None and model_config.return_sampling_mask:
        reasons.append("return_sampling_mask (merged per window: not written yet)")
    if vllm_config.attention_config.hisparse_config is not None:
        reasons.append("HiSparse attention (untested in windows)")
    if getattr(vllm_config, "watermark_config", None) is not None:
        reasons.append("watermarking (untested in windows)")
    if vllm_config.parallel_config.enable_eplb:
        # EPLB counts expert loads after each of the runner's whole steps; a
        # window's inner steps are its forward and sampler only.
        reasons.append("expert-parallel load balancing (EPLB steps per runner step)")
    return reasons


# SpeculativeConfig fields (vLLM 0.34.0) that windows on Model Runner V2 need at
# their defaults: each changes a step's drafts or their verification from what
# was scheduled, and none has run in windows. Checked against SpeculativeConfig
# by tests/v1/worker/test_multi_step_window.py.
SPEC_DEFAULTS_IN_MODEL_RUNNER_V2_WINDOWS = {
    "enable_adaptive_verification": False,  # drafts reallocated on the device
    "num_speculative_tokens_per_batch_size": None,  # k chosen per schedule
    "rejection_sample_method": "standard",  # synthetic, block, fly
    "draft_sample_method": "greedy",  # drafts sampled at random
    "parallel_drafting": None,
}


def _spec_method_reasons(vllm_config: "VllmConfig") -> list[str]:
    speculative_config = vllm_config.speculative_config
    if speculative_config is None or (
        speculative_config.method in SPEC_METHODS_IN_WINDOWS
    ):
        return []
    return [
        f"{speculative_config.method} speculative decoding (windows support "
        + " and ".join(SPEC_METHODS_IN_WINDOWS)
        + ")"
    ]


def _model_runner_v2_spec_reasons(vllm_config: "VllmConfig") -> list[str]:
    """Speculative settings whose drafts windows on Model Runner V2 cannot keep
    as single steps keep them: drafters not run in windows, and the ones that
    change a step's draft count or verification from what it scheduled."""
    speculative_config = vllm_config.speculative_config
    if speculative_config is None:
        return []
    reasons = _spec_method_reasons(vllm_config)
    for name, default in SPEC_DEFAULTS_IN_MODEL_RUNNER_V2_WINDOWS.items():
        value = getattr(speculative_config, name, default)
        if value not in (default, False):
            reasons.append(f"speculative_config {name}={value!r}")
    return reasons


def runner_async_scheduling(vllm_config: "VllmConfig") -> bool:
    """Whether the model runner takes its async path (sampled tokens stay on
    the device, host history holds placeholders).

    Windows with drafts need each step's accepted tokens on the host. Under
    async scheduling the engine still plans step t+1 while step t runs, but
    the runner keeps its synchronous path, and the worker corrects what the
    scheduler planned optimistically
    (vllm/v1/worker/model_runner_v1_multi_step/spec_window.py).
    """
    scheduler_config = vllm_config.scheduler_config
    return bool(scheduler_config.async_scheduling) and not (
        scheduler_config.num_scheduler_steps > 1
        and vllm_config.speculative_config is not None
    )


def resolve_multi_step(vllm_config: "VllmConfig") -> None:
    """Apply the additional_config alias, then refuse unsupported combinations."""
    scheduler_config = vllm_config.scheduler_config
    alias = _steps_from_additional_config(vllm_config)
    if alias is not None:
        steps = scheduler_config.num_scheduler_steps
        if steps not in (1, alias):
            raise ValueError(
                f"--num-scheduler-steps {steps} and additional_config"
                f"['{ADDITIONAL_CONFIG_KEY}']={alias} disagree; set one of them."
            )
        scheduler_config.num_scheduler_steps = alias

    steps = scheduler_config.num_scheduler_steps
    if steps == 1:
        return
    device_window, stop_check_interval = device_window_options(vllm_config)
    reasons = _unsupported_reasons(vllm_config)
    if reasons:
        raise ValueError(
            f"--num-scheduler-steps {steps} cannot be combined with "
            + "; ".join(reasons)
            + ". Use --num-scheduler-steps 1 for these."
        )
    if not windows_on_v1_runner():
        if engine_core_parks(vllm_config):  # a value of the wrong type fails here
            logger.info(
                "Multi-step decode: the engine core waits for a step's output "
                "parked, not spinning (%s: false keeps upstream's wait).",
                ENGINE_CORE_PARK_KEY,
            )
        _log_model_runner_v2_windows(
            vllm_config,
            steps,
            batch_reuse_enabled(vllm_config),
            yield_enabled(vllm_config),
            join_mode(vllm_config),
            structured_output_enabled(vllm_config),
        )
        return
    logger.info(
        "Multi-step decode: up to %d decode steps per scheduler call "
        "(async scheduling %s; inner steps on the device %s).",
        steps,
        "on" if scheduler_config.async_scheduling else "off",
        f"where the batch allows, stop check every {stop_check_interval}"
        if device_window
        else "off",
    )


# Device types on which windows on Model Runner V2 have run (README, "Supported
# releases"): elsewhere they start, with a warning that says so.
MODEL_RUNNER_V2_WINDOWS_RAN_ON = ("cpu",)


JOIN_LOG = {
    "auto": "admitted requests join a window where enough requests run beside them",
    "always": f'admitted requests join a window ({JOIN_KEY}: "always")',
    "off": f"a schedule that admits requests is a single step ({JOIN_KEY}: false)",
}


def _log_model_runner_v2_windows(
    vllm_config: "VllmConfig",
    steps: int,
    batch_reuse: bool,
    yields: bool,
    joins: str,
    grammars: bool,
) -> None:
    additional = _additional(vllm_config)
    if DEVICE_WINDOW_KEY in additional and BATCH_REUSE_KEY not in additional:
        logger.info(
            "additional_config['%s'] is read as '%s' on Model Runner V2.",
            DEVICE_WINDOW_KEY,
            BATCH_REUSE_KEY,
        )
    device_type = vllm_config.device_config.device_type
    speculative_config = vllm_config.speculative_config
    if speculative_config is not None:
        inner = (
            "the runner's own execute_model and sample_tokens, verifying "
            f"{speculative_config.method} drafts"
        )
    elif device_type == "cpu" and batch_reuse:
        # vllm/v1/worker/gpu/multi_step/kept_batch.py; the window's log line
        # says how many inner steps took it.
        inner = (
            "the step before's batch refreshed by the runner's own pieces on "
            "StandaloneCPUModelRunner (else the runner's execute_model), then "
            "its sampler"
        )
    else:
        inner = "the runner's own execute_model and sampler"
    if speculative_config is not None:
        structured = "a batch with structured-output requests runs single steps"
    elif grammars:
        structured = (
            "structured-output requests run in windows, each inner step masked "
            "by the worker's copy of their grammar"
        )
    else:
        structured = (
            "a batch with structured-output requests runs single steps "
            f"({STRUCTURED_OUTPUT_KEY}: false)"
        )
    logger.info(
        "Multi-step decode: up to %d decode steps per scheduler call on Model "
        "Runner V2, each inner step %s (async scheduling %s; a window %s; "
        "%s; %s).",
        steps,
        inner,
        "on" if vllm_config.scheduler_config.async_scheduling else "off",
        "yields to a request that arrives while it runs"
        if yields
        else f"runs whole when a request arrives ({YIELD_KEY}: false)",
        JOIN_LOG[joins],
        structured,
    )
    if device_type not in MODEL_RUNNER_V2_WINDOWS_RAN_ON:
        logger.warning(
            "Multi-step decode on Model Runner V2 has not run on %s devices in "
            "vllm-overlay's tests (only on %s): check its output against "
            "--num-scheduler-steps 1 before relying on it.",
            device_type,
            ", ".join(MODEL_RUNNER_V2_WINDOWS_RAN_ON),
        )
