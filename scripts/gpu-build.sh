#!/usr/bin/env bash
# Builds the release binary, strips and xz-compresses it into .gpubin/ (ignored by git) for a GPU
# machine, which has no Rust toolchain. Then prints the command to run there.
# With --wheel it builds the Python package's wheel into .gpubin/ instead (the same kernels embedded).
# The binary carries the kernels' machine code for every common architecture (build.rs), compiled
# by PyPI's NVRTC 13.0 (installed into .gpubin/nvrtc-13.0): the first process on a GPU machine
# compiles nothing, and cubins of CUDA 13's first release load under every CUDA 13 driver.
set -euo pipefail
cd "$(dirname "$0")/.."
NVRTC_VENV=.gpubin/nvrtc-13.0
if ! compgen -G "$NVRTC_VENV/lib/python*/site-packages/nvidia/cu13/lib/libnvrtc.so.13" >/dev/null; then
    python3 -m venv "$NVRTC_VENV"
    "$NVRTC_VENV/bin/pip" install -q "nvidia-cuda-nvrtc==13.0.*"
fi
SIMJOIN_NVRTC="$(realpath "$(compgen -G "$NVRTC_VENV/lib/python*/site-packages/nvidia/cu13/lib/libnvrtc.so.13" | head -1)")"
export SIMJOIN_NVRTC
if [ "${1:-}" = "--wheel" ]; then
    [ -x "$NVRTC_VENV/bin/maturin" ] || "$NVRTC_VENV/bin/pip" install -q maturin
    rm -f .gpubin/simjoin-*.whl
    "$NVRTC_VENV/bin/maturin" build --release --locked --strip --features full --out .gpubin
    ls -l .gpubin/simjoin-*.whl
    echo "On the GPU machine: pip install --no-deps .gpubin/simjoin-*.whl"
    exit 0
fi
cargo build --release --bin simjoin
mkdir -p .gpubin
strip -o .gpubin/simjoin "${CARGO_TARGET_DIR:-target}/release/simjoin"
xz -6 -T2 -f .gpubin/simjoin
cp benches/torch_peer.py .gpubin/
# Fashion-MNIST for P2 (the GPU machine has no Debian package): the IDX files, ~30 MB.
if [ -d /usr/share/datasets/fashion-mnist ]; then
    mkdir -p .gpubin/fashion-mnist
    cp /usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz .gpubin/fashion-mnist/
fi
ls -l .gpubin
cat <<'RUN'
On the GPU machine, from the repository root (with .gpubin carried):
  xz -dk .gpubin/simjoin.xz && chmod +x .gpubin/simjoin
  .gpubin/simjoin selftest
  .gpubin/simjoin bench --gpu-workloads --device gpu --dir /tmp/bench --repeat 10 --fashion-mnist .gpubin/fashion-mnist \
    && python3 .gpubin/torch_peer.py --dir /tmp/bench --repeat 10
RUN
