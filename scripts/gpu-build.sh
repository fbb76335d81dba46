#!/usr/bin/env bash
# Builds the release binary, strips and xz-compresses it into .gpubin/ (ignored by git) for a GPU
# machine, which has no Rust toolchain. Then prints the command to run there.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin simjoin
mkdir -p .gpubin
strip -o .gpubin/simjoin target/release/simjoin
xz -6 -T2 -f .gpubin/simjoin
cp benches/torch_peer.py .gpubin/
ls -l .gpubin
cat <<'RUN'
On the GPU machine, from the repository root (with .gpubin carried):
  xz -dk .gpubin/simjoin.xz && chmod +x .gpubin/simjoin
  .gpubin/simjoin selftest
  .gpubin/simjoin bench --gpu-workloads --device gpu --dir /tmp/bench && python3 .gpubin/torch_peer.py --dir /tmp/bench
RUN
