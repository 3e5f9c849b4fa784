# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The worker side of multi-step decode on Model Runner V2
(gpu/multi_step/window.py), with a stand-in runner: which steps run, which
requests leave a window (merging the steps' outputs: test_window_output.py)."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.config import SpeculativeConfig
from vllm.config.multi_step import (
    SPEC_DEFAULTS_IN_MODEL_RUNNER_V2_WINDOWS,
    _model_runner_v2_spec_reasons,
)
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.core.sched.output import (
    CachedRequestData,
    GrammarOutput,
    NewRequestData,
    SchedulerOutput,
)
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.worker.gpu.multi_step import window as window_module
from vllm.v1.worker.gpu.multi_step import window_grammar
from vllm.v1.worker.gpu.multi_step.window import ModelRunnerV2Windows

EOS = 2


class ScriptedRunner:
    """Samples, for each request, the next token of its script (a list: the
    tokens of a step that accepted drafts); records each step and each state
    update.

    A window's step 1 goes through `sample_tokens` (the runner's whole step);
    without drafts its inner steps through `sample` and `postprocess_sampled`,
    the two pieces of it they use (Model Runner V2's names and shapes); with
    drafts through `sample_tokens`, which drafts for the next step.
    """

    def __init__(self, scripts: dict[str, list]) -> None:
        self.scripts = {r: list(tokens) for r, tokens in scripts.items()}
        self.steps: list[SchedulerOutput] = []
        self.execute_model_state = None
        # The tokens each inner step's post_update wrote, in row order.
        self.updates: list[list[int]] = []
        # Each inner step's grammar masks, and each whole step's (step 1).
        self.grammar_outputs: list = []
        self.step_grammar_outputs: list = []
        # Each request's token history, as the standalone runner keeps it:
        # two prompt tokens, then what it sampled.
        self.req_states = SimpleNamespace(
            req_id_to_index={r: i for i, r in enumerate(scripts)},
            all_token_ids=torch.zeros(len(scripts), 64, dtype=torch.int32),
            total_len=torch.full((len(scripts),), 2, dtype=torch.int32),
        )

    def _history(self, req_ids: list[str], tokens: list) -> None:
        states = self.req_states
        for req_id, sampled in zip(req_ids, tokens):
            index = states.req_id_to_index.get(req_id)
            for token in sampled if isinstance(sampled, list) else [sampled]:
                if index is not None and token:
                    states.all_token_ids[index, states.total_len[index]] = token
                    states.total_len[index] += 1

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        self.steps.append(scheduler_output)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        inputs = SimpleNamespace(
            req_ids=req_ids,
            idx_mapping=torch.arange(len(req_ids)),
            query_start_loc=torch.arange(len(req_ids) + 1),
        )
        self.execute_model_state = SimpleNamespace(
            input_batch=inputs,
            hidden_states=torch.zeros(len(req_ids), 4),
        )

    def _next_tokens(self, req_ids: list[str]) -> list[int]:
        return [self.scripts[r].pop(0) for r in req_ids]

    def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
        self.step_grammar_outputs.append(grammar_output)
        executed, self.execute_model_state = self.execute_model_state, None
        req_ids = executed.input_batch.req_ids
        tokens = self._next_tokens(req_ids)
        self._history(req_ids, tokens)
        return ModelRunnerOutput(
            req_ids=req_ids,
            # 0: a prompt chunk, which samples nothing
            sampled_token_ids=[
                t if isinstance(t, list) else [t] if t else [] for t in tokens
            ],
        )

    def sample(self, hidden_states, inputs, grammar_output):
        assert hidden_states.shape[0] == len(inputs.req_ids)
        self.grammar_outputs.append(grammar_output)
        tokens = self._next_tokens(inputs.req_ids)
        self._history(inputs.req_ids, tokens)
        sampled = torch.tensor(tokens).view(-1, 1)
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
    """The settings ModelRunnerV2Windows reads."""

    def __init__(self, async_scheduling: bool, num_spec_tokens: int = 0) -> None:
        self.scheduler_config = SimpleNamespace(
            num_scheduler_steps=8, async_scheduling=async_scheduling
        )
        self.speculative_config = (
            SimpleNamespace(num_speculative_tokens=num_spec_tokens)
            if num_spec_tokens
            else None
        )
        self.additional_config: dict = {}
        self.parallel_config = SimpleNamespace(tensor_parallel_size=1)
        # A CPU, where the standalone runner's batches are reused (not this
        # stand-in's: its steps are the runner's execute_model).
        self.device_config = SimpleNamespace(device_type="cpu")


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
    planned: dict[str, int],
    window: int,
    new: list[NewRequestData] = (),
    drafts: int = 0,
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
    if drafts:  # placeholders, as the scheduler sends them to Model Runner V2
        output.scheduled_spec_decode_tokens = {r: [-1] * drafts for r in req_ids}
        output.num_spec_tokens_to_schedule = drafts
    return output


def run_step(windows: ModelRunnerV2Windows, scheduler_output: SchedulerOutput):
    first = windows.first_step(scheduler_output)
    windows.model_runner.execute_model(first)
    return windows.sample_tokens(None)


def make(scripts: dict[str, list], async_scheduling: bool = True, drafts: int = 0):
    runner = ScriptedRunner(scripts)
    windows = ModelRunnerV2Windows(Worker(runner), Config(async_scheduling, drafts))
    # The requests arrive in a single step (their prompts), as the scheduler sends them.
    prompts = step(dict.fromkeys(scripts, 2), 0, [new_request(r) for r in scripts])
    run_step(windows, prompts)
    return runner, windows


def test_a_window_finishes_its_steps_after_the_last_and_before_merging(monkeypatch):
    """What sampling left for the window's end (the kept batch's logprobs)
    is done once the last step ran, before the steps' outputs are merged."""
    runner, windows = make({"a": [7, 8, 9, 10, 11]})
    events = []
    monkeypatch.setattr(
        windows.inner_steps,
        "finish_window",
        lambda: events.append(("finish", len(runner.updates))),
    )
    merge = window_module.merge_step_outputs
    monkeypatch.setattr(
        window_module,
        "merge_step_outputs",
        lambda steps: events.append(("merge", len(steps))) or merge(steps),
    )
    run_step(windows, step({"a": 4}, 4))
    assert events == [("finish", 3), ("merge", 4)]


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


def test_a_token_that_stops_another_request_does_not_stop_this_one():
    # The window checks each step against every request's stop ids at once;
    # a hit is then settled per request, by its own stop ids.
    runner, windows = make({"a": [7, 8, 50, 9], "b": [7, 8, 50, 50]})
    windows._stop_ids["b"] = windows._stop_ids["b"] | {50}
    runner.steps.clear()
    output = run_step(windows, step({"a": 3, "b": 3}, 3))
    assert output.sampled_token_ids == [[8, 50, 9], [8, 50]]
    assert [s.num_scheduled_tokens for s in runner.steps] == [
        {"a": 1, "b": 1},
        {"a": 1, "b": 1},
        {"a": 1},
    ]


def test_max_tokens_ends_a_request_without_async_scheduling():
    # max_tokens 16, 3 generated before the window: 13 left, the window is 8.
    runner, windows = make({"a": [7] + list(range(8, 30))}, async_scheduling=False)
    for num_output_tokens, window in ((3, 8), (11, 8)):
        runner.steps.clear()
        scheduled = step({"a": window}, window)
        scheduled.scheduled_cached_reqs.num_output_tokens = [num_output_tokens]
        output = run_step(windows, scheduled)
        assert len(output.sampled_token_ids[0]) == min(window, 16 - num_output_tokens)
        assert len(runner.steps) == len(output.sampled_token_ids[0])


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


def test_with_drafts_each_step_verifies_the_drafts_and_starts_where_its_tokens_end():
    # k = 3. "a" accepts 2 drafts, then none, then all; "b" samples its EOS
    # among accepted drafts in step 2; "c" has 6 positions (max_model_len).
    runner, windows = make(
        {
            "a": [7, [8, 9, 10], [11], [12, 13, 14, 15]],
            "b": [7, [8], [9, EOS, 4]],
            "c": [7, [8], [9, 10, 11, 12], [13]],
        },
        drafts=3,
    )
    runner.steps.clear()
    output = run_step(windows, step({"a": 12, "b": 12, "c": 6}, 3, drafts=3))
    assert output.sampled_token_ids == [
        [8, 9, 10, 11, 12, 13, 14, 15],
        [8, 9, EOS, 4],
        [8, 9, 10, 11, 12, 13],
    ]
    assert [s.num_scheduled_tokens for s in runner.steps] == [
        {"a": 4, "b": 4, "c": 4},
        {"a": 4, "b": 4, "c": 4},
        {"a": 4, "c": 1},  # c: 5 tokens in 6 positions, room for no draft
    ]
    assert [s.scheduled_spec_decode_tokens for s in runner.steps][2] == {
        "a": [-1, -1, -1]
    }
    # The runner places each request; the host sends upper bounds: the
    # positions each request's steps processed, rejected drafts included.
    assert [s.scheduled_cached_reqs.num_computed_tokens for s in runner.steps] == [
        [10, 10, 10],
        [14, 14, 14],
        [18, 18],
    ]
    assert output.multi_step_spec_counts == {
        "a": [(3, 2), (3, 0), (3, 3)],
        "b": [(3, 0), (3, 2)],
        "c": [(3, 0), (3, 3), (0, 0)],
    }
    assert not runner.updates  # every inner step was the runner's whole step
    assert all(not s.skip_drafts for s in runner.steps)


def test_with_drafts_a_request_leaves_at_max_tokens_without_async_scheduling():
    # max_tokens 16, 3 generated before the window: 13 left.
    runner, windows = make(
        {"a": [7, [8, 9, 10, 11]] + [[12, 13, 14, 15]] * 2 + [[16], [17]]},
        async_scheduling=False,
        drafts=3,
    )
    runner.steps.clear()
    output = run_step(windows, step({"a": 16}, 8, drafts=3))
    assert len(output.sampled_token_ids[0]) == 13  # 4 + 4 + 4 + 1
    assert len(runner.steps) == 4


def test_a_step_without_the_stopped_request_keeps_the_others_drafts():
    runner, windows = make({"a": [7, [8, 9], [10]], "b": [7, [EOS]]}, drafts=2)
    run_step(windows, step({"a": 3, "b": 3}, 1, drafts=2))
    runner.steps.clear()
    run_step(windows, step({"a": 3, "b": 3}, 0, drafts=2))
    assert runner.steps[0].num_scheduled_tokens == {"a": 3}
    assert runner.steps[0].scheduled_spec_decode_tokens == {"a": [-1, -1]}


def test_refused_spec_settings_are_speculative_config_fields_at_their_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(SpeculativeConfig)}
    for name, default in SPEC_DEFAULTS_IN_MODEL_RUNNER_V2_WINDOWS.items():
        assert fields[name] == default, name


