#!/usr/bin/env bash
# Writes every plan (and every step) that one build makes on the bundled
# configs into OUT, so two builds can be compared byte for byte:
#   tools/plan_sweep.sh build/release /tmp/before   # at the old commit
#   tools/plan_sweep.sh build/release /tmp/after    # at the new one
#   tools/plan_sweep.sh --diff /tmp/before /tmp/after [KEY ...]
# A JSON file that differs is compared again without its "solve_ms" and the
# KEYs given (fields a newer format adds), wherever they occur.
# Plans carry no timings (compare --plans); results.csv loses its timing
# columns (latency, grid, solve, plan, rank path) before the diff.
# The long sweeps (standard, step_time) run 3 packs; ilp's plans depend on
# its time limit and are left out.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [[ ${1:-} == --diff ]]; then
  shift
  exec python3 - "$@" <<'PY'
import csv, filecmp, json, os, sys
a, b = sys.argv[1:3]
drop = {"solve_ms", *sys.argv[3:]}
def strip(x):
    if isinstance(x, dict): return {k: strip(v) for k, v in x.items() if k not in drop}
    if isinstance(x, list): return [strip(v) for v in x]
    return x
def same_json(pa, pb):
    with open(pa) as fa, open(pb) as fb:
        return strip(json.load(fa)) == strip(json.load(fb))
timing = {"latency_ms", "grid_ms", "solve_ms", "plan_ms", "rank_path_ms", "cost_per_use"}
def files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs
                  if f.endswith(".json") or f == "results.csv")
fa, fb = files(a), files(b)
bad = [f"only in {a}: {f}" for f in sorted(set(fa) - set(fb))] + [f"only in {b}: {f}" for f in sorted(set(fb) - set(fa))]
def rows(p):
    with open(p) as f:
        r = list(csv.DictReader(f))
    return [{k: v for k, v in x.items() if k not in timing} for x in r]
n = 0
for f in sorted(set(fa) & set(fb)):
    n += 1
    pa, pb = os.path.join(a, f), os.path.join(b, f)
    if f.endswith("results.csv"):
        if rows(pa) != rows(pb): bad.append(f"differs: {f}")
    elif not filecmp.cmp(pa, pb, shallow=False) and not same_json(pa, pb):
        bad.append(f"differs: {f}")
print(f"{n} files compared, {len(bad)} differences")
for x in bad[:50]: print(" ", x)
sys.exit(1 if bad else 0)
PY
fi
build=$(cd "$1" && pwd); out=$2
cli="$build/bin/cpsched"
mkdir -p "$out"
cd "$here"
sweep() {  # name config [--set ...]
  local name=$1 cfg=$2; shift 2
  "$cli" compare "$cfg" --out "$out/$name" --plans "$out/$name/plans" -q "$@" >/dev/null
}
sweep online configs/compare_online.yaml
sweep quick configs/compare_quick.yaml
sweep sparse configs/compare_sparse.yaml
sweep standard configs/compare_standard.yaml --set compare.packs=3
sweep step_time configs/compare_step_time.yaml --set compare.packs=3
for c in quickstart dsa nsa; do
  "$cli" plan "configs/$c.yaml" -q -o "$out/plan_$c.json" >/dev/null
done
echo "plans of $build in $out"
