#!/usr/bin/env bash
# The quantile directory (index=directory) against the grid and brute force: count-only self-joins
# over generated Parquet files, one run each, on uniform, exponential, blobs and Gaussian data at
# d = 2, 8, 16, 32 and ~20 and ~200 neighbours per point (eps calibrated by `simjoin gen`).
# Prints one CSV row a run: the operator's build and probe time from EXPLAIN ANALYZE (what the
# index changes; the file's decoding and the process's start are the same for all three), the
# pages the directory visited and the candidate pairs.
#   benches/directory.sh SIMJOIN DEVICE N [DISTRIBUTIONS] [DIMS] [TIMEOUT_S]
# e.g. benches/directory.sh target/release/simjoin gpu 1000000
set -uo pipefail
SIMJOIN=$1 DEVICE=$2 N=$3
DISTRIBUTIONS=${4:-uniform exponential blobs gaussian}
DIMS=${5:-2 8 16 32}
LIMIT=${6:-120}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
metric() { grep -o "$1=[^,]*" <<<"$2" | head -1 | cut -d= -f2; }
echo "distribution,d,neighbours,eps,index,build,probe,pages_visited,candidate_pairs"
for dist in $DISTRIBUTIONS; do
    for d in $DIMS; do
        file="$DIR/$dist-$d.parquet"
        for nbrs in 20 200; do
            eps=$("$SIMJOIN" gen "$file" -n "$N" -d "$d" --distribution "$dist" --neighbours "$nbrs" | awk '/^eps/ {print $NF}')
            for index in directory grid brute_force; do
                sql="EXPLAIN ANALYZE SELECT count(*) FROM sim_join('$file', $eps, 'index=$index')"
                out=$(timeout "$LIMIT" "$SIMJOIN" sql --device "$DEVICE" --format csv "$sql" 2>&1 | grep -o "SimilarityExec.*")
                if [ -z "$out" ]; then
                    echo "$dist,$d,$nbrs,$eps,$index,over ${LIMIT} s,,,"
                    continue
                fi
                echo "$dist,$d,$nbrs,$eps,$index,$(metric build_time "$out"),$(metric probe_time "$out"),$(metric pages_visited "$out"),$(metric candidate_pairs "$out")"
            done
        done
    done
done
