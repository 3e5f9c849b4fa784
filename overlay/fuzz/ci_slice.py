"""The fixed-seed slice the test run fuzzes (tests/real/test_fuzz.py), and how its batches ride on
the parity runs' engines (tests/real/conftest.py) where those have the same configuration."""

from __future__ import annotations

import json

from support.parity import engine_with

from overlay.fuzz.batches import batches_for, regressions
from overlay.fuzz.configs import CONFIGS, Config

# The README's test command runs these (tests/real/test_fuzz.py): both crashes of issue 18 with
# async on and off and in the small budget. Where a parity engine (tests/support/parity.py) has
# the same config, the slice's batches run on it after its cases (one engine start serves
# both): here every oracle and all but the draft-model overlay engine. The long run takes all.
CI_CONFIGS = ["default-N8", "default-N8-sync", "chunked-N16", "draft-N4-budget64"]
# On a release without multi-step windows: single steps with async scheduling on (patch
# 0003), with the regressions of issue 18.
CI_CONFIGS_SINGLE_STEP = ["default-N1"]
# On Model Runner V2 (vLLM 0.34.0): the windowed configs without drafts (the suite's CPU base,
# the standalone runner, has no drafters; windows with drafts are fuzzed by hand on the
# interpreter base, `--base interpreter`, docs/fuzzing.md), one where admitted requests join
# every window the budget allows (by default they join beside enough running requests only),
# and the single-step one, whose regressions check the runner that replaced patch 0010's file.
CI_CONFIGS_MRV2 = ["default-N8", "default-N8-sync", "chunked-N16", "join-N8", "default-N1"]
CI_SEED = 1800  # fixed: the slice is the same batches on every run
CI_PER_CONFIG = 40  # batches are cheap (~0.4 s); the engine starts are what the slice costs


def ci_configs() -> list[str]:
    """The slice's configurations for the release under test (tests/support/venvs.py)."""
    from support.venvs import windows_runner

    return {"v1": CI_CONFIGS, "mrv2": CI_CONFIGS_MRV2}.get(windows_runner(), CI_CONFIGS_SINGLE_STEP)


def ci_batches(name: str) -> list[dict]:
    """A CI configuration's batches: its regressions, then its random ones."""
    return regressions(name) + batches_for(CONFIGS[name], CI_SEED, CI_PER_CONFIG)


def parity_key(build: str, config: Config) -> tuple | None:
    """The parity run (build, engine, async mode, steps) with the engine ``config`` needs, if any."""
    engine = engine_with(config.model, config.llm)
    if engine is None or (build == "overlay" and config.drafter):
        return None
    if build == "upstream":
        return build, engine, "default", 1
    return build, engine, "off" if config.async_off else "default", config.steps


def slice_batches(key: tuple) -> list[dict]:
    """The CI slice's batches the parity run ``key`` runs after its cases (each once)."""
    batches = [b for name in ci_configs() if parity_key(key[0], CONFIGS[name]) == key for b in ci_batches(name)]
    return list({json.dumps(b, sort_keys=True): b for b in batches}.values())


def slice_results(key: tuple, outputs: dict, batches: list[dict]) -> dict:
    """``batches``' results from the outputs of parity run ``key`` (Runner.run's shape)."""
    ran = [json.dumps(b, sort_keys=True) for b in slice_batches(key)]
    return {"batches": [outputs["batches"][ran.index(json.dumps(b, sort_keys=True))] for b in batches],
            "failure": None}  # fmt: skip
