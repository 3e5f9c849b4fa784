# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""How a window's steps run on the model runner: one class per kind of inner
step, picked once per worker (`pick_inner_steps`).

Each kind executes step 1 (or leaves it to the runner's `execute_model`),
samples it, then executes and samples each inner step. Every kind computes
exactly what upstream's single step would: Model Runner V2 keeps each
request's state on the device (token history, last sampled token, computed
count, penalty counts, seeds keyed by position) and a step reads its inputs
from that state, so an inner step needs no state of ours, and upstream's own
sampler and `postprocess_sampled` (post_update) sample it.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.worker.gpu.multi_step.window_requests import (
    DraftedRequests,
    PlainRequests,
    WindowRequests,
    WindowStart,
)
from vllm.v1.worker.window_output import resolve_output

if TYPE_CHECKING:
    import torch

    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    # The runner's `sample`: (hidden states, input batch, grammar output) ->
    # (sampler output, num sampled, num rejected).
    SampleFn = Callable[
        [torch.Tensor, Any, GrammarOutput | None], tuple[Any, torch.Tensor, Any]
    ]


class InnerSteps:
    """A window's steps on one runner. This base runs them with the runner's
    own pieces: step 1 is the runner's whole step (`execute_model`, called by
    the worker, and `sample_tokens`); an inner step is the runner's
    `execute_model` on the output a single-step scheduler would send next,
    sampled by `sample_inner_step`."""

    def __init__(self, model_runner: "GPUModelRunner") -> None:
        self.model_runner = model_runner

    @classmethod
    def create(
        cls, model_runner: Any, vllm_config: "VllmConfig"
    ) -> "InnerSteps | None":
        """This kind for `model_runner`'s windows, or None where it does not
        run them."""
        return cls(model_runner)

    def requests(self, start: WindowStart) -> WindowRequests:
        """The tracker of a window's requests this kind's steps need."""
        return PlainRequests(start)

    def execute_first(self, step: SchedulerOutput) -> bool:
        """Execute a window's step 1 here, leaving it for `sample_first`; False
        where the worker's `execute_model` runs it (nothing is done then)."""
        return False

    def sample_first(
        self, grammar_output: "GrammarOutput | None", executed_here: bool
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        """Sample a step the worker executed (a window's step 1 or a plain
        step), or a step 1 that `execute_first` executed."""
        return self.model_runner.sample_tokens(grammar_output)

    def execute(self, requests: WindowRequests) -> None:
        """Execute the next inner step of `requests.running`."""
        self.model_runner.execute_model(requests.next_step())

    def sample(
        self, grammar_output: "GrammarOutput | None" = None
    ) -> ModelRunnerOutput:
        """Sample the inner step just executed, masked by `grammar_output`."""
        return sample_inner_step(
            self.model_runner, self.model_runner.sample, grammar_output
        )

    def finish_window(self) -> None:
        """Complete the outputs of the window's steps where sampling left part
        of them for its end (the steps' logprobs on the kept batch)."""

    def describe(self) -> str:
        """What the periodic log says of these steps, beyond the windows."""
        return ""


class RunnerInnerSteps(InnerSteps):
    """The runner's own pieces, on any Model Runner V2 runner."""


class DraftingInnerSteps(InnerSteps):
    """Steps that verify the drafts the runner's speculator proposed after the
    step before (they stay on the device; the step's scheduler output carries
    placeholders, as upstream's async scheduler sends them). The runner's
    whole `sample_tokens` samples each: rejection sampling, post_update by
    what was accepted (each request's next step starts where its accepted
    tokens end), and the next drafts."""

    @classmethod
    def create(
        cls, model_runner: Any, vllm_config: "VllmConfig"
    ) -> "InnerSteps | None":
        speculative_config = vllm_config.speculative_config
        if speculative_config is None:
            return None
        num_spec_tokens = speculative_config.num_speculative_tokens
        assert num_spec_tokens is not None
        return cls(model_runner, num_spec_tokens)

    def __init__(self, model_runner: "GPUModelRunner", num_spec_tokens: int) -> None:
        super().__init__(model_runner)
        self.num_spec_tokens = num_spec_tokens

    def requests(self, start: WindowStart) -> WindowRequests:
        return DraftedRequests(start, self.num_spec_tokens)

    def sample(
        self, grammar_output: "GrammarOutput | None" = None
    ) -> ModelRunnerOutput:
        # The scheduler plans no window with drafts for structured output.
        assert grammar_output is None, "drafted windows hold no grammar masks"
        return resolve_output(self.model_runner.sample_tokens(None))


def _kept_batch(
    model_runner: "GPUModelRunner", vllm_config: "VllmConfig"
) -> InnerSteps | None:
    if vllm_config.device_config.device_type != "cpu":
        return None
    # Imported here: the module loads the standalone CPU runner's kernels.
    from vllm.v1.worker.gpu.multi_step.kept_batch import KeptBatchInnerSteps

    return KeptBatchInnerSteps.create(model_runner, vllm_config)


# The kinds of inner step, in the order they are tried: the first that takes
# a runner runs its windows. The runner's own pieces take any runner.
KINDS: "tuple[Callable[[Any, VllmConfig], InnerSteps | None], ...]" = (
    DraftingInnerSteps.create,
    _kept_batch,
    RunnerInnerSteps.create,
)


def pick_inner_steps(
    model_runner: "GPUModelRunner", vllm_config: "VllmConfig"
) -> InnerSteps:
    """The kind of inner step that runs `model_runner`'s windows."""
    for kind in KINDS:
        inner_steps = kind(model_runner, vllm_config)
        if inner_steps is not None:
            return inner_steps
    raise AssertionError("RunnerInnerSteps takes any runner")


def sample_inner_step(
    model_runner: "GPUModelRunner",
    sample: "SampleFn",
    grammar_output: "GrammarOutput | None" = None,
) -> ModelRunnerOutput:
    """Sample the inner step the runner just executed with `sample` (the
    runner's, or a stand-in drawing the same tokens), its structured-output
    requests masked by `grammar_output`, and upstream's state update
    (`postprocess_sampled`: post_update advances computed counts, token
    history, last token, penalty counts).

    The rest of the runner's `sample_tokens` is left out: an inner step is a
    decode step of requests already running, so it has no prompt logprobs,
    and the KV connectors, auxiliary outputs and EPLB that would act per step
    are refused with windows (vllm/config/multi_step.py). Nor is a step's
    output copied or wrapped on its own: only what the window reads (token
    ids, logprob rows) is taken to the host.
    """
    executed = model_runner.execute_model_state
    model_runner.execute_model_state = None  # consumed, as sample_tokens does
    assert executed is not None and executed.hidden_states is not None
    step_batch = executed.input_batch
    step_sample, num_sampled, num_rejected = sample(
        executed.hidden_states, step_batch, grammar_output
    )
    model_runner.postprocess_sampled(
        step_batch.idx_mapping,
        step_sample.sampled_token_ids,
        num_sampled,
        num_rejected,
        step_batch.query_start_loc,
    )
    token_ids = step_sample.sampled_token_ids.tolist()
    for row, num_tokens in zip(token_ids, num_sampled.tolist(), strict=True):
        del row[num_tokens:]
    output = ModelRunnerOutput(req_ids=step_batch.req_ids, sampled_token_ids=token_ids)
    if step_sample.logprobs_tensors is not None:
        output.logprobs = step_sample.logprobs_tensors.tolists()
    if step_sample.num_nans is not None:
        output.num_nans_in_logits = dict(
            zip(step_batch.req_ids, step_sample.num_nans.tolist(), strict=True)
        )
    return output
