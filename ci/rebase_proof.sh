#!/usr/bin/env bash
# Rebase this repository's committed series onto a vLLM release, in a scratch
# clone (this checkout is never written), and write the per-patch report.
#
#   ci/rebase_proof.sh 0.33.0 [report.json]
#
# The report is the JSON of `apply.py rebase --json`, plus the repository
# commit and what was tried after the rebase: `check` on the new pin, a
# byte-compile of the patched Python files, and a build for each target (a
# target without a binary wheel is refused, exit 4).
# Exit status: that of the rebase.
set -uo pipefail
version=${1:?usage: ci/rebase_proof.sh VERSION [report.json]}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${2:-$here/build/rebase-proof-$version.json}")
mkdir -p "$(dirname "$out")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone --quiet "$here" "$work/repo" || exit 2
cd "$work/repo" || exit 2
commit=$(git rev-parse HEAD)
# Reuse this checkout's tool environment when it has one (same requirements).
if [ -x "$here/.tool-venv/bin/python" ]; then export VLLM_OVERLAY_TOOL_VENV="$here/.tool-venv"; fi
python3 apply.py rebase --to "$version" --tree "$work/tree" --json > "$work/rebase.json"
rc=$?
after=()
if [ "$rc" -ne 2 ] && [ "$rc" -ne 3 ] && python3 - "$work/rebase.json" <<'PY'
import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("completed") else 1)
PY
then
  python3 apply.py check > "$work/check.txt" 2>&1; after+=("check=$?")
  # the patched Python files of the new release at least compile
  (cd "$work/tree" && git diff --name-only --diff-filter=AM upstream patched -- '*.py' \
     | xargs -r python3 -m py_compile) > "$work/compile.txt" 2>&1; after+=("compile=$?")
  for target in cpu cuda; do
    python3 apply.py build -q --target "$target" --dist "$work/dist" > "$work/build-$target.txt" 2>&1
    after+=("build-$target=$?")
  done
fi
python3 - "$work" "$out" "$commit" "$rc" "${after[@]}" <<'PY'
import json, pathlib, sys
work, out, commit, rc, *after = sys.argv[1:]
work = pathlib.Path(work)
report = json.loads((work / "rebase.json").read_text())
report["repo_commit"] = commit
report["rebase_exit_code"] = int(rc)
report["after"] = {}
for item in after:
    name, code = item.split("=")
    log = (work / f"{name}.txt").read_text()
    report["after"][name] = {"exit_code": int(code), "log_tail": log[-1500:]}
pathlib.Path(out).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
print(f"repo {commit[:12]}  series {report.get('series_sha256_before', '?')[:12]}  rebase exit {rc}")
for p in report.get("patches", []):
    drift = "; ".join(f"{d['function']}: {d['detail']}" for d in p["drift"]) or "-"
    print(f"  {p['status']:17} {p['patch']}  drift: {drift}  {p['detail']}")
for name, r in report["after"].items():
    print(f"  {name}: exit {r['exit_code']}")
print(f"report: {out}")
PY
exit "$rc"
