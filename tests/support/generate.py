"""Run prompts through ``vllm.LLM`` and write the outputs as JSON.

Runs inside a venv holding one vLLM build (upstream or overlay), so the same
spec can be run on both and the outputs compared token for token.

Usage: python generate.py SPEC.json OUT.json, where SPEC is
{"llm": {LLM kwargs}, "cases": [{"prompts": [...], "params": {SamplingParams kwargs}}]}.
OUT holds, per case and prompt, each completion's token ids, text, finish
reason and logprobs, the prompt logprobs, the engine's resolved async
scheduling setting, and the engine's counters after all cases (preemptions,
prefix-cache hits, spec-decode acceptance, engine steps) so tests can show a
feature was really exercised.
"""

import json
import sys


def _logprobs(entries) -> list | None:
    """Per position: [[token_id, logprob, rank], ...] sorted by token id."""
    if entries is None:
        return None
    return [None if pos is None else sorted([tid, lp.logprob, lp.rank] for tid, lp in pos.items()) for pos in entries]


def _counters(llm) -> dict[str, float]:
    from vllm.v1.metrics.reader import Counter, Gauge, Histogram

    totals: dict[str, float] = {}
    for metric in llm.get_metrics():
        if isinstance(metric, (Counter, Gauge)):
            totals[metric.name] = totals.get(metric.name, 0) + metric.value
        elif isinstance(metric, Histogram):  # e.g. vllm:iteration_tokens_total_count: engine steps
            totals[metric.name + "_count"] = totals.get(metric.name + "_count", 0) + metric.count
    return totals


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    from vllm import LLM, SamplingParams

    llm = LLM(**{"disable_log_stats": False, **spec["llm"]})
    cases = []
    for case in spec["cases"]:
        params = dict(case["params"])
        if "structured_outputs" in params:  # e.g. {"json": schema}
            from vllm.sampling_params import StructuredOutputsParams

            params["structured_outputs"] = StructuredOutputsParams(**params["structured_outputs"])
        results = llm.generate(case["prompts"], SamplingParams(**params), use_tqdm=False)
        cases.append(
            [
                {
                    "prompt_logprobs": _logprobs(r.prompt_logprobs),
                    "outputs": [
                        {
                            "token_ids": list(c.token_ids),
                            "text": c.text,
                            "finish_reason": c.finish_reason,
                            "stop_reason": c.stop_reason,
                            "logprobs": _logprobs(c.logprobs),
                        }
                        for c in r.outputs
                    ],
                }
                for r in results
            ]
        )
    out = {
        "cases": cases,
        "counters": _counters(llm),
        "async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
    }
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
