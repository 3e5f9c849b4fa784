# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode on Model Runner V1 (vllm/v1/worker/gpu_model_runner.py,
vLLM up to 0.33.0; vllm-overlay), frozen apart from fixes: it leaves with the
last release whose CPU wheel runs that runner. Windows on Model Runner V2 are
in vllm/v1/worker/gpu/multi_step/.

- `window`: the worker's hooks; each window on the device or step by step.
- `device_window`: inner steps on the device where the batch allows.
- `lean_step`: a step-by-step inner step without the runner's whole host path.
- `spec_window`: windows with speculative decoding.
- `steps`: the scheduler output of an inner step.
"""
