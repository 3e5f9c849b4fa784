"""The differential fuzzer's fixed-seed slice (overlay/fuzz/), in the test run.

Each CI configuration runs its regression batches (the crashes of issue 18,
kept as scenarios) and a fixed-seed set of random mixed batches on the overlay
and on the upstream wheel, on the parity run's engine where one has the same
config (fuzz.parity_key) and in an engine of its own otherwise; every request must
match as fuzz.compare_request says. The configurations are the release's
(fuzz.ci_configs: windows where it has them, single steps on vLLM 0.34.0). Not
vacuous: about half of the slice's requests are compared token for token (493
of ~1,070 over the four window configs when measured), the rest structurally,
as prefixes (aborted) or as refusals, and each kind occurs.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from overlay import fuzz

# Runs on every supported release (apply.py test): each release's own builds.
pytestmark = pytest.mark.every_release


@pytest.fixture(scope="module")
def runner(upstream_python, overlay_python, models, parity_run, tmp_path_factory):
    """The fuzzer's runner; batches whose engine config a parity run has run there (conftest)."""

    def shared(build: str, config: fuzz.Config, batches: list[dict]) -> dict | None:
        key = fuzz.parity_key(build, config)
        return None if key is None else fuzz.slice_results(key, parity_run(*key), batches)

    pythons = {"upstream": upstream_python, "overlay": overlay_python}
    return fuzz.Runner(pythons, models, tmp_path_factory.mktemp("fuzz"), shared=shared)


@pytest.fixture(scope="module")
def slice_run(runner):
    """name -> (report, requests by how they were compared) of the fixed-seed slice on that
    configuration, run once, by whichever test asks first: each test gets its data from here,
    never from what another test happened to leave behind."""
    done: dict[str, tuple[dict, Counter]] = {}

    def run(name: str) -> tuple[dict, Counter]:
        if name not in done:
            before = Counter(runner.kinds)
            report = fuzz.fuzz(runner, [name], fuzz.CI_SEED, fuzz.CI_PER_CONFIG, deadline=None)
            done[name] = report, Counter(runner.kinds) - before
        return done[name]

    return run


@pytest.mark.parametrize("name", fuzz.ci_configs())
def test_fuzz_slice_matches_upstream(slice_run, name):
    report, _kinds = slice_run(name)
    assert not report["failures"], json.dumps(report["failures"], indent=1)[:20000]
    expected = fuzz.CI_PER_CONFIG + len(fuzz.REGRESSIONS.get(name, []))
    assert report["batches"] == expected, report  # every batch ran on both builds and was compared


def test_fuzz_slice_was_not_vacuous(slice_run):
    """What the slice's comparisons covered, over all its configs (run alone, it runs the slice)."""
    names = fuzz.ci_configs()
    kinds = sum((slice_run(name)[1] for name in names), Counter())
    # measured: 493 exact over the four window configs (0.32.0), 184 over default-N1 (0.34.0)
    assert kinds["exact"] >= 100 * len(names), kinds
    assert all(kinds[k] > 0 for k in ("prefix", "structural", "rejected")), kinds
