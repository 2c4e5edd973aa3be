#!/usr/bin/env bash
# Builds the browser package: a wasm32 release build of crates/ternion-web, then
# wasm-bindgen (--target web) into crates/ternion-web/pkg, the files the page and the npm
# package use. Needs the wasm32-unknown-unknown target and wasm-bindgen-cli at the version
# Cargo.lock names (scripts/web-test.sh installs both).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p ternion-web --target wasm32-unknown-unknown --release -j2
target="${CARGO_TARGET_DIR:-target}"
wasm-bindgen --target web --out-dir crates/ternion-web/pkg \
  "$target/wasm32-unknown-unknown/release/ternion_web.wasm"
echo "built crates/ternion-web/pkg ($(du -h crates/ternion-web/pkg/ternion_web_bg.wasm | cut -f1) wasm)"
