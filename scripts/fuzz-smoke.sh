#!/usr/bin/env bash
# CI smoke test of the fuzz targets in fuzz/: builds them with cargo-fuzz and runs each for
# a few seconds (5 targets x SMOKE_SECONDS, 9 s by default: under a minute in all),
# starting from the committed corpus. Exits non-zero on any crash, timeout or OOM.
#
# Works on stable Rust: cargo-fuzz needs nightly flags, which RUSTC_BOOTSTRAP=1 unlocks on
# a stable toolchain. cargo-fuzz is installed if missing (needs network; a C++ compiler is
# needed to build libFuzzer: apt-get install build-essential). If cargo-fuzz cannot be
# installed or cannot build the targets, the script falls back to replaying the corpus
# and regression inputs through the same target functions as plain `cargo test`.
#
# Environment: SMOKE_SECONDS (per target), FUZZ_TARGET_DIR (build directory, default
# $CARGO_TARGET_DIR or fuzz/target), TERNION_VOCAB_DIR (vocabularies for the tokenizer
# target; a synthetic byte-level vocabulary is used when they are absent),
# FUZZ_SMOKE_FALLBACK=1 (skip cargo-fuzz and only replay).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"
secs="${SMOKE_SECONDS:-9}"
targets=(gguf_reader tokenizer quant_blocks chat_template server_request)
target_dir="${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-$root/fuzz/target}}"
export RUSTC_BOOTSTRAP=1

replay() {
    echo "fuzz-smoke: replaying fuzz/corpus and fuzz/regressions with cargo test (stable, no libFuzzer)"
    cargo test --release --lib --no-default-features --target-dir "$target_dir"
}

if [[ "${FUZZ_SMOKE_FALLBACK:-0}" == 1 ]]; then
    replay
    exit
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz"
    if ! cargo install cargo-fuzz --locked; then
        echo "fuzz-smoke: cannot install cargo-fuzz; falling back" >&2
        replay
        exit
    fi
fi

if ! cargo fuzz build -s none --target-dir "$target_dir"; then
    echo "fuzz-smoke: cargo fuzz build failed (no C++ compiler?); falling back" >&2
    replay
    exit
fi

host="$(rustc -vV | sed -n 's/^host: //p')"
bin_dir="$target_dir/$host/release"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for t in "${targets[@]}"; do
    mkdir -p "$work/$t" "$work/artifacts"
    echo "fuzz-smoke: $t for ${secs}s"
    # New inputs go to the scratch directory; the committed corpus is only read.
    dirs=("$work/$t")
    for d in "corpus/$t" "regressions/$t"; do
        [[ -d "$d" ]] && dirs+=("$d")
    done
    if ! "$bin_dir/$t" "${dirs[@]}" \
        -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="$work/artifacts/$t-" -print_final_stats=1 \
        >"$work/$t.log" 2>&1; then
        echo "fuzz-smoke: $t FAILED" >&2
        tail -n 60 "$work/$t.log" >&2
        mkdir -p "$root/fuzz/artifacts/$t"
        cp "$work"/artifacts/"$t"-* "$root/fuzz/artifacts/$t/" 2>/dev/null || true
        status=1
    else
        grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$work/$t.log" | tail -n 2 || true
    fi
done
exit "$status"
