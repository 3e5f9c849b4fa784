#!/usr/bin/env bash
# Run a fixed selection of upstream vLLM v1 unit tests against an INSTALLED vllm.
#
# Usage: run.sh VENV_PYTHON SOURCE_TREE [pytest args...]
#   VENV_PYTHON  python of the venv whose installed `vllm` is under test
#   SOURCE_TREE  vLLM source tree; only its tests/ folder is used (copied)
#   extra args   passed to every pytest invocation (e.g. -x, -v)
#
# Env knobs:
#   MINIMAL=1        copy only the files the selection needs (default: whole tests/)
#   OPT_125M_DIR=D   serve "facebook/opt-125m" from files in D (e.g. the tiny llama)
#                    instead of the built-in OPT-125m config.json
#   KEEP=1           keep the temp dir (printed at the end)
#   UPSTREAM_RELEASE=V  which vLLM release the tree is (required): its expected counts and
#                    deselected ids are in tests/upstream_suite/V/
#   STRICT_COUNTS=1  also fail when a file's pass count differs from upstream's
#                    or a deselect id is stale / prefix-matches an unlisted test
#   FILE_TIMEOUT=s   wall limit of the pytest run (default 1800)
#
# Exit status: 0 only if the pytest run exited 0 (no failures/errors, >0 tests).
set -uo pipefail

PY=${1:?usage: run.sh VENV_PYTHON SOURCE_TREE [pytest args...]}
SRC=${2:?usage: run.sh VENV_PYTHON SOURCE_TREE [pytest args...]}
shift 2
SRC=$(cd "$SRC" && pwd) || exit 2
[ -d "$SRC/tests" ] || { echo "no tests/ in $SRC" >&2; exit 2; }
RELEASE_DIR=$(dirname "$0")/${UPSTREAM_RELEASE:?set UPSTREAM_RELEASE: the vLLM release of the tree}
[ -f "$RELEASE_DIR/expect.txt" ] && [ -f "$RELEASE_DIR/deselect.txt" ] || {
  echo "no expect.txt/deselect.txt in $RELEASE_DIR" >&2; exit 2; }

# The selection is the release's expect.txt: each file with the passes it has on the unpatched
# release with this script (informational unless STRICT_COUNTS=1). The files differ per release:
# vLLM 0.34.0 removed Model Runner V1's tests (test_gpu_input_batch.py) and our V1-runner family
# (contract.toml) is not laid into its tree. Every file src/tests/ holds (test_multi_step_*.py,
# test_token_texts.py, ...) is the overlay's own, in upstream's style. test_prefix_caching.py is
# back in the selection of 0.32.0 and 0.34.0 since 2026-12-05 (~3 s a release with the cleanup
# plugin below; it had cost 139 s).
declare -A EXPECT=()
FILES=()
while read -r f n; do EXPECT[$f]=$n; FILES+=("$f"); done < <(grep -v '^#' "$RELEASE_DIR/expect.txt" | grep .)

# Deselected ($RELEASE_DIR/deselect.txt): tests that cannot run here; see there.
mapfile -t DESELECT < <(grep -v '^#' "$RELEASE_DIR/deselect.txt" | grep .)

MINIMAL_FILES=(
  tests/__init__.py tests/conftest.py tests/ci_envs.py
  tests/models/__init__.py tests/models/utils.py tests/models/registry.py
  tests/v1/__init__.py
  tests/v1/core/__init__.py tests/v1/core/utils.py
  tests/v1/kv_connector/__init__.py tests/v1/kv_connector/unit/__init__.py
  tests/v1/kv_connector/unit/utils.py
  tests/v1/worker/__init__.py tests/v1/executor/__init__.py tests/v1/spec_decode/__init__.py
  tests/v1/sample/__init__.py tests/v1/engine/__init__.py
  tests/distributed/__init__.py tests/distributed/conftest.py tests/distributed/test_events.py
  "${FILES[@]}"
)

