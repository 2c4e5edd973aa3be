#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test (unit, golden, GPU kernels on
# Mesa's lavapipe, CLI, server), optimised. Installs what it needs on Debian 12:
# mesa-vulkan-drivers (software Vulkan for the WGSL kernels) and the `openai` Python
# client (server tests). Needs ../shared beside the repository (golden data, vocabularies).
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
# The NEON kernels must at least compile and lint for aarch64 (no aarch64 runner here).
if rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1; then
  cargo clippy --release -p ternion-core -p ternion --no-default-features --target aarch64-unknown-linux-gnu -j2 -- -D warnings
else
  echo "skipped: aarch64 check (rustup could not add the aarch64-unknown-linux-gnu target)"
fi
# The browser: wasm kernels in headless Chromium, the page end to end, "no WebGPU" control,
# and the npm package under Node.js >= 20 (scripts/node-test.sh).
./scripts/web-test.sh
# Fuzz targets: build and a short smoke run of each (under a minute of fuzzing).
SMOKE_SECONDS="${SMOKE_SECONDS:-8}" ./scripts/fuzz-smoke.sh
