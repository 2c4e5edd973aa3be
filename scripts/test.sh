#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test (unit, golden, CLI), optimised.
# Needs ../shared beside the repository (golden data and vocabularies).
set -euo pipefail
cd "$(dirname "$0")/.."
test -d ../shared || { echo "error: ../shared (golden data) is missing beside the repository" >&2; exit 1; }
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -j2 -- -D warnings
cargo test --release --workspace -j2
