#!/usr/bin/env bash
# Soak test of `ternion serve` (see docs/soak.md): starts the server on 127.0.0.1, drives it
# with N concurrent streaming clients for a while (`ternion bench-serve --duration`), and
# samples the server's resident memory and KV pages in use every few seconds.
#
# usage: scripts/soak.sh MODEL.gguf [SECONDS=600] [CLIENTS=16] [OUT_DIR=soak-out]
# env:   TERNION (binary, default target/release/ternion), THREADS (default 2),
#        SAMPLE_SECONDS (default 5), MAX_TOKENS (default 64), PROMPT_TOKENS (default 32)
# out:   OUT_DIR/memory.csv (seconds,rss_kib,kv_pages_in_use,active_sequences),
#        OUT_DIR/bench.json (bench-serve's summary), OUT_DIR/serve.log
set -euo pipefail
model=${1:?usage: scripts/soak.sh MODEL.gguf [SECONDS] [CLIENTS] [OUT_DIR]}
seconds=${2:-600}
clients=${3:-16}
out=${4:-soak-out}
bin=${TERNION:-target/release/ternion}
mkdir -p "$out"

"$bin" serve --model "$model" --port 0 --threads "${THREADS:-2}" \
  --max-active "$clients" --queue $((clients * 2)) --ctx 512 2>"$out/serve.log" &
server=$!
sampler=""
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
trap cleanup EXIT

url=""
for _ in $(seq 1 600); do
  url=$(grep -o 'http://[0-9.:]*' "$out/serve.log" | head -n1 || true)
  [ -n "$url" ] && curl -fs "$url/health" >/dev/null 2>&1 && break
  sleep 0.1
done
[ -n "$url" ] || { echo "error: the server did not start (see $out/serve.log)" >&2; exit 1; }

metric() { curl -fs "$url/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
(
  echo "seconds,rss_kib,kv_pages_in_use,active_sequences"
  t0=$(date +%s)
  while kill -0 "$server" 2>/dev/null; do
    rss=$(ps -o rss= -p "$server" | tr -d ' ')
    echo "$(($(date +%s) - t0)),$rss,$(metric ternion_kv_pages_in_use),$(metric ternion_active_sequences)"
    sleep "${SAMPLE_SECONDS:-5}"
  done
) >"$out/memory.csv" &
sampler=$!

"$bin" bench-serve --url "$url" --streams "$clients" --duration "$seconds" \
  --prompt-tokens "${PROMPT_TOKENS:-32}" --max-tokens "${MAX_TOKENS:-64}" --json \
  | tail -n1 >"$out/bench.json"
sleep "${SAMPLE_SECONDS:-5}"
echo "soak done: $out/memory.csv, $out/bench.json"
