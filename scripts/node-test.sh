#!/usr/bin/env bash
# The npm package under Node.js (issue 18): builds the package (scripts/web-build.sh) and
# the native CLI, then crates/ternion-web/tests/node.mjs loads a micro synthetic model
# through the package's Node entry point (file path, file: URL, http URL on 127.0.0.1) on
# the CPU backend and checks its token ids against `ternion run --json`. Needs Node.js ≥ 20
# and what web-build.sh needs (scripts/web-test.sh installs that); no network.
set -euo pipefail
cd "$(dirname "$0")/.."
major=$(node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/' || true)
if [ -z "$major" ] || [ "$major" -lt 20 ]; then
  echo "error: Node.js >= 20 is needed (found '$(node --version 2>/dev/null || echo none)');" \
    "install it from https://nodejs.org or NodeSource" >&2
  exit 1
fi
./scripts/web-build.sh
cargo build --release -p ternion-cli -j2
target="${CARGO_TARGET_DIR:-target}"
node crates/ternion-web/tests/node.mjs --ternion "$target/release/ternion"
