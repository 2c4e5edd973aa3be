#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test (unit, golden, GPU kernels on
# Mesa's lavapipe, CLI, server, aarch64 under qemu-user), optimised. Installs what it
# needs on Debian 12: mesa-vulkan-drivers (software Vulkan for the WGSL kernels), the
# `openai` Python client (server tests), qemu-user and the aarch64 cross linker. Needs
# ../shared beside the repository (golden data, vocabularies).
set -euo pipefail
cd "$(dirname "$0")/.."
test -d ../shared || { echo "error: ../shared (golden data) is missing beside the repository" >&2; exit 1; }

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi
python3 -c 'import openai' 2>/dev/null || python3 -m pip install -q openai

rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -j2 -- -D warnings
cargo test --release --workspace -j2
# aarch64 under qemu-user: lints, the NEON kernel tests and the golden models against the
# x86 results (scripts/aarch64-test.sh).
./scripts/aarch64-test.sh
# The browser: wasm kernels in headless Chromium, the page end to end, "no WebGPU" control,
# and the npm package under Node.js >= 20 (scripts/node-test.sh).
./scripts/web-test.sh
# Fuzz targets: build and a short smoke run of each (under a minute of fuzzing).
SMOKE_SECONDS="${SMOKE_SECONDS:-8}" ./scripts/fuzz-smoke.sh
