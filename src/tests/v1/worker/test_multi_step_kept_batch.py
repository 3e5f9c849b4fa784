# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Inner steps on StandaloneCPUModelRunner's kept batch (gpu/multi_step/kept_batch.py),
on a stand-in of the runner: which steps run on the kept batch, which go to the
runner, and what the plain sampling draws with. The forward itself, with the
runner's kernels, is the parity tests' (tests/real/test_multi_step.py)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.v1.worker.test_multi_step_inner_steps import window
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.worker.cpu.model_states.default import DefaultModelState
from vllm.v1.worker.cpu.sampler import CPUSampler
from vllm.v1.worker.cpu.standalone_model_runner import StandaloneCPUModelRunner
from vllm.v1.worker.cpu.structured_outputs import CPUStructuredOutputsWorker
from vllm.v1.worker.gpu.multi_step.inner_steps import pick_inner_steps
from vllm.v1.worker.gpu.multi_step.kept_batch import KeptBatchInnerSteps
from vllm.v1.worker.gpu.multi_step.window_requests import PlainRequests, WindowStart


def decode_batch(req_ids: list[str]) -> SimpleNamespace:
    """A decode step's batch: one token per request, at positions 10, 11, ..."""
    num_reqs = len(req_ids)
    return SimpleNamespace(
        req_ids=list(req_ids),
        num_reqs=num_reqs,
        num_tokens=num_reqs,
        has_prefill=False,
        idx_mapping=torch.arange(num_reqs),
        idx_mapping_np=np.arange(num_reqs),
        expanded_idx_mapping=torch.arange(num_reqs),
        expanded_local_pos=torch.zeros(num_reqs, dtype=torch.int32),
        query_start_loc=torch.arange(num_reqs + 1),
        logits_indices=torch.arange(num_reqs),
        positions=torch.arange(10, 10 + num_reqs),
        input_ids=torch.arange(num_reqs),
        seq_lens=torch.full((num_reqs,), 11),
        seq_lens_cpu_upper_bound=torch.full((num_reqs,), 11),
    )


class Sampler(CPUSampler):
    """CPUSampler's plain configuration; records what `sample` draws with."""

    def __init__(self, logprobs: bool = False) -> None:
        self.compute_nans = False
        self.trace_replay_state = None
        self.return_sampling_mask = False
        self.logprobs = logprobs
        self.draws: list[dict] = []

    def get_logprobs_dims(self, idx_mapping_np):
        return (5, 0) if self.logprobs else None

    def sample(self, logits, **kwargs):
        self.draws.append(kwargs)
        return logits.argmax(dim=-1), None


class Runner(StandaloneCPUModelRunner):
    """The runner's attributes the kept batch reads; records the runner's
    own steps and request updates."""

    def __init__(self, sampler: Sampler | None = None) -> None:
        self.calls: list[str] = []
        self.executed: list[SchedulerOutput] = []
        self.grammar_outputs: list = []  # what `sample` masked each step with
        self.execute_model_state = None
        self.decode_query_len = 1
        self.block_tables = SimpleNamespace(has_sliding_window_groups=False)
        self.model_state = DefaultModelState.__new__(DefaultModelState)
        self.sampler = sampler or Sampler()
        self.model = SimpleNamespace(compute_logits=lambda hidden: hidden.clone())
        self.structured_outputs_worker = CPUStructuredOutputsWorker(
            8, 3, torch.device("cpu"), mask_stride=1
        )
        self.uses_inputs_embeds = False
        self.is_encoder_decoder = False
        self.fast_prefill = None

    def execute_model(self, scheduler_output):
        self.executed.append(scheduler_output)
        batch = decode_batch(list(scheduler_output.num_scheduled_tokens))
        self.execute_model_state = SimpleNamespace(input_batch=batch)

    def sample_tokens(self, grammar_output):
        self.calls.append("sample_tokens")

    def sample(self, hidden_states, input_batch, grammar_output):
        self.calls.append("sample")
        self.grammar_outputs.append(grammar_output)
        num_reqs = input_batch.num_reqs
        sampled = SimpleNamespace(
            sampled_token_ids=torch.ones(num_reqs, 1, dtype=torch.int64),
            logprobs_tensors=None,
            num_nans=None,
        )
        num_sampled = torch.ones(num_reqs, dtype=torch.int32)
        return sampled, num_sampled, torch.zeros_like(num_sampled)

    def finish_requests(self, scheduler_output):
        self.calls.append("finish_requests")

    def free_states(self, scheduler_output):
        self.calls.append("free_states")

    def add_requests(self, scheduler_output):
        self.calls.append("add_requests")

    def update_requests(self, scheduler_output):
        self.calls.append("update_requests")


