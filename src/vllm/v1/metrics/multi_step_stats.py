# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode counts the scheduler sends with its stats
(`SchedulerStats.multi_step`): the tokens generated in windows, and for the
rest why their step ran single."""

from dataclasses import dataclass, field
from enum import Enum


class SingleStepReason(str, Enum):
    """Why the scheduler planned a single step instead of a window (the
    `reason` label of vllm:multi_step_generation_tokens)."""

    # New requests were admitted (their prompts prefilled in this step).
    ARRIVAL = "arrival"
    # A prompt is prefilled in chunks, or the step held only prompts.
    PREFILL = "prefill"
    # A request with structured output runs where windows do not hold one
    # (Model Runner V1, drafts, or multi_step_structured_output off).
    STRUCTURED_OUTPUT = "structured_output"
    # A resumable (streaming-input) request runs.
    RESUMABLE = "resumable"
    # The token budget holds one step of the running requests.
    TOKEN_BUDGET = "token_budget"


# The `reason` label of the tokens generated in windows.
WINDOW = "window"


@dataclass
class MultiStepStats:
    """Counts since the scheduler's last stats."""

    # reason ("window", or a SingleStepReason value) -> tokens generated
    num_generated_tokens: dict[str, int] = field(default_factory=dict)
    num_windows: int = 0
    # Windows that ended early because a request arrived (arrivals.py).
    num_windows_yielded: int = 0

    def add_window(self, num_tokens: int, yielded: bool) -> None:
        self._add_tokens(WINDOW, num_tokens)
        self.num_windows += 1
        self.num_windows_yielded += yielded

    def add_single_step(self, reason: SingleStepReason, num_tokens: int) -> None:
        self._add_tokens(reason.value, num_tokens)

    def merge(self, other: "MultiStepStats") -> None:
        for reason, num_tokens in other.num_generated_tokens.items():
            self._add_tokens(reason, num_tokens)
        self.num_windows += other.num_windows
        self.num_windows_yielded += other.num_windows_yielded

    def _add_tokens(self, reason: str, num_tokens: int) -> None:
        tokens = self.num_generated_tokens
        tokens[reason] = tokens.get(reason, 0) + num_tokens
