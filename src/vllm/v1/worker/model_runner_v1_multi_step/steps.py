# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The scheduler output of a window's inner step on Model Runner V1, shared by
the window (window.py) and the window with drafts (spec_window.py)."""

from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput


def follow_up_step(
    requests: dict,
    num_computed: dict[str, int],
    drafts: dict[str, list[int]] | None = None,
    num_spec_tokens_to_schedule: int = 0,
) -> SchedulerOutput:
    """What a single-step scheduler would send next: each request's last
    token at its position, plus its drafts if any."""
    req_ids = list(num_computed)
    drafts = drafts or {}
    num_scheduled = {r: 1 + len(drafts.get(r, ())) for r in req_ids}
    return SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(
            req_ids=req_ids,
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[None] * len(req_ids),
            num_computed_tokens=[num_computed[r] for r in req_ids],
            num_output_tokens=[len(requests[r].output_token_ids) for r in req_ids],
        ),
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=sum(num_scheduled.values()),
        scheduled_spec_decode_tokens={r: d for r, d in drafts.items() if d},
        scheduled_encoder_inputs={},
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
        num_spec_tokens_to_schedule=num_spec_tokens_to_schedule,
    )
