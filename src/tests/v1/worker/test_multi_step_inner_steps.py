# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The kinds of inner step of multi-step decode on Model Runner V2
(gpu/multi_step/inner_steps.py) and the window's request tracking
(gpu/multi_step/window_requests.py), each on its own, with stand-in runners."""

from types import SimpleNamespace

import torch

from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.gpu.multi_step.inner_steps import (
    DraftingInnerSteps,
    RunnerInnerSteps,
    pick_inner_steps,
)
from vllm.v1.worker.gpu.multi_step.window_requests import (
    DraftedRequests,
    PlainRequests,
    WindowStart,
)
from vllm.v1.worker.window_output import ReadyOutput


def window(num_positions: dict[str, int], size: int, drafts: int = 0):
    """A window's scheduler output: each request at position 10 with 3
    output tokens."""
    req_ids = list(num_positions)
    output = SchedulerOutput.make_empty()
    output.scheduled_cached_reqs = CachedRequestData(
        req_ids=req_ids,
        new_token_ids=[],
        new_block_ids=[None] * len(req_ids),
        num_computed_tokens=[10] * len(req_ids),
        num_output_tokens=[3] * len(req_ids),
    )
    output.num_scheduled_tokens = dict(num_positions)
    output.total_num_scheduled_tokens = sum(num_positions.values())
    output.multi_step_window = size
    if drafts:
        output.scheduled_spec_decode_tokens = {r: [-1] * drafts for r in req_ids}
        output.num_spec_tokens_to_schedule = drafts
    return output


def start(scheduled: SchedulerOutput, stop_ids=None, max_tokens=None) -> WindowStart:
    req_ids = list(scheduled.num_scheduled_tokens)
    return WindowStart(scheduled, req_ids, stop_ids or {}, max_tokens or {})


def sampled(tokens: dict[str, list[int]]) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        req_ids=list(tokens), sampled_token_ids=list(tokens.values())
    )


class StepRunner:
    """Records what each inner step's pieces were called with."""

    def __init__(self) -> None:
        self.executed: list[SchedulerOutput] = []
        self.calls: list[tuple] = []
        self.execute_model_state = None

    def execute_model(self, scheduler_output):
        self.executed.append(scheduler_output)

    def sample_tokens(self, grammar_output):
        self.calls.append(("sample_tokens", grammar_output))
        return ReadyOutput(sampled({"a": [4, 5]}))  # as async outputs come

    def sample(self, hidden_states, input_batch, grammar_output):
        self.calls.append(("sample", hidden_states.shape[0], grammar_output))
        # two requests, each verifying one draft: "a" accepted it, "b" not
        output = SimpleNamespace(
            sampled_token_ids=torch.tensor([[8, 9], [6, 0]]),
            logprobs_tensors=None,
            num_nans=torch.tensor([0, 1]),
        )
        return output, torch.tensor([2, 1]), torch.tensor([0, 1])

    def postprocess_sampled(self, idx_mapping, tokens, num_sampled, num_rejected, qsl):
        self.calls.append(("post_update", tokens.tolist(), num_sampled.tolist()))


def executed_state(req_ids):
    batch = SimpleNamespace(
        req_ids=req_ids,
        idx_mapping=torch.arange(len(req_ids)),
        query_start_loc=torch.arange(len(req_ids) + 1),
    )
    return SimpleNamespace(input_batch=batch, hidden_states=torch.zeros(3, 4))


def test_runner_inner_step_executes_the_step_a_single_step_scheduler_sends_next():
    runner = StepRunner()
    requests = PlainRequests(start(window({"a": 4, "b": 2}, 4)))
    requests.advance(sampled({"a": [7], "b": [7]}))
    RunnerInnerSteps(runner).execute(requests)
    requests.advance(sampled({"a": [8], "b": [8]}))  # b: its last step
    RunnerInnerSteps(runner).execute(requests)
    assert [s.num_scheduled_tokens for s in runner.executed] == [
        {"a": 1, "b": 1},
        {"a": 1},
    ]
    cached = [s.scheduled_cached_reqs for s in runner.executed]
    assert [c.num_computed_tokens for c in cached] == [[11, 11], [12]]
    assert [c.num_output_tokens for c in cached] == [[4, 4], [5]]


