#!/usr/bin/env bash
# The List of Clusters (index=list_of_clusters) against each function's default plan on the same
# in-memory tables, in one `simjoin sql` session: kNN of 1,000 queries (k = 10) over 200k × 16
# clustered vectors under L1, L∞ and L2 (the first run of each builds the index, the second finds it
# kept), and the words self-join and kNN of misspellings under the edit distance. Prints each
# statement's label and the CLI's time (BENCHMARKS.md, "List of Clusters"; pasted by hand).
# Usage: benches/clusters.sh [SIMJOIN] [DIR]
set -euo pipefail
bin=${1:-./target/release/simjoin}
dir=${2:-bench-out/clusters}
mkdir -p "$dir"
[ -f "$dir/blobs.parquet" ] || "$bin" gen -n 201000 -d 16 --distribution blobs --seed 3 "$dir/blobs.parquet" >/dev/null
[ -f "$dir/words.csv" ] || {
    echo "w" >"$dir/words.csv"
    sed 's/"/""/g; s/.*/"&"/' /usr/share/dict/american-english >>"$dir/words.csv"
}
labels=()
statements=(
    "CREATE TABLE b AS SELECT * FROM '$dir/blobs.parquet' WHERE id >= 1000"
    "CREATE TABLE q AS SELECT * FROM '$dir/blobs.parquet' WHERE id < 1000"
    "CREATE TABLE words AS SELECT * FROM '$dir/words.csv'"
    "CREATE TABLE typos AS SELECT concat(substr(w, 1, 1), 'x', substr(w, 3)) AS w FROM (SELECT w FROM words LIMIT 1000) WHERE length(w) > 3"
)
add() { labels+=("$1"); statements+=("$2"); }
for metric in l1 linf l2; do
    for run in first second; do
        add "knn $metric, scan ($run run)" "SELECT count(*) FROM knn(b, q, 10, 'metric=$metric')"
    done
    for run in first second; do
        add "knn $metric, list_of_clusters ($run run)" \
            "SELECT count(*) FROM knn(b, q, 10, 'metric=$metric, index=list_of_clusters')"
    done
done
for tau in 1 2; do
    add "words self-join within $tau, segments (auto)" "SELECT count(*) FROM sim_join(words, $tau, 'metric=levenshtein')"
    add "words self-join within $tau, list_of_clusters" \
        "SELECT count(*) FROM sim_join(words, $tau, 'metric=levenshtein, index=list_of_clusters')"
done
add "typos kNN k=5, length-ordered scan (auto)" "SELECT count(*) FROM knn(words, typos, 5, 'metric=levenshtein')"
add "typos kNN k=5, list_of_clusters" "SELECT count(*) FROM knn(words, typos, 5, 'metric=levenshtein, index=list_of_clusters')"
printf '%s;\n' "${statements[@]}" >"$dir/clusters.sql"
mapfile -t times < <("$bin" sql -f "$dir/clusters.sql" 2>&1 | grep -o 'rows in [0-9.]* s' | tail -n "${#labels[@]}")
for i in "${!labels[@]}"; do
    echo "${labels[$i]}: ${times[$i]#rows in }"
done
