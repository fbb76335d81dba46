#!/usr/bin/env bash
# On the GPU machine, with .gpubin/ from scripts/gpu-build.sh beside it: the selftest,
# the GPU workloads (`simjoin bench --gpu-workloads`), then for P1, P6, P4 and P5 each statement's
# wall time and EXPLAIN ANALYZE, Nsight Compute's time of every kernel, and its detailed counters
# of the main kernel (the warm statement's count pass). Everything goes into one archive,
# $OUT/profile.tgz (OUT defaults to /tmp); the per-kernel table is printed last.
# Usage: scripts/gpu-profile.sh            (SKIP_SELFTEST=1 skips the selftest, BENCH_ONLY=P1 narrows the bench)
set -uo pipefail
cd "$(dirname "$0")/.."
S=.gpubin/simjoin
[ -x $S ] || { xz -dk .gpubin/simjoin.xz && chmod +x $S; }
P="${OUT:-/tmp}/profile"
mkdir -p "$P"
B=/tmp/bench
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$P/smi.txt"
if [ -z "${SKIP_SELFTEST:-}" ]; then
    timeout 300 $S selftest >"$P/selftest.txt" 2>&1
    echo "selftest rc=$?"
    tail -2 "$P/selftest.txt"
fi
fm=()
[ -d .gpubin/fashion-mnist ] && fm=(--fashion-mnist .gpubin/fashion-mnist)
timeout 300 $S bench --gpu-workloads --device gpu --dir $B --repeat 5 "${fm[@]}" ${BENCH_ONLY:+--only "$BENCH_ONLY"} \
    >"$P/bench.txt" 2>&1
echo "bench rc=$?"
cp $B/simjoin.json "$P/" 2>/dev/null
# The thresholds the bench calibrated, so that each statement is the workload's own.
threshold() { python3 -c "import json; print([w['threshold'] for w in json.load(open('$B/simjoin.json')) if w['name'] == '$1'][0])"; }
queries="-t base=$B/gaussian-1000000-128d.parquet -t queries=$B/gaussian-queries-10000-128d.parquet"
declare -A tables statements kernels skips
tables=([P1]="$queries" [P6]="$queries" [P4]="-t base=$B/uniform-1000000-8d.parquet" [P5]="-t base=$B/uniform-1000000-32d.parquet")
statements=(
    [P1]="SELECT count(*) FROM knn(base, queries, 10)"
    [P6]="SELECT count(*) FROM range_query(base, queries, $(threshold P6-range-128d-gaussian-1m-10k))"
    [P4]="SELECT count(*) FROM sim_join(base, $(threshold P4-join-8d-uniform-1m), 'pairs=unordered')"
    [P5]="SELECT count(*) FROM sim_join(base, $(threshold P5-join-32d-uniform-1m), 'pairs=unordered')"
)
kernels=([P1]='brute_join_tc$' [P6]='brute_join_tc$' [P4]='grid_join' [P5]='brute_join_tc$')
# Launches of that kernel before the warm statement's count pass: a kNN statement launches it twice
# (the count pass, then the pass of the queries left short), the others once.
skips=([P1]=2 [P6]=1 [P4]=1 [P5]=1)
for w in P1 P6 P4 P5; do
    # Three statements in one process over tables read into memory: the first uploads, the second
    # is the warm run, the third its EXPLAIN ANALYZE.
    printf '%s;\n%s;\nEXPLAIN ANALYZE %s;\n' "${statements[$w]}" "${statements[$w]}" "${statements[$w]}" >"$P/$w.sql"
    timeout 120 $S sql --device gpu --in-memory ${tables[$w]} -f "$P/$w.sql" >"$P/explain_$w.txt" 2>&1
    timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$P/kernels_$w.csv" \
        $S sql --device gpu --in-memory ${tables[$w]} -f "$P/$w.sql" >/dev/null 2>"$P/kernels_$w.err"
    timeout 200 ncu --clock-control none --set detailed -k "regex:${kernels[$w]}" --launch-skip "${skips[$w]}" --launch-count 1 \
        $S sql --device gpu --in-memory ${tables[$w]} -f "$P/$w.sql" >"$P/detail_$w.txt" 2>&1
done
for w in P1 P6 P4 P5; do
    echo "== $w: statements $(grep -o '[0-9.]* s$' "$P/explain_$w.txt" | tr '\n' ' ')"
    python3 - "$P/kernels_$w.csv" <<'PY'
import collections, csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no kernel times (see kernels_*.err)")
name, value = rows[0].index("Kernel Name"), rows[0].index("Metric Value")
launches = [(r[name].split("(")[0], float(r[value].replace(",", ""))) for r in rows[1:]]
# The last two statements (the warm run and its EXPLAIN ANALYZE) launch the same sequence, which
# the first's uploads precede: the longest tail that repeats is one warm statement's launches.
names = [kernel for kernel, _ in launches]
length = next(l for l in range(len(names) // 2, 0, -1) if names[-l:] == names[-2 * l:-l])
totals = collections.OrderedDict()
for kernel, ns in launches[-length:]:
    count, total = totals.get(kernel, (0, 0.0))
    totals[kernel] = (count + 1, total + ns)
for kernel, (count, ns) in totals.items():
    print(f"  {kernel:36s} {count:4d} launches {ns / 1e6:9.3f} ms")
print(f"  kernels in all {sum(ns for _, ns in totals.values()) / 1e6:.3f} ms")
PY
done | tee "$P/summary.txt"
grep -E '^\| (P|knn)' "$P/bench.txt"
tar czf "$P.tgz" -C "$(dirname "$P")" profile && rm -rf "$P"