def config(num_spec_tokens: int = 0, **additional) -> SimpleNamespace:
    return SimpleNamespace(
        device_config=SimpleNamespace(device_type="cpu"),
        speculative_config=SimpleNamespace(num_speculative_tokens=num_spec_tokens)
        if num_spec_tokens
        else None,
        lora_config=None,
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, data_parallel_size=1),
        additional_config=additional,
    )


@pytest.fixture
def kept(monkeypatch):
    """Kept-batch steps on a stand-in runner whose last step ran "a" and "b";
    the steps run on the kept batch record their batch instead of a forward."""
    runner = Runner()
    inner_steps = KeptBatchInnerSteps.create(runner, config())
    assert inner_steps is not None
    forwards = []
    monkeypatch.setattr(
        inner_steps,
        "_forward",
        lambda batch, finished_req_ids: forwards.append(
            (batch.req_ids, finished_req_ids)
        ),
    )
    runner.execute_model(step_of({"a": 1, "b": 1}))
    inner_steps.keep_executed()
    runner.executed.clear()
    return runner, inner_steps, forwards


def step_of(num_scheduled: dict[str, int], **fields) -> SchedulerOutput:
    """A decode step of `num_scheduled`, with other fields of the scheduler's
    output as given."""
    output = window(num_scheduled, 0)
    for name, value in fields.items():
        setattr(output, name, value)
    return output


def requests_running(req_ids: list[str]) -> PlainRequests:
    scheduled = window(dict.fromkeys(("a", "b"), 4), 4)
    requests = PlainRequests(WindowStart(scheduled, ["a", "b"], {}, {}))
    requests.running = dict.fromkeys(req_ids, 0)
    requests.num_steps = 1
    return requests


def test_the_kept_batch_serves_the_standalone_runner_where_the_option_is_on():
    runner = Runner()
    assert type(pick_inner_steps(runner, config())) is KeptBatchInnerSteps
    assert KeptBatchInnerSteps.create(runner, config()) is not None
    assert KeptBatchInnerSteps.create(object(), config()) is None
    assert KeptBatchInnerSteps.create(runner, config(num_spec_tokens=2)) is None
    off = {"multi_step_batch_reuse": False}
    assert KeptBatchInnerSteps.create(runner, config(**off)) is None
    # the option's earlier name, read as its alias; the new name wins
    alias_off = {"multi_step_device_window": False}
    assert KeptBatchInnerSteps.create(runner, config(**alias_off)) is None
    both = {"multi_step_device_window": False, "multi_step_batch_reuse": True}
    assert KeptBatchInnerSteps.create(runner, config(**both)) is not None


def test_an_inner_step_of_the_same_requests_runs_on_the_kept_batch(kept):
    runner, inner_steps, forwards = kept
    inner_steps.execute(requests_running(["a", "b"]))
    assert forwards == [(["a", "b"], set())] and not runner.executed
    assert inner_steps.num_inner_kept == inner_steps.num_inner_steps == 1


def test_an_inner_step_of_other_requests_is_the_runners_and_its_batch_is_kept(kept):
    runner, inner_steps, forwards = kept
    inner_steps.execute(requests_running(["a"]))  # b left the window
    assert not forwards
    assert [s.num_scheduled_tokens for s in runner.executed] == [{"a": 1}]
    assert runner.executed[0].scheduled_cached_reqs.num_computed_tokens == [11]
    # the next step of "a" alone runs on the batch the runner built
    inner_steps.execute(requests_running(["a"]))
    assert forwards == [(["a"], set())]
    assert inner_steps.describe().startswith("50% of inner steps")


@pytest.mark.parametrize(
    "step_one",
    [
        step_of({"b": 1, "a": 1}),  # another order than the runner's
        step_of({"a": 1, "b": 1, "c": 1}),  # another request
        step_of({"a": 1, "b": 2}),  # prompt tokens
        step_of({"a": 1, "b": 1}, scheduled_new_reqs=[object()]),
    ],
)
def test_step_one_declines_a_batch_the_runner_would_build_otherwise(kept, step_one):
    runner, inner_steps, forwards = kept
    assert not inner_steps.execute_first(step_one)
    assert not forwards and not runner.calls  # nothing done
    assert (
        inner_steps.describe()
        .split(", ")[0]
        .endswith("0% of first steps on the batch of the step before")
    )


