#!/usr/bin/env bash
# Real trained GGUF files against llama.cpp (docs/VALIDATION.md): writes a golden manifest
# with scripts/real_models.py and runs `ternion validate` on it (CPU, F32 KV cache, as the
# oracle). Downloads nothing and is not run by CI.
#
#   ORACLE=/path/oracle QUANTIZE=/path/llama-quantize MODELS=/path/realmodels \
#     scripts/real-models.sh [OUT]
#
# ORACLE: the oracle program of docs/VALIDATION.md; QUANTIZE: llama.cpp's llama-quantize;
# MODELS: the folder holding SmolLM2-135M-Instruct.Q4_1.gguf and gemma-3-270m-q4_k_m.gguf;
# OUT (default $MODELS/golden): where the manifest, cases, F32 and requantized files go.
# TERNION (default target/release/ternion) and THREADS (default 2) may be set too.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${ORACLE:?set ORACLE to the oracle program}"
: "${QUANTIZE:?set QUANTIZE to llama-quantize}"
: "${MODELS:?set MODELS to the folder of the GGUF files}"
OUT="${1:-$MODELS/golden}"
TERNION="${TERNION:-target/release/ternion}"
THREADS="${THREADS:-2}"
SMOL="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA="$MODELS/gemma-3-270m-q4_k_m.gguf"
for f in "$ORACLE" "$QUANTIZE" "$SMOL" "$GEMMA" "$TERNION"; do
  test -e "$f" || { echo "error: $f is missing" >&2; exit 1; }
done

# Requantized variants. Not TQ2_0/TQ1_0/Q2_0/Q1_0: ternarizing SmolLM2's trained weights
# makes a chaotic model that llama.cpp does not reproduce against its own F32 run
# (docs/VALIDATION.md).
derive=()
for t in Q8_0 Q4_K_M Q5_K_M Q3_K_M IQ4_XS Q2_K; do derive+=(--derive "$SMOL:$t"); done
for t in Q8_0 Q5_K_M; do derive+=(--derive "$GEMMA:$t"); done

python3 scripts/real_models.py --oracle "$ORACLE" --quantize "$QUANTIZE" --out "$OUT" \
  --threads "$THREADS" --with-f32 "${derive[@]}" "$SMOL:chatml" "$GEMMA:gemma"
"$TERNION" validate "$OUT/manifest.json" --kv-type f32 -t "$THREADS"