# ---- preflight: the venv must have pytest + tblib (tests/conftest.py imports tblib)
# and multiprocess (test_shm_broadcast.py; the version vLLM's CPU test requirements pin)
if ! "$PY" -c "import pytest, tblib, multiprocess" 2>/dev/null; then
  echo "venv lacks pytest/tblib/multiprocess; install with:" >&2
  echo "  $PY -m pip install pytest==9.1.0 tblib==3.1.0 multiprocess==0.70.16 dill==0.3.8" >&2
  exit 2
fi

WORK=$(mktemp -d /tmp/vllm-upstream-tests.XXXXXX)
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi

# ---- copy tests (never the source vllm/ package)
if [ "${MINIMAL:-0}" = 1 ]; then
  for f in "${MINIMAL_FILES[@]}"; do
    install -D -m644 "$SRC/$f" "$WORK/$f" || { echo "missing $SRC/$f" >&2; exit 2; }
  done
else
  cp -r "$SRC/tests" "$WORK/tests" || exit 2
fi
# Upstream's per-test cleanup without its whole-heap gc.collect() (see the plugin's docstring).
cp "$(dirname "$0")/cleanup_without_gc.py" "$WORK/" || exit 2
cat > "$WORK/pytest.ini" <<'EOF'
[pytest]
markers =
    slow_test
    skip_global_cleanup
    core_model: enable this model test in each PR instead of only nightly
    hybrid_model: models that contain mamba layers
    cpu_model: enable this model test in CPU tests
    cpu_test: mark test as CPU-only test
    split: run this test as part of a split
    distributed: run this test only in distributed GPU tests
    optional: optional tests that are automatically skipped, include --optional to run them
EOF

