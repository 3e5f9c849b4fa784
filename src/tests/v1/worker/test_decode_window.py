# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The worker side of multi-step decode on Model Runner V2 (decode_window.py), with a
stand-in runner: which steps run, which requests leave a window (merging the steps'
outputs: test_window_output.py)."""

from types import SimpleNamespace

import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.worker.decode_window import DecodeWindowRunner

EOS = 2


class ScriptedRunner:
    """Samples, for each request, the next token of its script; records each step
    and each state update.

    A window's step 1 goes through `sample_tokens` (the runner's whole step);
    its inner steps through `sample` and `postprocess_sampled`, the two pieces
    of it they use (Model Runner V2's names and shapes).
    """

    def __init__(self, scripts: dict[str, list[int]]) -> None:
        self.scripts = {r: list(tokens) for r, tokens in scripts.items()}
        self.steps: list[SchedulerOutput] = []
        self.execute_model_state = None
        # The tokens each inner step's post_update wrote, in row order.
        self.updates: list[list[int]] = []

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        self.steps.append(scheduler_output)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        inputs = SimpleNamespace(
            req_ids=req_ids,
            idx_mapping=torch.arange(len(req_ids)),
            query_start_loc=torch.arange(len(req_ids) + 1),
        )
        self.execute_model_state = SimpleNamespace(
            input_batch=inputs, hidden_states=torch.zeros(len(req_ids), 4)
        )

    def _next_tokens(self, req_ids: list[str]) -> list[int]:
        return [self.scripts[r].pop(0) for r in req_ids]

    def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
        executed, self.execute_model_state = self.execute_model_state, None
        req_ids = executed.input_batch.req_ids
        tokens = self._next_tokens(req_ids)
        return ModelRunnerOutput(
            req_ids=req_ids, sampled_token_ids=[[t] for t in tokens]
        )

    def sample(self, hidden_states, inputs, grammar_output):
        assert grammar_output is None and hidden_states.shape[0] == len(inputs.req_ids)
        sampled = torch.tensor(self._next_tokens(inputs.req_ids)).view(-1, 1)
        num_sampled = torch.ones(len(inputs.req_ids), dtype=torch.int32)
        output = SimpleNamespace(
            sampled_token_ids=sampled, logprobs_tensors=None, num_nans=None
        )
        return output, num_sampled, torch.zeros_like(num_sampled)

    def postprocess_sampled(
        self, idx_mapping, sampled, num_sampled, num_rejected, query_start_loc
    ):
        assert idx_mapping.shape[0] == sampled.shape[0] == num_sampled.shape[0]
        self.updates.append(sampled.view(-1).tolist())


class Worker:
    def __init__(self, runner: ScriptedRunner) -> None:
        self.model_runner = runner


class Config:
    """The two settings DecodeWindowRunner reads."""

    def __init__(self, async_scheduling: bool) -> None:
        self.scheduler_config = type(
            "S", (), {"num_scheduler_steps": 8, "async_scheduling": async_scheduling}
        )()


def new_request(req_id: str) -> NewRequestData:
    params = SamplingParams(max_tokens=16)
    params.update_from_generation_config({}, eos_token_id=EOS)  # as the frontend does
    return NewRequestData(
        req_id=req_id,
        prompt_token_ids=[5, 6],
        mm_features=[],
        sampling_params=params,
        pooling_params=None,
        block_ids=([0],),
        num_computed_tokens=0,
        lora_request=None,
        prefill_token_ids=[5, 6],
    )


def step(
    planned: dict[str, int], window: int, new: list[NewRequestData] = ()
) -> SchedulerOutput:
    req_ids = [r for r in planned if r not in {n.req_id for n in new}]
    cached = CachedRequestData(
        req_ids=req_ids,
        new_token_ids=[],
        new_block_ids=[None] * len(req_ids),
        num_computed_tokens=[10] * len(req_ids),
        num_output_tokens=[3] * len(req_ids),
    )
    output = SchedulerOutput.make_empty()
    output.scheduled_new_reqs = list(new)
    output.scheduled_cached_reqs = cached
    output.num_scheduled_tokens = dict(planned)
    output.total_num_scheduled_tokens = sum(planned.values())
    output.multi_step_window = window
    return output


def run_step(windows: DecodeWindowRunner, scheduler_output: SchedulerOutput):
    first = windows.first_step(scheduler_output)
    windows.model_runner.execute_model(first)
    return windows.sample_tokens(None)


def make(scripts: dict[str, list[int]], async_scheduling: bool = True):
    runner = ScriptedRunner(scripts)
    windows = DecodeWindowRunner(Worker(runner), Config(async_scheduling))
    # The requests arrive in a single step (their prompts), as the scheduler sends them.
    prompts = step(dict.fromkeys(scripts, 2), 0, [new_request(r) for r in scripts])
    run_step(windows, prompts)
    return runner, windows


def test_window_runs_each_request_to_its_stop_or_its_last_step():
    runner, windows = make({"a": [7, 8, 9, 10, 11], "b": [7, EOS, 9], "c": [7, 8, 9]})
    runner.steps.clear()
    output = run_step(windows, step({"a": 4, "b": 4, "c": 2}, 4))
    assert output.req_ids == ["a", "b", "c"]
    assert output.sampled_token_ids == [[8, 9, 10, 11], [EOS], [8, 9]]
    # step 1: each request one token; then the next position of those still going
    assert [s.num_scheduled_tokens for s in runner.steps] == [
        {"a": 1, "b": 1, "c": 1},
        {"a": 1, "c": 1},
        {"a": 1},
        {"a": 1},
    ]
    assert [s.scheduled_cached_reqs.num_computed_tokens for s in runner.steps] == [
        [10, 10, 10],
        [11, 11],
        [12],
        [13],
    ]
    # each inner step sampled with upstream's pieces and updated the runner's state
    assert runner.updates == [[9, 9], [10], [11]]
    assert runner.execute_model_state is None


def test_async_step_planned_before_the_stop_was_known_runs_without_it():
    runner, windows = make({"a": [7, 8, 9, 10], "b": [7, EOS]})
    run_step(windows, step({"a": 2, "b": 2}, 2))
    runner.steps.clear()
    output = run_step(windows, step({"a": 1, "b": 1}, 0))
    assert runner.steps[0].num_scheduled_tokens == {"a": 1}
    assert runner.steps[0].scheduled_cached_reqs.req_ids == ["a"]
    assert output.sampled_token_ids == [[10]]


def test_a_step_of_stopped_requests_only_runs_nothing_and_samples_empty():
    runner, windows = make({"a": [7, EOS]})
    run_step(windows, step({"a": 2}, 2))
    runner.steps.clear()
    output = run_step(windows, step({"a": 2}, 2))
    assert runner.steps[0].total_num_scheduled_tokens == 0
    assert output is EMPTY_MODEL_RUNNER_OUTPUT


def test_without_async_scheduling_no_request_is_left_out():
    # The scheduler saw the stop before it planned the next step: what it
    # schedules runs, even a request the worker saw stop.
    runner, windows = make({"a": [7, EOS, 9]}, async_scheduling=False)
    run_step(windows, step({"a": 2}, 2))
    runner.steps.clear()
    assert run_step(windows, step({"a": 1}, 0)).sampled_token_ids == [[9]]