@pytest.mark.parametrize(
    "setting",
    [
        {"method": "suffix"},
        {"enable_adaptive_verification": True},
        {"num_speculative_tokens_per_batch_size": [(1, 8, 2)]},
        {"rejection_sample_method": "synthetic"},
    ],
)
def test_windows_refuse_drafts_they_cannot_keep_as_single_steps(setting):
    speculative_config = SimpleNamespace(
        **{"method": "eagle", **SPEC_DEFAULTS_IN_MODEL_RUNNER_V2_WINDOWS, **setting}
    )
    config = SimpleNamespace(speculative_config=speculative_config)
    assert _model_runner_v2_spec_reasons(config)
    speculative_config.__dict__.update(
        {"method": "eagle", **SPEC_DEFAULTS_IN_MODEL_RUNNER_V2_WINDOWS}
    )
    assert not _model_runner_v2_spec_reasons(config)


def _arrival_during_inner_step(runner: ScriptedRunner, counter, inner_step: int):
    """A request arrives at the engine core while the runner samples the
    window's `inner_step`-th inner step (1: the step after step 1)."""
    sample = runner.sample

    def sample_and_arrive(*args):
        if len(runner.updates) == inner_step - 1:
            counter.arrived()
        return sample(*args)

    runner.sample = sample_and_arrive


