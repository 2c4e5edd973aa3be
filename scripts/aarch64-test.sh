#!/usr/bin/env bash
# aarch64 on an x86-64 host: the library lints for aarch64, its CPU kernel tests (NEON
# against the scalar references, bit for bit) run under qemu-user, and the tiny golden
# models of every CPU weight format (examples/cross_arch.rs) give on aarch64 what they
# give here. Installs what it needs on Debian 12: qemu-user and the aarch64 cross linker.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  if ! { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null; }; then
    echo "skipped: aarch64 tests (apt could not install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)"
    exit 0
  fi
fi
if ! rustup target add "$target" >/dev/null 2>&1; then
  echo "skipped: aarch64 tests (rustup could not add the $target target)"
  exit 0
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
aarch64=(--release --no-default-features --target "$target" -j2)
# The kernels live in ternion-core, the reference dots in ternion-formats, the example in
# the ternion facade.
crates=(-p ternion-formats -p ternion-core -p ternion)

cargo clippy "${aarch64[@]}" "${crates[@]}" --all-targets -- -D warnings
# The CPU kernels and the formats' reference dots, under qemu (its default CPU has the
# dotprod extension, so the kernels that can use `sdot` do)...
cargo test "${aarch64[@]}" -p ternion-formats -p ternion-core --lib -- backend::cpu:: quant::
# ...and the CPU kernels once more on a core without dotprod: their plain NEON path.
QEMU_CPU=cortex-a53 cargo test "${aarch64[@]}" -p ternion-core --lib -- backend::cpu::
# End to end: this machine's results, then aarch64's. After scripts/test.sh's workspace
# build the x86 example is already built (the same features), so this build is free.
reference="$(mktemp)"
trap 'rm -f "$reference"' EXIT
cargo build --release --workspace -j2 --example cross_arch
"${CARGO_TARGET_DIR:-target}/release/examples/cross_arch" write "$reference"
cargo run "${aarch64[@]}" -p ternion --example cross_arch -- check "$reference"