# ---- offline HF cache that resolves "facebook/opt-125m" (config only is enough)
SNAP=$WORK/hf/hub/models--facebook--opt-125m/snapshots/0000000000000000000000000000000000000000
mkdir -p "$SNAP" "$WORK/hf/hub/models--facebook--opt-125m/refs"
printf 0000000000000000000000000000000000000000 > "$WORK/hf/hub/models--facebook--opt-125m/refs/main"
if [ -n "${OPT_125M_DIR:-}" ]; then
  cp "$OPT_125M_DIR"/*.json "$SNAP"/ || exit 2
else
  cat > "$SNAP/config.json" <<'EOF'
{
  "_name_or_path": "facebook/opt-125m",
  "activation_dropout": 0.0,
  "activation_function": "relu",
  "architectures": ["OPTForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 2,
  "do_layer_norm_before": true,
  "dropout": 0.1,
  "eos_token_id": 2,
  "ffn_dim": 3072,
  "hidden_size": 768,
  "init_std": 0.02,
  "layerdrop": 0.0,
  "max_position_embeddings": 2048,
  "model_type": "opt",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 1,
  "prefix": "</s>",
  "torch_dtype": "float16",
  "transformers_version": "4.21.0.dev0",
  "use_cache": true,
  "vocab_size": 50272,
  "word_embed_proj_dim": 768
}
EOF
fi

cd "$WORK" || exit 2
unset PYTHONPATH VLLM_MODEL_REDIRECT_PATH
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_CACHE="$WORK/hf/hub" \
       HF_HUB_DISABLE_TELEMETRY=1 PYTHONDONTWRITEBYTECODE=1

# ---- the installed vllm must be the one imported (not the source tree)
VLLM_AT=$("$PY" -c "import vllm,os;print(os.path.realpath(vllm.__file__))" 2>/dev/null | tail -1)
case "$VLLM_AT" in
  "") echo "cannot import vllm with $PY" >&2; exit 2;;
  "$SRC"/*) echo "vllm imported from source tree ($VLLM_AT); refusing" >&2; exit 2;;
esac
echo "vllm under test: $VLLM_AT ($("$PY" -c 'import vllm;print(vllm.__version__)' 2>/dev/null | tail -1))"
echo "tests from: $SRC/tests -> $WORK"

DESEL_ARGS=()
for d in "${DESELECT[@]}"; do DESEL_ARGS+=(--deselect "$d"); done

# ---- warn if a deselect id no longer exists (pytest ignores unknown ids silently)
# and if --deselect (a node-id PREFIX match) would also drop an unlisted test.
# It runs beside the first test group (one core each) and is waited for before the summary.
printf '%s\n' "${DESELECT[@]}" > "$WORK/deselect.txt"
check_selection() {
"$PY" -m pytest -p no:cacheprovider --collect-only -q "${FILES[@]}" > "$WORK/collected.txt" 2>&1
"$PY" - "$WORK/collected.txt" "$WORK/deselect.txt" <<'EOF'
import sys
bad = 0
col = {l.strip() for l in open(sys.argv[1]) if "::" in l}
des = [l.strip() for l in open(sys.argv[2]) if l.strip()]
for d in des:
    if d not in col:
        print("WARNING: deselect id not collected:", d); bad = 1
for c in sorted(col):
    if c not in des and any(c.startswith(d) for d in des):
        print("WARNING: unlisted test deselected by prefix match:", c); bad = 1
sys.exit(3 if bad else 0)
EOF
}
T0=$(date +%s)
check_selection > "$WORK/selection.txt" 2>&1 &
SELECTION_PID=$!
RC=0
# Two pytest processes instead of one a file (vLLM and torch are imported once
# each, ~15 s on the test machines): the distributed tests, whose ranks and
# process groups do not share a process with the others' (measured: one
# test_shm_broadcast.py test fails after the other files in one process), and
# the rest. The per-file counts come from their JUnit reports.
DIST=(); REST=()
for f in "${FILES[@]}"; do case "$f" in tests/distributed/*) DIST+=("$f");; *) REST+=("$f");; esac; done
for group in rest dist; do
  if [ $group = rest ]; then files=("${REST[@]}"); else files=("${DIST[@]}"); fi
  timeout "${FILE_TIMEOUT:-1800}" "$PY" -m pytest -p no:cacheprovider -p cleanup_without_gc -q -rfEs \
      --junitxml="$WORK/junit-$group.xml" "${DESEL_ARGS[@]}" "$@" "${files[@]}" > "$WORK/pytest-$group.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && { RC=1; echo "---- pytest $group (rc=$rc) ----"; grep -E '^(FAILED|ERROR)' "$WORK/pytest-$group.log"; tail -5 "$WORK/pytest-$group.log"; }
done
wait "$SELECTION_PID"
SELECTION_OK=$?
cat "$WORK/selection.txt"
[ "$SELECTION_OK" -ne 0 ] && [ "${STRICT_COUNTS:-0}" = 1 ] && RC=1
echo "================ summary ================"
EXPECTED=$(for f in "${FILES[@]}"; do echo "$f ${EXPECT[$f]}"; done)
EXPECTED="$EXPECTED" "$PY" - "$WORK"/junit-*.xml <<'EOF'
import os, sys, xml.etree.ElementTree as ET
passed, seconds = {}, {}
for case in (c for report in sys.argv[1:] for c in ET.parse(report).iter("testcase")):
    parts = case.get("classname", "").split(".")  # tests.v1.core.test_scheduler[.Class]
    module = next(i for i, part in enumerate(parts) if part.startswith("test_"))
    path = "/".join(parts[: module + 1]) + ".py"
    seconds[path] = seconds.get(path, 0.0) + float(case.get("time", 0))
    if not any(child.tag in ("failure", "error", "skipped") for child in case):
        passed[path] = passed.get(path, 0) + 1
differs = False
for line in os.environ["EXPECTED"].splitlines():
    path, expect = line.split()
    got = passed.get(path, 0)
    differs |= got != int(expect)
    note = "" if got == int(expect) else f" (upstream: {expect} passed)"
    print(f"{path:<48} {seconds.get(path, 0):6.0f}s  {got} passed{note}")
sys.exit(4 if differs else 0)
EOF
[ $? -ne 0 ] && [ "${STRICT_COUNTS:-0}" = 1 ] && RC=1
echo "total wall: $(( $(date +%s)-T0 ))s; result: $([ $RC -eq 0 ] && echo PASS || echo FAIL)"
[ "${KEEP:-0}" = 1 ] && echo "kept: $WORK"
exit $RC
