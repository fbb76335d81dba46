#!/usr/bin/env bash
# Reproduces BENCHMARKS.md's CPU table: builds simjoin, installs the peers from PyPI into a venv,
# runs `simjoin bench` and benches/peers.py on the same files, and prints the report.
# Usage: benches/run.sh [DIR] [--quick]     (DIR defaults to bench-out)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-bench-out}
shift || true
cargo build --release
python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q numpy scipy pyarrow faiss-cpu scikit-learn duckdb
./target/release/simjoin bench --dir "$dir" "$@"
"$dir/venv/bin/python" benches/peers.py --dir "$dir"
"$dir/venv/bin/python" benches/report.py --dir "$dir" | tee "$dir/report.md"