def test_runner_inner_step_samples_with_the_runners_sampler_and_post_update():
    runner = StepRunner()
    runner.execute_model_state = executed_state(["a", "b"])
    output = RunnerInnerSteps(runner).sample()
    assert runner.calls == [
        ("sample", 3, None),
        ("post_update", [[8, 9], [6, 0]], [2, 1]),
    ]
    # each row holds the tokens sampled, no more
    assert output.req_ids == ["a", "b"]
    assert output.sampled_token_ids == [[8, 9], [6]]
    assert output.num_nans_in_logits == {"a": 0, "b": 1}
    assert runner.execute_model_state is None  # consumed, as sample_tokens does


def test_a_windows_step_one_is_the_runners_whole_step():
    runner = StepRunner()
    inner_steps = RunnerInnerSteps(runner)
    assert not inner_steps.execute_first(window({"a": 4}, 4))
    grammar = object()
    inner_steps.sample_first(grammar, executed_here=False)
    assert runner.calls == [("sample_tokens", grammar)]


def test_drafting_inner_step_samples_the_runners_whole_step():
    runner = StepRunner()
    inner_steps = DraftingInnerSteps(runner, num_spec_tokens=3)
    output = inner_steps.sample()
    assert runner.calls == [("sample_tokens", None)]  # it drafts for the next
    assert output.sampled_token_ids == [[4, 5]]
    requests = inner_steps.requests(start(window({"a": 8}, 2, drafts=3)))
    assert isinstance(requests, DraftedRequests) and requests.running == {"a": 3}


def config(device_type="cpu", num_spec_tokens=0, **additional):
    return SimpleNamespace(
        device_config=SimpleNamespace(device_type=device_type),
        speculative_config=SimpleNamespace(num_speculative_tokens=num_spec_tokens)
        if num_spec_tokens
        else None,
        additional_config=additional,
    )


def test_the_window_picks_one_kind_of_inner_step_per_runner():
    runner = StepRunner()
    drafting = pick_inner_steps(runner, config(num_spec_tokens=2))
    assert type(drafting) is DraftingInnerSteps and drafting.num_spec_tokens == 2
    # Only StandaloneCPUModelRunner keeps batches (test_multi_step_kept_batch.py).
    assert type(pick_inner_steps(runner, config())) is RunnerInnerSteps
    assert type(pick_inner_steps(runner, config("cuda"))) is RunnerInnerSteps


def test_plain_requests_leave_at_a_stop_token_or_their_last_step():
    scheduled = window({"a": 4, "b": 4, "c": 2}, 4)
    requests = PlainRequests(start(scheduled, stop_ids={"b": frozenset({2})}))
    assert requests.advance(sampled({"a": [7], "b": [2], "c": [7]}))
    assert requests.running == {"a": 0, "c": 0} and requests.stopped == {"b"}
    assert requests.advance(sampled({"a": [8], "c": [8]}))
    assert requests.running == {"a": 0}  # c: 2 positions
    assert requests.next_step().scheduled_cached_reqs.num_computed_tokens == [12]
    assert requests.advance(sampled({"a": [9]}))
    assert not requests.advance(sampled({"a": [10]}))  # the window's 4 steps


def test_plain_requests_leave_at_max_tokens_where_the_count_is_exact():
    # max_tokens 5, 3 output tokens before the window: 2 left.
    requests = PlainRequests(start(window({"a": 8}, 8), max_tokens={"a": 5}))
    assert requests.advance(sampled({"a": [7]}))
    assert not requests.advance(sampled({"a": [8]}))


def test_drafted_requests_start_each_step_where_their_accepted_tokens_end():
    requests = DraftedRequests(start(window({"a": 12, "b": 6}, 3, drafts=3)), 3)
    # a accepts 2 of 3 drafts, b none
    assert requests.advance(sampled({"a": [7, 8, 9], "b": [7]}))
    # b: 1 token in 6 positions, 4 left after its next token: 3 drafts
    assert requests.running == {"a": 3, "b": 3}
    step = requests.next_step()
    # upper bounds: the positions processed, rejected drafts included
    assert step.scheduled_cached_reqs.num_computed_tokens == [14, 14]
    assert step.scheduled_cached_reqs.num_output_tokens == [6, 4]
    assert requests.advance(sampled({"a": [10], "b": [8, 9, 10, 11]}))
    assert requests.running == {"a": 3, "b": 0}  # b: 5 tokens in 6 positions
    assert not requests.advance(sampled({"a": [11], "b": [12]}))  # 3 steps
    assert requests.spec_counts() == {
        "a": [(3, 2), (3, 0), (3, 0)],
        "b": [(3, 0), (3, 3), (0, 0)],
    }
