#!/usr/bin/env bash
# Nightly against upstream main: resolve main's head, rebase the series onto
# it, build against vLLM's precompiled wheel for that commit, run the tests,
# and leave the per-patch report in $REPORT_DIR (the workflow uploads it).
#
# Run from a clone of this repository; it rewrites the clone's series, patches/
# and upstream.lock, and drops the clone's other supported releases (releases/).
# Never push them from CI. Settings (environment):
#   UPSTREAM_URL  upstream repository      (default https://github.com/vllm-project/vllm)
#   UPSTREAM_REF  ref to follow            (default refs/heads/main)
#   WHEELS_URL    per-commit wheel index   (default https://wheels.vllm.ai: <commit>/ is a
#                 simple index holding the wheels vLLM's CI built from that commit)
#   WHEEL_URL     instead of the index: the wheel's URL, "{commit}" replaced by the commit
#                 (e.g. https://wheels.vllm.ai/{commit}/vllm-<ver>-cp38-abi3-manylinux_2_28_x86_64.whl)
#   TARGET        which wheel              (default cuda; vLLM builds CPU wheels per commit
#                 only on demand)
#   TEST_CMD      test command             (default: the tool tests and `check`)
#   REPORT_DIR    where reports go         (default build/nightly)
#   OVERLAY_ARGS  extra apply.py options   (tests: --series/--cache-dir of a synthetic project)
# Exit: 0 all passed; 1 a patch conflicts, its file is gone or it drifted, the build or the tests failed;
# otherwise the failing apply.py command's code (the table in overlay/errors.py): 2 bad
# input, 3 upstream or wheel could not be fetched, 5 git failed, 70 internal error.
set -uo pipefail
cd "$(dirname "$0")/.."
UPSTREAM_URL=${UPSTREAM_URL:-https://github.com/vllm-project/vllm}
UPSTREAM_REF=${UPSTREAM_REF:-refs/heads/main}
WHEELS_URL=${WHEELS_URL:-https://wheels.vllm.ai}
TARGET=${TARGET:-cuda}
REPORT_DIR=${REPORT_DIR:-build/nightly}
TEST_CMD=${TEST_CMD:-python3 apply.py test tests/tool -q}
read -r -a extra <<< "${OVERLAY_ARGS:-}"
mkdir -p "$REPORT_DIR"
report=$REPORT_DIR/report.json

summarize() {  # stage exit codes -> report.json (+ the GitHub job summary)
  python3 - "$REPORT_DIR" "$@" <<'PY'
import json, os, pathlib, sys
d = pathlib.Path(sys.argv[1])
out = {"stages": {}}
for item in sys.argv[2:]:
    k, _, v = item.partition("=")
    out[k] = v if not v.lstrip("-").isdigit() else int(v)
for stage in ("rebase", "build"):
    f = d / f"{stage}.json"
    if f.exists() and f.stat().st_size:
        try:
            out["stages"][stage] = json.loads(f.read_text())
        except json.JSONDecodeError:
            out["stages"][stage] = {"unparsed": f.read_text()[-2000:]}
(d / "report.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
lines = [f"upstream {out.get('upstream_commit', '?')}: rebase {out.get('rebase_exit', '-')}, "
         f"build {out.get('build_exit', '-')}, tests {out.get('test_exit', '-')}", "",
         "| patch | status | drift | detail |", "| --- | --- | --- | --- |"]
for p in out["stages"].get("rebase", {}).get("patches", []):
    drift = "; ".join(f"{x['function']}: {x['detail']}" for x in p["drift"]) or "-"
    lines.append(f"| {p['patch']} | {p['status']} | {drift} | {p['detail']} |")
text = "\n".join(lines) + "\n"
print(text)
if os.environ.get("GITHUB_STEP_SUMMARY"):
    with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
        f.write(text)
PY
}

commit=$(git ls-remote "$UPSTREAM_URL" "$UPSTREAM_REF" | cut -f1)
if [ -z "$commit" ]; then
  echo "nightly: $UPSTREAM_URL has no $UPSTREAM_REF" >&2
  summarize "upstream_url=$UPSTREAM_URL" "error=ls-remote found no $UPSTREAM_REF"
  exit 3
fi
echo "nightly: $UPSTREAM_URL $UPSTREAM_REF is $commit"

if [ -n "${WHEEL_URL:-}" ]; then
  wheel=(--wheel "$TARGET=${WHEEL_URL//\{commit\}/$commit}")
else
  wheel=(--wheel-index "$TARGET=$WHEELS_URL/$commit/")
fi
# The nightly follows the newest release's series (the primary, patches/) onto main: the other
# supported releases are dropped in this clone first, so a patch main makes redundant can leave.
for v in $(python3 apply.py releases "${extra[@]}" --json |
           python3 -c 'import json,sys; print(*[r["version"] for r in json.load(sys.stdin)["releases"] if not r["primary"]])'); do
  python3 apply.py releases "${extra[@]}" --drop "$v" -q || exit 2
done
python3 apply.py rebase "${extra[@]}" --json --to-commit "$commit" --git-url "$UPSTREAM_URL" \
  "${wheel[@]}" --tree "$REPORT_DIR/tree" --force > "$REPORT_DIR/rebase.json"
rebase_rc=$?
field() {  # a field of rebase.json, "" where it is absent or null
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("" if v is None else v)' \
    "$REPORT_DIR/rebase.json" "$1" 2>/dev/null
}
# Every patch gets a status, not only those before the first stop: a patch that conflicts with
# main or whose file main removed is dropped from this clone's replay (git am --skip), its status
# kept in the report, and the replay goes on. A series with any such patch is not built.
stopped=0
while [ -n "$(field stopped_at)" ] && [ "$stopped" -lt 100 ]; do
  stopped=$((stopped + 1))
  git -C "$REPORT_DIR/tree" am --skip >/dev/null 2>&1 || break
  python3 apply.py rebase "${extra[@]}" --json --continue --tree "$REPORT_DIR/tree" > "$REPORT_DIR/rebase.json"
  rebase_rc=$?
done
if [ "$(field completed)" != "True" ] || [ "$stopped" -gt 0 ]; then
  summarize "upstream_url=$UPSTREAM_URL" "upstream_commit=$commit" "rebase_exit=$rebase_rc" \
    "patches_stopped=$stopped"
  [ "$rebase_rc" -gt 1 ] && exit "$rebase_rc"
  exit 1
fi

python3 apply.py build "${extra[@]}" --json --target "$TARGET" --dist "$REPORT_DIR/dist" > "$REPORT_DIR/build.json"
build_rc=$?
test_rc=-1
if [ "$build_rc" -eq 0 ]; then
  bash -c "$TEST_CMD"
  test_rc=$?
fi
summarize "upstream_url=$UPSTREAM_URL" "upstream_commit=$commit" "rebase_exit=$rebase_rc" \
  "build_exit=$build_rc" "test_exit=$test_rc"
[ "$rebase_rc" -eq 0 ] && [ "$build_rc" -eq 0 ] && [ "$test_rc" -eq 0 ] && exit 0
[ "$build_rc" -ne 0 ] && [ "$build_rc" -ne 4 ] && exit "$build_rc"
exit 1
