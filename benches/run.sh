#!/usr/bin/env bash
# Regenerates BENCHMARKS.md's CPU section and the plots in benches/plots/: builds simjoin, installs
# the peers from PyPI into a venv, runs `simjoin bench` (workloads, then scaling curves) and
# benches/peers.py on the same files, and rewrites the section between the cpu-report markers.
# Usage: benches/run.sh [DIR]       (DIR defaults to bench-out; datasets are cached there)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-bench-out}
cargo build --release --bin simjoin
python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q numpy scipy pyarrow faiss-cpu hnswlib usearch scikit-learn duckdb matplotlib rapidfuzz
[ -f /usr/share/dict/american-english ] || apt-get install -y -q wamerican
./target/release/simjoin bench --dir "$dir"
"$dir/venv/bin/python" benches/peers.py --dir "$dir"
./target/release/simjoin bench --curves --dir "$dir/curves"
"$dir/venv/bin/python" benches/peers.py --dir "$dir/curves"
"$dir/venv/bin/python" benches/report.py --dir "$dir" --curves "$dir/curves" --update BENCHMARKS.md
# Edit distance against RapidFuzz and DuckDB (BENCHMARKS.md, "Text"; printed, pasted by hand).
"$dir/venv/bin/python" benches/text.py --dir "$dir/text" --simjoin ./target/release/simjoin --plot benches/plots/text.png
# Approximate kNN against the exact path and FAISS's indexes (BENCHMARKS.md, "Approximate kNN";
# printed, pasted by hand).
./target/release/simjoin bench --approx --dir "$dir/approx"
"$dir/venv/bin/python" benches/approx.py --dir "$dir/approx" --peers-max-rows 500000 --plot benches/plots/approx.png
# The List of Clusters against the default plans (BENCHMARKS.md, "List of Clusters"; printed,
# pasted by hand).
benches/clusters.sh ./target/release/simjoin "$dir/clusters"
