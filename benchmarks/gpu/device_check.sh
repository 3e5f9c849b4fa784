#!/bin/bash
# Runs on the lent GPU machine from the repo root, with .gpu/ carried (prepare_bundle.py).
# Installs the carried requirements, lays out the upstream and overlay Python trees
# (overlay = upstream + the files the series changes), then runs device_check.py.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/up
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl \
    >"$OUT/install.log" 2>&1 || { echo "pip install failed"; tail -20 "$OUT/install.log"; }
tar -xJf .gpu/up.tar.xz -C /tmp/up
cp -a /tmp/up /tmp/ov && rm -rf /tmp/ov/vllm-0.32.0.dist-info && tar -xJf .gpu/ov.tar.xz -C /tmp/ov
for t in /tmp/up /tmp/ov; do
    cp benchmarks/gpu/stub_kernels.py $t/vllm/_C_stable_libtorch.py
    # No compiled flash attention here: keep the package importable (Triton attention is used)
    sed -i 's/^if not (FA2_AVAILABLE or FA3_AVAILABLE):/if False:/' $t/vllm/vllm_flash_attn/__init__.py
done
echo "setup took $(( $(date +%s) - start )) s"
PYTHONUNBUFFERED=1 python3 benchmarks/gpu/device_check.py 2>&1 | tee "$OUT/device_check.log"
