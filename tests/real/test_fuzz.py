"""The differential fuzzer's fixed-seed slice (tests/support/fuzz.py), in the test run.

Each CI configuration runs its regression batches (the crashes of issue 18,
kept as scenarios) and a fixed-seed set of random mixed batches on the overlay
and on the upstream wheel, on the parity run's engine where one has the same
config (fuzz.parity_key) and in an engine of its own otherwise; every request must
match as fuzz.compare_request says. Not vacuous: about half of the slice's
~1,070 requests are compared token for token (493 when measured), the rest
structurally, as prefixes (aborted) or as refusals, and each kind occurs.
"""

from __future__ import annotations

import json

import pytest
from support import fuzz

# Runs on every supported release (apply.py test): each release's own builds.
pytestmark = [pytest.mark.every_release, pytest.mark.engine_parity]


@pytest.fixture(scope="module")
def runner(upstream_python, overlay_python, models, parity_run, tmp_path_factory):
    """The fuzzer's runner; batches whose engine config a parity run has run there (conftest)."""

    def shared(build: str, config: fuzz.Config, batches: list[dict]) -> dict | None:
        key = fuzz.parity_key(build, config)
        return None if key is None else fuzz.slice_results(key, parity_run(*key), batches)

    pythons = {"upstream": upstream_python, "overlay": overlay_python}
    return fuzz.Runner(pythons, models, tmp_path_factory.mktemp("fuzz"), shared=shared)


@pytest.mark.parametrize("name", fuzz.ci_configs())
def test_fuzz_slice_matches_upstream(runner, name):
    report = fuzz.fuzz(runner, [name], fuzz.CI_SEED, fuzz.CI_PER_CONFIG, deadline=None)
    assert not report["failures"], json.dumps(report["failures"], indent=1)[:20000]
    expected = fuzz.CI_PER_CONFIG + len(fuzz.REGRESSIONS.get(name, []))
    assert report["batches"] == expected, report  # every batch ran on both builds and was compared


def test_fuzz_slice_was_not_vacuous(runner):
    """Runs after the slice: what the comparisons covered, over all its configs."""
    kinds = runner.kinds
    assert kinds.get("exact", 0) >= 400, kinds
    assert all(kinds.get(k, 0) > 0 for k in ("prefix", "structural", "rejected")), kinds


def test_regressions_reproduce_the_reported_shapes():
    """The kept scenarios are the reported ones: the crash shapes of issue 18."""
    mixed, stops_after_min = fuzz.REGRESSIONS["default-N8"]
    assert fuzz.REGRESSIONS["default-N8-sync"] == [mixed, stops_after_min]
    waiting, joining = stops_after_min["requests"]  # patch 0010: a penalties request joins a min_tokens one
    assert waiting["params"]["min_tokens"] > 8 and joining["arrive"] > 0 and joining["params"]["frequency_penalty"]
    with_logprobs = [r for r in mixed["requests"] if "logprobs" in r["params"]]
    assert len(mixed["requests"]) == 16 and len(with_logprobs) == 3
    assert max(r["params"]["max_tokens"] for r in with_logprobs) < min(
        r["params"]["max_tokens"] for r in mixed["requests"] if r not in with_logprobs
    )
    config = fuzz.CONFIGS["draft-N4-budget64"]
    assert config.drafter == "draft_model" and config.steps == 4 and config.llm["max_num_batched_tokens"] == 64
    draft_budget, *top_k = fuzz.REGRESSIONS["draft-N4-budget64"]
    assert len(draft_budget["requests"]) == 4
    assert all(b["requests"][0]["params"]["top_k"] and b["requests"][0]["params"]["temperature"] for b in top_k)
