#!/bin/bash
# Runs on the lent GPU machine from the repo root, with .gpu/ carried (prepare_bundle.py).
# Installs the carried requirements, lays out the upstream and overlay Python trees
# (overlay = upstream + the files the series changes), applies the same stand-ins to
# both, then runs device_check.py (its env and engine settings are the same for both).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/up
start=$(date +%s)
say() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - start ))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl \
    >"$OUT/install.log" 2>&1 || { say "pip install failed"; tail -20 "$OUT/install.log"; }
say "wheels installed"
tar -xJf .gpu/up.tar.xz -C /tmp/up
# The overlay's dist-info replaces upstream's (its version is the overlay's)
cp -a /tmp/up /tmp/ov && rm -rf /tmp/ov/vllm-*.dist-info && tar -xJf .gpu/ov.tar.xz -C /tmp/ov
for t in /tmp/up /tmp/ov; do
    # The compiled op library the CUDA platform imports: stand-in (stub_kernels.py says what it holds)
    cp benchmarks/gpu/stub_kernels.py $t/vllm/_C_stable_libtorch.py
    # Every CUDA start imports this warmup, whose model package needs `cutlass` (absent here);
    # it does nothing for a model without MiniMax-M3's sparse attention
    cp benchmarks/gpu/minimax_m3_msa_warmup_noop.py $t/vllm/model_executor/warmup/minimax_m3_msa_warmup.py
    # No compiled flash attention here: keep the package importable (Triton attention is used)
    sed -i 's/^if not (FA2_AVAILABLE or FA3_AVAILABLE):/if False:/' $t/vllm/vllm_flash_attn/__init__.py
    grep -q '^if False:' $t/vllm/vllm_flash_attn/__init__.py || say "WARNING: flash-attn import check not neutralised in $t"
done
say "trees laid out: $(ls /tmp/ov/vllm-*.dist-info -d | xargs -n1 basename), $(tar -tJf .gpu/ov.tar.xz | grep -c '\.py$') overlay files"
PYTHONUNBUFFERED=1 python3 benchmarks/gpu/device_check.py 2>&1 | tee "$OUT/device_check.log"
say "device_check finished"
