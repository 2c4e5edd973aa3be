#!/usr/bin/env bash
# Browser tests (issue 7): the GPU kernels through wasm-bindgen-test in headless Chromium
# (WebGPU on SwiftShader), then the chat page end to end against the native CPU backend's
# token ids, the "no WebGPU" negative control, an MLC directory (Ternion.loadMlc) against
# the native MLC path with the OPFS cache and WebLLM's Cache API, and the npm package under Node.js against
# the same native ids (scripts/node-test.sh, issue 18), and the subgroup-matrix prompt tiles
# compiled by Dawn's null backend (tests/sgmat_compile.mjs). Installs what is missing, once:
# Debian's chromium + chromium-driver, the wasm32-unknown-unknown target,
# wasm-bindgen-cli at exactly the version Cargo.lock names (kept in ~/.cargo/bin), and the
# `webgpu` npm package (Dawn for Node, kept in ~/.cache/ternion-ci).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
rustup target list --installed | grep -qx wasm32-unknown-unknown \
  || rustup target add wasm32-unknown-unknown
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print }' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)
if [ "$have" != "$want" ]; then
  echo "installing wasm-bindgen-cli $want (found '${have:-none}')"
  cargo install -q wasm-bindgen-cli --version "=$want" --locked -j2 \
    || cargo install -q wasm-bindgen-cli --version "=$want" -j2
fi

cargo clippy --release -p ternion-web --target wasm32-unknown-unknown --all-targets -j2 -- -D warnings

# Temporary files of the tools below (Chromium's singleton socket and scoped folders,
# Dawn's runtime folder) go under one folder, removed on exit.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# 1. Kernels in the browser. The runner reads crates/ternion-web/webdriver.json (flags).
export CHROMEDRIVER="${CHROMEDRIVER:-$(command -v chromedriver)}"
export WASM_BINDGEN_TEST_TIMEOUT=300
(cd crates/ternion-web &&
  TMPDIR="$scratch" CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    cargo test --release -p ternion-web --target wasm32-unknown-unknown -j2 --test kernels)

# 2. The page end to end, and the negative control; then MLC directories (loadMlc against
#    the native MLC path), WebLLM's Cache API entries and the OPFS cache (reload, list,
#    clear, a quota error).
./scripts/web-build.sh
cargo build --release -p ternion-cli -j2
target="${CARGO_TARGET_DIR:-target}"
python3 crates/ternion-web/tests/e2e.py --ternion "$target/release/ternion" ${WEB_SCREENSHOT:+--screenshot "$WEB_SCREENSHOT"}
python3 crates/ternion-web/tests/e2e_mlc.py --ternion "$target/release/ternion"

# 3. The npm package under Node.js (CPU backend), against `ternion run --json`.
./scripts/node-test.sh

# 4. The browser-only subgroup-matrix kernel through Dawn's compiler (null backend: it
#    validates and compiles, runs nothing) from the `webgpu` npm package.
webgpu_version=0.6.2
webgpu="${XDG_CACHE_HOME:-$HOME/.cache}/ternion-ci/webgpu-$webgpu_version"
if [ ! -f "$webgpu/package/dist/linux-x64/dawn.node" ]; then
  mkdir -p "$webgpu"
  (cd "$webgpu" && npm pack --silent "webgpu@$webgpu_version" >/dev/null && tar xzf "webgpu-$webgpu_version.tgz" && rm "webgpu-$webgpu_version.tgz")
fi
# Dawn wants a runtime folder: one under the scratch folder when the session has none.
XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$scratch}" node crates/ternion-web/tests/sgmat_compile.mjs --webgpu "$webgpu/package"
