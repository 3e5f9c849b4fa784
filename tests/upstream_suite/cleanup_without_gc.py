"""pytest plugin for run.sh: upstream's per-test cleanup without its full garbage collection.

vLLM's tests/conftest.py runs `cleanup_dist_env_and_memory()` after every test unless the test
carries the `skip_global_cleanup` marker (the fixture `should_do_global_cleanup_after_test`,
whose docstring offers skipping it as "a ~10x speedup for non-GPU unit tests"). On CPU that
cleanup is four things: the env-var cache reset, the model-parallel and distributed teardown, and
a `gc.collect()` of the whole heap (vLLM and torch imported: ~0.27 s, most of each selected test's
0.4 s on the 2-core machines; without it this run took 79 s instead of 294 s on 0.32.0 and 251 s
on 0.34.0, measured 2026-12-05). The GPU parts never run on CPU.

This plugin gives every test upstream's own marker and does the first three parts itself, so a
test still starts with the env cache off and no process group left by the one before. The heap
collection is the part left out: the selected tests create no GPU memory to free, and those that
depend on collection call `gc.collect()` themselves. run.sh's STRICT_COUNTS check still compares
each file's pass count with the unpatched release's.
"""

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker("skip_global_cleanup")


@pytest.fixture(autouse=True)
def cleanup_without_gc():
    yield
    from vllm import envs
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    envs.disable_envs_cache()
    destroy_model_parallel()
    destroy_distributed_environment()