def _window_planned_at(runner, windows, counter, steps: int, num_computed: int):
    """Run a window of `steps` steps for "a" and "b", planned from `num_computed`
    when the engine core had seen what `counter` says it had seen."""
    window = step({"a": steps, "b": steps}, steps)
    window.scheduled_cached_reqs.num_computed_tokens = [num_computed] * 2
    window.multi_step_arrivals = (counter.name, counter.num_seen)
    runner.steps.clear()
    return run_step(windows, window)


def test_a_window_yields_to_an_arrival_after_the_step_in_flight():
    from vllm.v1.core.sched.arrivals import ArrivalCounter

    counter = ArrivalCounter()
    try:
        runner, windows = make({"a": [7, 8, 9, 10, 11, 12], "b": [7, 8, 9, 10, 11, 12]})
        _arrival_during_inner_step(runner, counter, 1)
        output = _window_planned_at(runner, windows, counter, 4, 10)
        # step 1, then the inner step during which the request arrived; no more
        assert output.sampled_token_ids == [[8, 9], [8, 9]]
        assert output.multi_step_yielded
        assert len(runner.steps) == 2

        # The window the engine planned before it saw the cut (async
        # scheduling) counts the 4 positions as computed (10 + 4); it runs from
        # the true count (10 + 2), and yields after its step 1: the request
        # arrived after it was planned too.
        output = _window_planned_at(runner, windows, counter, 4, 14)
        assert runner.steps[0].scheduled_cached_reqs.num_computed_tokens == [12, 12]
        assert output.sampled_token_ids == [[10], [10]]
        assert output.multi_step_yielded

        # Planned once the engine core had seen the request: the window runs
        # whole, from the scheduler's count, settled after the cut (12 + 1).
        counter.seen()
        output = _window_planned_at(runner, windows, counter, 2, 13)
        assert runner.steps[0].scheduled_cached_reqs.num_computed_tokens == [13, 13]
        assert output.sampled_token_ids == [[11, 12], [11, 12]]
        assert not output.multi_step_yielded
    finally:
        counter.close()


