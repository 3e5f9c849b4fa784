# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode on Model Runner V2 (vllm-overlay): the worker runs a
window of decode steps planned by one scheduler call.

- `window`: the worker's hooks; runs step 1 and the window's loop.
- `inner_steps`: how an inner step runs on a runner, one class per kind.
- `window_requests`: which requests run each step, and when they leave.
- `kept_batch`: inner steps on StandaloneCPUModelRunner's kept batch.
"""
