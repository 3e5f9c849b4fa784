"""Served traffic mixes offline: one build's `LLM`, the plain and production mixes of
traffic_client.py all at once, alternating, to compare what a mix costs a build.

Run it with a build's python (a venv of benchmarks/harness/builds.py, or a copy of one with some
modules swapped: an A/B of a change to our modules needs no rebuild):

  build/venvs/overlay-0.34.0/bin/python benchmarks/offline_mix.py LABEL REPEATS STEPS [OUT.jsonl]

One engine start (the tiny benchmark model, float32, N = STEPS), a warm-up pair, then REPEATS
pairs of runs of 160 requests each, the mixes' order alternating; a line of JSON per run (label,
repeat, mix, seconds, output tokens), appended to OUT.jsonl when given. Offline there is no HTTP
server sharing the cores, so a mix's cost moves less between runs than through `vllm serve`
(docs/benchmarks.md); compare tokens/s of the two mixes within one engine's pairs.
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from traffic_client import requests_of  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

MIXES = ("plain", "production")
NUM_REQUESTS = 160


def sampling_params(request: dict) -> SamplingParams:
    """The request's parameters as the server would build them from its body."""
    body = request["body"]
    structured = body.get("structured_outputs")
    extra = {"structured_outputs": StructuredOutputsParams(json=structured["json"])} if structured else {}
    return SamplingParams(**request["params"], ignore_eos=body.get("ignore_eos", False), **extra)


def main() -> None:
    label, repeats, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    llm = LLM(model=str(ROOT / "build" / "models" / "bench-tiny"), dtype="float32", max_model_len=1024, seed=0,
              num_scheduler_steps=steps)  # fmt: skip
    for repeat in range(repeats + 1):  # repeat 0 warms up
        for mix in MIXES if repeat % 2 == 0 else MIXES[::-1]:
            requests = requests_of(mix, NUM_REQUESTS, repeat)
            prompts = [{"prompt_token_ids": r["prompt"]} for r in requests]
            start = time.perf_counter()
            outputs = llm.generate(prompts, [sampling_params(r) for r in requests], use_tqdm=False)
            seconds = time.perf_counter() - start
            if repeat:
                tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                line = json.dumps({"label": label, "repeat": repeat, "mix": mix, "s": seconds, "tokens": tokens})
                print(line, flush=True)
                if out is not None:
                    with out.open("a") as f:
                        f.write(line + "\n")


if __name__ == "__main__":
    main()
