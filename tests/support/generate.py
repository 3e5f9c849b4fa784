"""Run prompts through ``vllm.LLM`` and write the outputs as JSON.

Runs inside a venv holding one vLLM build (upstream or overlay), so the same
spec can be run on both and the outputs compared token for token.
Usage: python generate.py SPEC.json OUT.json, where SPEC is
{"llm": {LLM kwargs}, "cases": [{"prompts": [...], "params": {SamplingParams kwargs}}]}.
"""

import json
import sys


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    from vllm import LLM, SamplingParams

    llm = LLM(**spec["llm"])
    cases = []
    for case in spec["cases"]:
        results = llm.generate(case["prompts"], SamplingParams(**case["params"]), use_tqdm=False)
        cases.append(
            [
                [{"token_ids": list(c.token_ids), "text": c.text, "finish_reason": c.finish_reason} for c in r.outputs]
                for r in results
            ]
        )
    with open(sys.argv[2], "w") as f:
        json.dump({"cases": cases}, f)


if __name__ == "__main__":
    main()
