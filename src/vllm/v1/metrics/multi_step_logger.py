# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode on /metrics and in the periodic log: how many generated
tokens windows made, and for the rest why their step ran single.

    vllm:multi_step_generation_tokens_total{reason="window"}    tokens made in windows
    vllm:multi_step_generation_tokens_total{reason="arrival"}   ... in single steps
        that admitted new requests; likewise "prefill", "structured_output",
        "resumable", "token_budget" (SingleStepReason)
    vllm:multi_step_windows_total            windows run
    vllm:multi_step_windows_yielded_total    windows ended early for an arrival

Labelled with model_name and engine as vLLM's own counters are. The counts
come from the scheduler (SchedulerStats.multi_step).
"""

from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter

from vllm.logger import init_logger
from vllm.v1.metrics.loggers import AggregateStatLoggerBase
from vllm.v1.metrics.multi_step_stats import WINDOW, MultiStepStats, SingleStepReason
from vllm.v1.metrics.utils import create_metric_per_engine

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

logger = init_logger(__name__)

METRIC_PREFIX = "vllm:multi_step_"
REASONS = (WINDOW, *(reason.value for reason in SingleStepReason))


class MultiStepStatLogger(AggregateStatLoggerBase):
    """Counters per engine, and one log line per engine at each periodic log
    that follows new tokens."""

    def __init__(
        self, vllm_config: "VllmConfig", engine_indexes: list[int] | None = None
    ) -> None:
        self.engine_indexes = engine_indexes or [0]
        _unregister_earlier()
        labelnames = ["model_name", "engine"]
        model_name = vllm_config.model_config.served_model_name
        labelvalues: dict[int, list[object]] = {
            idx: [model_name, str(idx)] for idx in self.engine_indexes
        }
        tokens = Counter(
            name=METRIC_PREFIX + "generation_tokens",
            documentation=(
                "Generated tokens by the step that made them: reason='window' "
                "for multi-step decode windows, else why the step ran single "
                "(arrival, prefill, structured_output, resumable, token_budget)."
            ),
            labelnames=labelnames + ["reason"],
        )
        self.tokens = {
            reason: create_metric_per_engine(
                tokens, {i: [*v, reason] for i, v in labelvalues.items()}
            )
            for reason in REASONS
        }
        self.windows = create_metric_per_engine(
            Counter(
                name=METRIC_PREFIX + "windows",
                documentation="Multi-step decode windows run.",
                labelnames=labelnames,
            ),
            labelvalues,
        )
        self.windows_yielded = create_metric_per_engine(
            Counter(
                name=METRIC_PREFIX + "windows_yielded",
                documentation=(
                    "Multi-step decode windows ended early because a request arrived."
                ),
                labelnames=labelnames,
            ),
            labelvalues,
        )
        # Counts since the last log line, per engine.
        self._since_log = {idx: MultiStepStats() for idx in self.engine_indexes}

    @classmethod
    def create(
        cls, vllm_config: "VllmConfig", engine_indexes: list[int]
    ) -> "list[MultiStepStatLogger]":
        """The logger where multi-step decode is on (created after vLLM's
        Prometheus logger, which unregisters the vllm: metrics it finds)."""
        if vllm_config.scheduler_config.num_scheduler_steps == 1:
            return []
        return [cls(vllm_config, engine_indexes)]

    def record(
        self,
        scheduler_stats: "SchedulerStats | None",
        iteration_stats: "IterationStats | None",
        mm_cache_stats: object = None,
        engine_idx: int = 0,
    ) -> None:
        stats = getattr(scheduler_stats, "multi_step", None)
        if stats is None:
            return
        for reason, num_tokens in stats.num_generated_tokens.items():
            self.tokens[reason][engine_idx].inc(num_tokens)
        self.windows[engine_idx].inc(stats.num_windows)
        self.windows_yielded[engine_idx].inc(stats.num_windows_yielded)
        self._since_log[engine_idx].merge(stats)

    def log(self) -> None:
        for engine_idx, stats in self._since_log.items():
            line = describe(stats)
            if line:
                logger.info("Engine %03d: %s", engine_idx, line)
        self._since_log = {idx: MultiStepStats() for idx in self.engine_indexes}

    def log_engine_initialized(self) -> None:
        pass


def _unregister_earlier() -> None:
    """Drop the counters of an earlier engine in this process (an `LLM` made
    after another), as vLLM's Prometheus logger drops its own."""
    for collector in list(REGISTRY._collector_to_names):
        if getattr(collector, "_name", "").startswith(METRIC_PREFIX):
            REGISTRY.unregister(collector)


def describe(stats: MultiStepStats) -> str:
    """The periodic log's line: the windows' share of generated tokens, and
    the single steps' by reason, largest first ("" without tokens)."""
    tokens = stats.num_generated_tokens
    total = sum(tokens.values())
    if not total:
        return ""
    in_windows = tokens.get(WINDOW, 0)
    line = (
        f"Multi-step decode: {100 * in_windows / total:.1f}% of generated tokens "
        f"in windows ({stats.num_windows} windows, "
        f"{stats.num_windows_yielded} yielded to arrivals)"
    )
    singles = sorted(
        ((n, reason) for reason, n in tokens.items() if reason != WINDOW),
        reverse=True,
    )
    if singles:
        line += "; single steps: " + ", ".join(
            f"{reason} {100 * n / total:.1f}%" for n, reason in singles
        )
    return line
