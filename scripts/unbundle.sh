#!/usr/bin/env bash
# Unpacks .gpu-bundle-xz/bundle.tar.xz (written by `cargo xtask test --gpu` on a machine without a
# GPU) into .gpu-bundle/ when that folder lacks the GPU tier's binaries: a device call carries the
# 13 MB archive instead of the 34 MB of binaries. Does nothing when there is nothing to unpack.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .gpu-bundle/gpu_kernels ] && [ -f .gpu-bundle-xz/bundle.tar.xz ]; then
    mkdir -p .gpu-bundle
    xz -dc .gpu-bundle-xz/bundle.tar.xz | tar -xf - -C .gpu-bundle
fi
