#!/usr/bin/env bash
# Digests of every plan (and every step) one build makes on the bundled
# configs, so that two builds can be compared byte for byte:
#   tools/plan_sweep.sh build/release /tmp/before   # at the old commit
#   tools/plan_sweep.sh build/release /tmp/after    # at the new one
#   tools/plan_sweep.sh --diff /tmp/before /tmp/after [KEY ...]
# Each plan JSON (compare --plans: no timings) is reduced to the SHA-256 of
# its canonical form without "solve_ms" and the KEYs given to the sweep
# (fields a newer format adds, e.g. program) and deleted: the plans of one
# sweep are tens of GB. results.csv is kept, and compared without its timing
# columns. The long sweeps (standard, step_time) run 3 packs; ilp's plans
# depend on its time limit and are left out. Run one CP size at a time, so
# the plans on disk stay a few GB at most.
#   KEYS="program" tools/plan_sweep.sh build/release /tmp/after
# SWEEPS names the sweeps to run (default: all of them):
#   SWEEPS="online quick sparse configs" tools/plan_sweep.sh build/release /tmp/after
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [[ ${1:-} == --diff ]]; then
  exec python3 - "$2" "$3" <<'PY'
import csv, os, re, sys
a, b = sys.argv[1:3]
timing = {"latency_ms", "grid_ms", "solve_ms", "plan_ms", "rank_path_ms", "cost_per_use"}
def files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs
                  if f in ("results.csv", "digests.txt"))
def rows(p):  # (messages name the plugin files: their folder is the build's)
    with open(p) as f:
        return [{k: re.sub(r"/\S*/lib/cpsched/plugins/", "<plugins>/", v) for k, v in x.items() if k not in timing}
                for x in csv.DictReader(f)]
def digests(p):
    with open(p) as f:
        return dict(line.split() for line in f if line.strip())
fa, fb = files(a), files(b)
bad = [f"only in {a}: {f}" for f in sorted(set(fa) - set(fb))] + [f"only in {b}: {f}" for f in sorted(set(fb) - set(fa))]
plans = 0
for f in sorted(set(fa) & set(fb)):
    pa, pb = os.path.join(a, f), os.path.join(b, f)
    if f.endswith("results.csv"):
        if rows(pa) != rows(pb): bad.append(f"steps differ: {f}")
        continue
    da, db = digests(pa), digests(pb)
    plans += len(da)
    bad += [f"plan differs or is missing: {os.path.dirname(f)}/{k}" for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)]
print(f"{plans} plans and {sum(f.endswith('results.csv') for f in fa)} result tables compared, {len(bad)} differences")
for x in bad[:50]: print(" ", x)
sys.exit(1 if bad else 0)
PY
fi
build=$(cd "$1" && pwd); out=$2
cli="$build/bin/cpsched"
mkdir -p "$out"
cd "$here"
digest() {  # folder of plan JSONs -> folder/../digests.txt (appended), the JSONs deleted
  python3 - "$1" "${KEYS:-}" <<'PY'
import hashlib, json, os, sys
d, keys = sys.argv[1], {"solve_ms", *sys.argv[2].split()}
def strip(x):
    if isinstance(x, dict): return {k: strip(v) for k, v in x.items() if k not in keys}
    if isinstance(x, list): return [strip(v) for v in x]
    return x
with open(os.path.join(d, "..", "digests.txt"), "a") as out:
    for f in sorted(os.listdir(d)):
        p = os.path.join(d, f)
        with open(p) as fp:
            canon = json.dumps(strip(json.load(fp)), sort_keys=True, separators=(",", ":"))
        out.write(f"{f} {hashlib.sha256(canon.encode()).hexdigest()}\n")
        os.remove(p)
PY
}
sweep() {  # name config P-list [--set ...]
  local name=$1 cfg=$2 ps=$3; shift 3
  rm -f "$out/$name/digests.txt"
  for p in $ps; do
    "$cli" compare "$cfg" --out "$out/$name/P$p" --plans "$out/$name/plans" -q --set "compare.cp_sizes=[$p]" "$@" \
      >/dev/null
    digest "$out/$name/plans"
  done
  rmdir "$out/$name/plans"
}
sweeps=" ${SWEEPS:-online quick sparse standard step_time configs} "
for s in $sweeps; do
  case $s in online | quick | sparse | standard | step_time | configs) ;;
    *) echo "plan_sweep.sh: SWEEPS: unknown sweep '$s' (online, quick, sparse, standard, step_time, configs)" >&2
       exit 2 ;;
  esac
done
wants() { [[ $sweeps == *" $1 "* ]]; }
if wants online; then sweep online configs/compare_online.yaml "8 16 64"; fi
if wants quick; then sweep quick configs/compare_quick.yaml "2 4 8"; fi
if wants sparse; then sweep sparse configs/compare_sparse.yaml "8 16"; fi
if wants standard; then sweep standard configs/compare_standard.yaml "8 16 32 64 128" --set compare.packs=3; fi
if wants step_time; then sweep step_time configs/compare_step_time.yaml "8 16 32 64 128" --set compare.packs=3; fi
if wants configs; then
  mkdir -p "$out/configs/plans"
  rm -f "$out/configs/digests.txt"
  for c in quickstart dsa nsa; do
    "$cli" plan "configs/$c.yaml" -q -o "$out/configs/plans/$c.json" >/dev/null
  done
  digest "$out/configs/plans"
  rmdir "$out/configs/plans"
fi
echo "plan digests of $build in $out"
