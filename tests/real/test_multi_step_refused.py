"""Where a release has no multi-step windows (vLLM 0.34.0 until they run on Model Runner V2),
the option is refused at startup with the reason, and nothing else changes.

The worker side of multi-step decode is written for Model Runner V1, which vLLM 0.34.0 removed
(contract.toml's v1-runner family is not laid into its tree), so `--num-scheduler-steps N`,
`LLM(num_scheduler_steps=N)` and the `--additional-config '{"multi_step": N}'` alias must stop
before a model loads, saying why; N = 1 (the default) starts as upstream does.
"""

from __future__ import annotations

import json

import pytest
from support.engines import run_env
from support.venvs import release_has_windows

pytestmark = pytest.mark.every_release

CHECKS = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs

def resolve(**kw):
    try:
        cfg = EngineArgs(model=sys.argv[1], max_model_len=512, **kw).create_engine_config()
        return {"steps": cfg.scheduler_config.num_scheduler_steps}
    except Exception as e:  # the message is what a user sees
        return {"error": f"{type(e).__name__}: {e}"}
print("RESULT" + json.dumps({
    "flag": resolve(num_scheduler_steps=8),
    "alias": resolve(additional_config={"multi_step": 4}),
    "plain": resolve(),
    "one": resolve(num_scheduler_steps=1),
}))
"""


def test_refused_where_windows_cannot_run(overlay_python, tiny_llama, tmp_path):
    if release_has_windows():
        pytest.skip("this release runs multi-step windows (test_multi_step.py)")
    script = tmp_path / "refused.py"
    script.write_text(CHECKS)
    proc = run_env(overlay_python, script, tiny_llama, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.split("RESULT", 1)[1])
    for key, steps in (("flag", 8), ("alias", 4)):
        error = got[key].get("error", "")  # a ValueError, as VllmConfig's validation reports it
        assert f"--num-scheduler-steps {steps}: multi-step decode is not available" in error, got
        assert "Model Runner V1" in error and "--num-scheduler-steps 1" in error, got
    assert got["plain"] == {"steps": 1} and got["one"] == {"steps": 1}, got