def test_a_window_without_an_arrival_count_never_yields():
    from vllm.v1.core.sched.arrivals import ArrivalCounter

    counter = ArrivalCounter()
    try:
        runner, windows = make({"a": [7, 8, 9, 10]})
        _arrival_during_inner_step(runner, counter, 1)
        runner.steps.clear()
        output = run_step(windows, step({"a": 3}, 3))
        assert output.sampled_token_ids == [[8, 9, 10]]
        assert not output.multi_step_yielded
    finally:
        counter.close()


def test_an_admitted_request_runs_its_prompt_in_step_one_then_decodes():
    runner, windows = make({"a": [7, 8, 9, 10]})
    runner.scripts["n"] = [20, 21, 22]
    # "n" is admitted with its 2-token prompt and the window's 2 later steps;
    # "c" with a chunk of a longer prompt only: it samples nothing, and leaves
    chunk = new_request("c")
    chunk.prefill_token_ids = chunk.prompt_token_ids = [5] * 6
    runner.scripts["c"] = [0]
    window = step({"a": 3, "n": 2 + 2, "c": 4}, 3, [new_request("n"), chunk])
    runner.steps.clear()
    output = run_step(windows, window)
    assert [s.num_scheduled_tokens for s in runner.steps] == [
        {"a": 1, "n": 2, "c": 4},
        {"a": 1, "n": 1},
        {"a": 1, "n": 1},
    ]
    # "n" decodes from the position after its prompt, as "a" from its own
    assert [s.scheduled_cached_reqs.num_computed_tokens for s in runner.steps[1:]] == [
        [11, 2],
        [12, 3],
    ]
    assert output.sampled_token_ids[:2] == [[8, 9, 10], [20, 21, 22]]


REJECTED = 99  # a token the grammars below do not take


class CopyManager:
    """Stands in for the worker's StructuredOutputManager: a grammar takes any
    token but REJECTED, and a request's bitmask row holds how many tokens (its
    prompt's and those fed) its copy has taken."""

    def __init__(self, vllm_config) -> None:
        self.fed: dict[str, list[int]] = {}

    def grammar_init(self, request) -> None:
        request.structured_output_request.grammar = object()  # compiled
        self.fed[request.request_id] = []

    def accept_tokens(self, request, token_ids: list[int]) -> bool:
        assert request.all_token_ids[-len(token_ids) :] == token_ids
        self.fed[request.request_id] += token_ids
        return REJECTED not in token_ids

    def grammar_bitmask(self, requests, req_ids, spec_tokens):
        return np.array(
            [[len(requests[r].all_token_ids)] for r in req_ids], dtype=np.int32
        )


def _structured(req_id: str) -> NewRequestData:
    new_req = new_request(req_id)
    new_req.sampling_params = SamplingParams(
        max_tokens=16, structured_outputs=StructuredOutputsParams(regex="[0-9]+")
    )
    return new_req


def make_structured(scripts: dict[str, list], monkeypatch, reasoning=(None, None)):
    """Requests "s" (structured output) and the others (plain), past their prompts."""
    monkeypatch.setattr(window_grammar, "StructuredOutputManager", CopyManager)
    runner = ScriptedRunner(scripts)
    windows = ModelRunnerV2Windows(Worker(runner), Config(True))
    new = [_structured(r) if r == "s" else new_request(r) for r in scripts]
    prompts = step(dict.fromkeys(scripts, 2), 0, new)
    prompts.multi_step_reasoning = {"s": reasoning}
    run_step(windows, prompts)
    return runner, windows


