"""The fuzzer's engine configurations: each an overlay engine and the upstream engine that is its
oracle (docs/fuzzing.md lists them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from support.parity import BASE, CHUNKED, NGRAM, PREEMPT


@dataclass(frozen=True)
class Config:
    """One overlay engine and the upstream engine that is its oracle."""

    name: str
    model: str  # "llama" or "qwen3" (tests/support/tiny_model.py)
    llm: dict  # LLM kwargs beyond BASE, shared with the oracle
    steps: int  # --num-scheduler-steps
    async_off: bool = False  # True: async scheduling forced off in the overlay
    # Speculative decoding in the overlay only: "draft_model" (the target as its own
    # draft), "ngram", "eagle" (tests/support/tiny_eagle.py's head) or "mtp" (the
    # "mimo" target's own MTP layer). The oracle runs without drafts: upstream's own
    # draft-model runs disagree run to run on CPU, and its ngram runs die on its
    # top-k bug (patch 0009); without drafts it is exact for greedy requests.
    drafter: str | None = None
    seeded_random: bool = True  # False where upstream itself cannot run them
    shared_prefix: bool = False
    structured: bool = True
    # No min_p or logit_bias: upstream refuses both with drafts (True for the
    # draft-model configs, and for those that share their batches and oracle).
    draft_params: bool = False
    # The overlay's multi_step_join (None: its default; "always": every schedule that
    # admits requests is a window where the budget allows, so joins run in every batch).
    join: str | None = None

    @property
    def family(self) -> str:
        """Configs of one family share their oracle engine and their batches."""
        keys = (self.model, self.llm, self.seeded_random, self.shared_prefix, self.structured,
                self.draft_params)  # fmt: skip
        return json.dumps(keys, sort_keys=True)

    def oracle_llm(self, model: str) -> dict:
        return {**BASE, **self.llm, "model": model}

    def overlay_llm(self, models: dict[str, Path]) -> dict:
        llm = self.oracle_llm(str(models[self.model]))
        if self.drafter is not None:
            llm["speculative_config"] = speculative_config(self.drafter, llm["model"], models)
        if self.steps != 1:
            llm["num_scheduler_steps"] = self.steps
        if self.async_off:
            llm["async_scheduling"] = False
        if self.join is not None:
            llm["additional_config"] = {"multi_step_join": self.join}
        return llm


def speculative_config(drafter: str, target: str, models: dict[str, Path]) -> dict:
    """The overlay's speculative_config for ``drafter`` (k = 3 where there is a choice)."""
    if drafter == "ngram":
        return NGRAM
    config: dict = {"method": drafter, "num_speculative_tokens": 3}
    if drafter == "draft_model":
        config["model"] = target
    elif drafter == "eagle":
        config["model"] = str(models["eagle"])
    return config  # mtp: the target's own MTP layer, no draft model


def _configs() -> dict[str, Config]:
    # No seeded random requests: upstream 0.32 on CPU dies on a seeded partial
    # prefill chunk. The draft-model configs share these batches.
    chunked = {"seeded_random": False, "structured": False, "draft_params": True}
    configs = [
        Config("default-N1", "llama", {}, 1),
        Config("default-N2", "llama", {}, 2),
        Config("default-N4-sync", "llama", {}, 4, async_off=True),
        Config("default-N8", "llama", {}, 8),
        Config("default-N8-sync", "llama", {}, 8, async_off=True),
        Config("default-N16", "llama", {}, 16),
        Config("join-N8", "llama", {}, 8, join="always"),
        Config("chunked-N4", "llama", CHUNKED, 4, **chunked),
        Config("chunked-N8-sync", "llama", CHUNKED, 8, async_off=True, **chunked),
        Config("chunked-N16", "llama", CHUNKED, 16, **chunked),
        Config("preempt-N8", "llama", PREEMPT, 8),
        Config("preempt-N4-sync", "llama", PREEMPT, 4, async_off=True),
        Config("preempt-N16", "llama", PREEMPT, 16),
        Config("prefix-N8", "llama", {"enable_prefix_caching": True}, 8, shared_prefix=True),
        Config("prefix-N3-sync", "llama", {"enable_prefix_caching": True}, 3, async_off=True, shared_prefix=True),
        Config("prefix-N16", "llama", {"enable_prefix_caching": True}, 16, shared_prefix=True),
        Config("maxlen96-N8", "llama", {"max_model_len": 96}, 8),
        Config("maxlen96-N5-sync", "llama", {"max_model_len": 96}, 5, async_off=True),
        Config("ngram-N4", "llama", {}, 4, drafter="ngram", structured=False, draft_params=True),
        Config("ngram-N1", "llama", {}, 1, drafter="ngram", structured=False, draft_params=True),
        Config("draft-N4-budget64", "llama", CHUNKED, 4, drafter="draft_model", **chunked),
        Config("draft-N2", "llama", {}, 2, drafter="draft_model", structured=False, draft_params=True),
        Config("eagle-N8", "llama", {}, 8, drafter="eagle", structured=False, draft_params=True),
        Config("eagle-N4-sync", "llama", {}, 4, async_off=True, drafter="eagle", structured=False, draft_params=True),
        Config("eagle-preempt-N4", "llama", PREEMPT, 4, drafter="eagle", structured=False, draft_params=True),
        # Windows whose drafts run into max_model_len: each step verifies fewer drafts where the
        # window's positions end (a single-step scheduler trims them there too).
        Config(
            "eagle-maxlen96-N4", "llama", {"max_model_len": 96}, 4, drafter="eagle", structured=False, draft_params=True
        ),
        Config("eagle-N1", "llama", {}, 1, drafter="eagle", structured=False, draft_params=True),
        Config("mtp-N1", "mimo", {}, 1, drafter="mtp", structured=False, draft_params=True),
        Config("mtp-N4", "mimo", {}, 4, drafter="mtp", structured=False, draft_params=True),
        # Structured requests on the other backend vLLM ships (an engine holds one backend)
        Config("guidance-N8", "llama", {"structured_outputs_config": {"backend": "guidance"}}, 8),
        Config("qwen3-N8", "qwen3", {}, 8),
        Config("qwen3-N4-sync", "qwen3", {}, 4, async_off=True),
        Config("qwen3-N16", "qwen3", {}, 16),
    ]
    return {c.name: c for c in configs}


CONFIGS = _configs()