def test_step_one_of_the_same_decoding_requests_runs_on_the_kept_batch(kept):
    runner, inner_steps, forwards = kept
    inner_steps._attention = "kept"
    step_one = step_of({"a": 1, "b": 1}, finished_req_ids={"z"})
    assert inner_steps.execute_first(step_one)
    # the scheduler's output applied as the runner's execute_model applies it
    assert runner.calls == [
        "finish_requests",
        "free_states",
        "add_requests",
        "update_requests",
    ]
    assert forwards == [(["a", "b"], {"z"})]
    assert inner_steps._attention == "kept"  # no new blocks: refreshed in place
    step_one.scheduled_cached_reqs.new_block_ids = [([7],), None]
    assert inner_steps.execute_first(step_one)
    assert inner_steps._attention is None  # block tables to gather again
    # and it is sampled as an inner step, not by the runner's sample_tokens
    runner.execute_model_state = SimpleNamespace(
        input_batch=inner_steps._batch, hidden_states=torch.eye(3)[:2]
    )
    runner.postprocess_sampled = lambda *args: runner.calls.append("post_update")
    inner_steps.sample_first(None, executed_here=True)
    assert runner.calls[-1] == "post_update" and "sample_tokens" not in runner.calls


def test_a_structured_step_one_runs_on_the_kept_batch_masked_by_its_grammar(kept):
    """Step 1's grammar output (the engine core's, or the worker's rows:
    window_grammar.py) masks it as the runner's own `sample` masks a step."""
    runner, inner_steps, forwards = kept
    step_one = step_of({"a": 1, "b": 1}, has_structured_output_requests=True)
    assert inner_steps.execute_first(step_one)
    assert forwards == [(["a", "b"], set())] and not runner.executed
    runner.execute_model_state = SimpleNamespace(
        input_batch=inner_steps._batch, hidden_states=torch.eye(3)[:2]
    )
    runner.postprocess_sampled = lambda *args: runner.calls.append("post_update")
    # "b" may sample no token of the three: its largest logit (token 1) is
    # masked with the rest, and the draw falls to token 0.
    grammar = GrammarOutput(["b"], np.zeros((1, 1), dtype=np.int32))
    output = inner_steps.sample_first(grammar, executed_here=True)
    assert output.sampled_token_ids == [[0], [0]]
    assert "sample_tokens" not in runner.calls and "sample" not in runner.calls


def test_plain_sampling_draws_each_request_at_its_position():
    runner = Runner()
    inner_steps = KeptBatchInnerSteps(runner)
    batch = decode_batch(["a", "b"])
    hidden = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    output, num_sampled, num_rejected = inner_steps.sampling.sample(hidden, batch, None)
    assert output.sampled_token_ids.tolist() == [[1], [2]]
    assert num_sampled.tolist() == [1, 1] and num_rejected.tolist() == [0, 0]
    # Draws are keyed by (seed, position): each request's own position.
    (draw,) = runner.sampler.draws
    assert draw["pos"].tolist() == [10, 11]
    assert draw["input_ids"].tolist() == [0, 1]
    assert "sample" not in runner.calls
    sampling = inner_steps.sampling
    assert sampling.num_direct_steps == sampling.num_sampled_steps == 1


def test_each_sampled_step_is_claimed_and_the_window_scores_them(kept):
    """The steps' logprobs, left for the window's end (decode_sampling.py),
    are scored when the window finishes."""
    runner, inner_steps, _ = kept
    events = []
    inner_steps.sampling = SimpleNamespace(
        sample=runner.sample,
        claim=lambda output: events.append(("claim", output.req_ids)),
        score=lambda: events.append("score"),
    )
    runner.postprocess_sampled = lambda *args: None
    for _ in range(2):
        runner.execute_model_state = SimpleNamespace(
            input_batch=inner_steps._batch, hidden_states=torch.eye(3)[:2]
        )
        inner_steps.sample()
    inner_steps.finish_window()
    assert events == [("claim", ["a", "b"]), ("claim", ["a", "b"]), "score"]