def run_masked_step(windows, scheduler_output, masked: list[str]):
    """A step whose step 1 the engine core masked for `masked`."""
    first = windows.first_step(scheduler_output)
    windows.model_runner.execute_model(first)
    masks = np.zeros((len(masked), 1), dtype=np.int32)
    return windows.sample_tokens(GrammarOutput(masked, masks))


def test_inner_steps_of_a_structured_request_are_masked_by_the_workers_copy(
    monkeypatch,
):
    runner, windows = make_structured(
        {"s": [7, 8, 9, 10], "p": [7, 8, 9, 10]}, monkeypatch
    )
    manager = windows._grammars._manager
    runner.steps.clear()
    output = run_masked_step(windows, step({"s": 3, "p": 3}, 3), ["s"])
    assert output.sampled_token_ids == [[8, 9, 10], [8, 9, 10]]
    # Each inner step masks "s" alone, from its copy after every token sampled
    # so far: prompt (2), its first token (7), then each step's.
    masks = [
        (g.structured_output_request_ids, g.grammar_bitmask.tolist())
        for g in runner.grammar_outputs
    ]
    assert masks == [(["s"], [[4]]), (["s"], [[5]])]
    # fed one at a time, the window's last token too (the next window's step 1
    # is masked by the engine core; its inner steps by this copy again)
    assert manager.fed["s"] == [7, 8, 9, 10]


def test_the_worker_masks_step_one_where_the_scheduler_leaves_it(monkeypatch):
    """The engine core filled step 1's row before its grammar took the window
    before's tokens; the worker's copy, caught up, replaces it. The window
    reports the copies that followed their requests through it."""
    runner, windows = make_structured(
        {"s": [7, 8, 9, 10], "p": [7, 8, 9, 10]}, monkeypatch
    )
    runner.steps.clear()
    window = step({"s": 3, "p": 3}, 3)
    window.multi_step_worker_masks = ["s"]
    # The engine core also filled a row for "gone", which stopped in the
    # window before (it had not taken that window in): step 1 leaves it out.
    output = run_masked_step(windows, window, ["gone", "s"])
    assert output.sampled_token_ids == [[8, 9, 10], [8, 9, 10]]
    # step 1's row from the copy after the prompt (2) and the first token (7),
    # not the engine core's (0); the inner steps' as before
    (step_one,) = runner.step_grammar_outputs[-1:]
    assert step_one.structured_output_request_ids == ["s"]
    assert step_one.grammar_bitmask.tolist() == [[3]]
    masks = [g.grammar_bitmask.tolist() for g in runner.grammar_outputs]
    assert masks == [[[4]], [[5]]]
    assert output.multi_step_grammars == ["s"]


def test_a_window_reports_no_copy_that_lost_its_request(monkeypatch):
    runner, windows = make_structured(
        {"s": [7, 8, REJECTED, 10], "p": [7, 8, 9, 10]}, monkeypatch
    )
    output = run_masked_step(windows, step({"s": 4, "p": 4}, 4), ["s"])
    assert output.sampled_token_ids == [[8, REJECTED], [8, 9]]
    assert output.multi_step_grammars == []
    # a plain window reports nothing
    _runner, plain = make_structured({"p": [7, 8, 9]}, monkeypatch)
    assert run_step(plain, step({"p": 2}, 2)).multi_step_grammars is None


def test_a_copy_starts_where_the_engine_cores_request_stands_with_reasoning(
    monkeypatch,
):
    _runner, windows = make_structured(
        {"s": [7]}, monkeypatch, (True, {"effort": "low"})
    )
    copy = windows._grammars._requests["s"]
    assert copy.structured_output_request.reasoning_ended is True
    assert copy.structured_output_request.reasoning_parser_kwargs == {"effort": "low"}
    assert copy.prompt_token_ids == [5, 6] and copy.all_token_ids == [5, 6]


def test_a_copy_that_rejects_a_token_ends_its_windows_after_step_one(monkeypatch):
    runner, windows = make_structured(
        {"s": [7, 8, REJECTED, 10, 11, 12], "p": [7, 8, 9, 10, 11, 12]}, monkeypatch
    )
    runner.steps.clear()
    output = run_masked_step(windows, step({"s": 4, "p": 4}, 4), ["s"])
    # The token sampled under the copy's mask is kept; the window ends there.
    assert output.sampled_token_ids == [[8, REJECTED], [8, 9]]
    assert len(runner.steps) == 2
    # From then on its windows end after step 1: it runs single steps.
    runner.steps.clear()
    output = run_masked_step(windows, step({"s": 4, "p": 4}, 4), ["s"])
    assert output.sampled_token_ids == [[10], [10]]
    assert len(runner.steps) == 1
