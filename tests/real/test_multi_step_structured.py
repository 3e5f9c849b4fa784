"""Structured output inside windows (patch 0016) against upstream through ``vllm.LLM``.

On Model Runner V2 a batch that holds structured-output requests runs windows: step 1 is
masked by the engine core's bitmask, each inner step by the worker's own copy of each
request's grammar (vllm/v1/worker/gpu/multi_step/window_grammar.py); under async scheduling
(the overlay's default) step 1 too, once a request's copy followed it through a window, so
that the engine core need not wait for the tokens in flight (patch 0021). The overlay with
``--num-scheduler-steps 8`` must give upstream's tokens exactly for every request of every
batch: each structured-output option vLLM takes (JSON schema, json_object, regex, choice,
grammar, structural tags), beside plain requests in the same batch, greedy and seeded, with
the xgrammar and the guidance backend (one engine each: vLLM holds one backend per engine),
and with a reasoning parser, where the grammar starts only after the request's reasoning
ends: in its prompt, or at a ``</think>`` it samples inside a window.

The model is the tiny Llama with two of its tokens renamed ``<think>`` and ``</think>``
(DeepSeek-R1's reasoning parser looks them up by name). Not vacuous: the oracle's outputs
keep to their constraints, reasoning ends mid-output in several requests, the overlay ran
far fewer engine steps than upstream (windows, not single steps), and its worker never gave
up following a grammar.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from support.engines import generate
from support.parity import (
    BASE,
    CHOICES,
    PROMPTS,
    SCHEMA,
    STOP_IDS,
    STRUCTURED_OPTIONS,
    assert_same_outputs,
)
from support.venvs import windows_runner

pytestmark = [pytest.mark.every_release, pytest.mark.usefixtures("windows")]

THINK, END_THINK = 510, 511  # the ids renamed in the model's tokenizer
OPTIONS = STRUCTURED_OPTIONS
# Plain requests in every batch: windows hold structured and plain requests together.
PLAIN = [
    {"temperature": 0.0, "max_tokens": 30, "ignore_eos": True},
    {"temperature": 0.8, "seed": 11, "stop_token_ids": STOP_IDS, "max_tokens": 30},
]


def _batch(option: dict) -> dict:
    """Four structured requests whose reasoning ended in the prompt (two greedy, two seeded)
    and the plain ones."""
    structured = [
        {"temperature": 0.0 if i < 2 else 0.9, "seed": i, "max_tokens": 40, "structured_outputs": option}
        for i in range(4)
    ]
    prompts = [f"{p} </think>" for p in PROMPTS[:4]] + PROMPTS[4:6]
    return {"prompts": prompts, "params": structured + PLAIN}


# Requests that reason first: </think> made likely (logit_bias), so it is sampled a few
# tokens in, inside a window; the JSON schema applies from the token after it (and the bias
# stays: the grammar masks </think> out).
REASONING = {
    "prompts": PROMPTS[:6] + PROMPTS[6:7],
    "params": [
        {
            "temperature": 0.9,
            "seed": 100 + i,
            "max_tokens": 60,
            "min_tokens": 4,  # no EOS while it reasons its first tokens
            "logit_bias": {str(END_THINK): 5.0 + i % 3},
            "structured_outputs": {"json": SCHEMA},
        }
        for i in range(6)
    ]
    + PLAIN[:1],
}
CASES = [_batch(option) for option in OPTIONS.values()] + [REASONING]
BACKENDS = ("xgrammar", "guidance")
STEPS = "vllm:iteration_tokens_total_count"  # engine steps that produced output
WINDOWS = re.compile(
    r"Multi-step decode on Model Runner V2 \((\w+), (\w+)\): (\d+) windows, ([\d.]+) steps per window, "
    r"\d+ yielded to arrivals, (\d+) with step 1 masked by the worker"
)


@pytest.fixture(scope="module")
def think_model(tiny_llama, tmp_path_factory):
    """The tiny Llama, two of its tokens renamed <think> and </think> (added tokens, so text
    holding them is split there): the same weights, so the same vocabulary size."""
    out = tmp_path_factory.mktemp("models") / "tiny-llama-think"
    shutil.copytree(tiny_llama, out)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    names = {i: s for s, i in vocab.items()}
    for token_id, name in ((THINK, "<think>"), (END_THINK, "</think>")):
        old = names[token_id]
        del vocab[old]
        vocab[name] = token_id
        merges = tokenizer["model"]["merges"]
        tokenizer["model"]["merges"] = [m for m in merges if "".join(m if isinstance(m, list) else m.split()) != old]
        tokenizer["added_tokens"].append(
            {"id": token_id, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
        )  # fmt: skip
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    return out


@pytest.fixture(scope="module")
def structured_run(upstream_python, overlay_python, think_model, tmp_path_factory):
    """structured_run(build, backend) -> outputs, each engine started once."""
    if windows_runner() != "mrv2":
        pytest.skip("structured output runs single steps on Model Runner V1 (test_multi_step.py)")
    done: dict[tuple[str, str], dict] = {}
    tmp = tmp_path_factory.mktemp("structured")

    def _run(build: str, backend: str) -> dict:
        if (build, backend) not in done:
            llm = {
                **BASE,
                "model": str(think_model),
                "structured_outputs_config": {"backend": backend, "reasoning_parser": "deepseek_r1"},
            }
            if build == "overlay":
                llm["num_scheduler_steps"] = 8
            python = upstream_python if build == "upstream" else overlay_python
            outputs, log = generate(python, {"llm": llm, "cases": CASES}, tmp, f"{build}-{backend}")
            done[build, backend] = {**outputs, "engine_log": log}
        return done[build, backend]

    return _run


@pytest.mark.parametrize("backend", BACKENDS)
def test_structured_windows_match_upstream(structured_run, backend):
    ours, theirs = structured_run("overlay", backend), structured_run("upstream", backend)
    assert_same_outputs(ours, theirs, cases=CASES)


@pytest.mark.parametrize("backend", BACKENDS)
def test_structured_requests_ran_in_windows(structured_run, backend):
    """Far fewer engine steps than upstream's one per token, and the worker followed every
    grammar (it logs a request it stops following, whose windows end after step 1)."""
    ours, theirs = structured_run("overlay", backend), structured_run("upstream", backend)
    ratio = ours["counters"][STEPS] / theirs["counters"][STEPS]
    assert ratio < 0.45, ratio
    log = ours["engine_log"]
    windows = WINDOWS.findall(log)
    assert windows and float(windows[-1][3]) > 2, windows
    # under async scheduling the worker masked the step 1 of windows whose structured requests
    # had tokens in flight, their copies having followed them through a window before
    assert int(windows[-1][4]) > 0, windows
    assert "runs single steps from here" not in log
    assert "grammar rejected tokens" not in log


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_oracle_was_constrained(structured_run, backend):
    """Upstream's own outputs show the grammars applied and reasoning ending mid-output, so the
    comparison above covers masked inner steps, before and after reasoning ends."""
    theirs = structured_run("upstream", backend)
    choice = theirs["cases"][list(OPTIONS).index("choice")]
    assert all(r["outputs"][0]["text"] in CHOICES for r in choice[:4]), choice
    json_case = theirs["cases"][list(OPTIONS).index("json")]
    assert all(r["outputs"][0]["text"].startswith("{") for r in json_case[:4])
    reasoning = theirs["cases"][-1][:6]
    outputs = [r["outputs"][0]["token_ids"] for r in reasoning]
    ended = [ids.index(END_THINK) for ids in outputs if END_THINK in ids]
    assert len(ended) >= 3 and max(ended) >= 1, ended
