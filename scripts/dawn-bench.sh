#!/usr/bin/env bash
# The browser engine (the wasm package under Node.js, WebGPU by Dawn on the Vulkan driver)
# against native wgpu on the same GPU and file (issue 18): BitNet 2B-4T I2_S synthetic,
# pp512 and tg128 as `ternion bench --synthetic 2b-4t-i2_s --backend gpu -P 512 -n 128`,
# for each kernel variant (f16 or f32, subgroup or workgroup reductions; natively also the
# cooperative-matrix prefill, which WebGPU has not), in alternating rounds, then a table
# and the ratios. Runs from the repository root on a machine without network, from the
# folder scripts/dawn-bundle.sh builds (Node.js, dawn.node, the wasm package, `ternion`).
#
#   scripts/dawn-bench.sh [--bundle DIR] [--out DIR] [--work DIR] [--rounds N] [-P N]
#                         [-n N] [--synthetic NAME] [--ternion BIN] [--dawn FLAG]... [--cpu]
#
# --bundle: the folder (default devweb). --work: where the tools are unpacked and the
# model written (default /tmp/ternion-dawn). --out: where results.jsonl and table.txt go
# (default: --work). --synthetic: the model as `ternion bench --synthetic` names
# it (default 2b-4t-i2_s). --ternion: a native binary instead of the bundle's.
# --dawn FLAG is passed to Dawn's create() (default backend=vulkan and
# enable-dawn-features=allow_unsafe_apis, which Dawn's subgroup matrices need; e.g.
# enable-dawn-features=disable_robustness to see what bounds checks cost). The Vulkan
# loader (libvulkan.so.1) must be installed; VK_DRIVER_FILES is pointed at the NVIDIA
# driver's ICD file when no ICD is registered. --cpu (no GPU): the tiny model on the CPU
# backends, and every kernel variant compiled by Dawn's null backend (no figures).
# crates/ternion-web/pkg is replaced by the bundle's (the wasm that matches its ternion).
set -euo pipefail
cd "$(dirname "$0")/.."

bundle=devweb work=/tmp/ternion-dawn out="" rounds=2 n_prompt="" n_gen="" ternion="" cpu=0 model_name=""
dawn_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -P) n_prompt="$2"; shift 2 ;;
    -n) n_gen="$2"; shift 2 ;;
    --ternion) ternion="$2"; shift 2 ;;
    --dawn) dawn_flags+=("$2"); shift 2 ;;
    --cpu) cpu=1; shift ;;
    --synthetic) model_name="$2"; shift 2 ;;
    *) echo "unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ ${#dawn_flags[@]} -gt 0 ] || dawn_flags=(backend=vulkan enable-dawn-features=allow_unsafe_apis)
if [ "$cpu" = 1 ]; then
  model_name="${model_name:-tiny-i2_s}"; n_prompt="${n_prompt:-32}"; n_gen="${n_gen:-8}"
else
  model_name="${model_name:-2b-4t-i2_s}"; n_prompt="${n_prompt:-512}"; n_gen="${n_gen:-128}"
fi
out="${out:-$work}"
[ -d "$bundle" ] || { echo "error: no bundle folder '$bundle' (scripts/dawn-bundle.sh builds it)" >&2; exit 1; }

# Unpack what is newer than the last unpack.
tools="$work/tools"
mkdir -p "$tools/webgpu/dist/linux-x64" "$tools/lib" "$out"
unxz_to() {
  if [ ! -e "$2" ] || [ "$1" -nt "$2" ]; then
    if command -v xz >/dev/null; then xz -dc "$1" >"$2.part"
    else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1" >"$2.part"
    fi
    chmod +x "$2.part"
    mv "$2.part" "$2"
  fi
}
unxz_to "$bundle/node.xz" "$tools/node"
unxz_to "$bundle/dawn.node.xz" "$tools/webgpu/dist/linux-x64/dawn.node"
cp "$bundle/webgpu/index.js" "$bundle/webgpu/package.json" "$tools/webgpu/"
[ ! -f "$bundle/libstdc++.so.6.xz" ] || unxz_to "$bundle/libstdc++.so.6.xz" "$tools/lib/libstdc++.so.6"
if [ -z "$ternion" ]; then
  unxz_to "$bundle/ternion.xz" "$tools/ternion"
  ternion="$tools/ternion"
fi
rm -rf crates/ternion-web/pkg
tar -C crates/ternion-web -xJf "$bundle/pkg.tar.xz"
node="$tools/node"
# dawn.node needs GLIBCXX_3.4.30 (GCC 12's libstdc++): the bundle's when the system's is older.
if ! "$node" -e "require('$tools/webgpu/dist/linux-x64/dawn.node')" 2>/dev/null; then
  export LD_LIBRARY_PATH="$tools/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "$node" -e "require('$tools/webgpu/dist/linux-x64/dawn.node')"
fi
# Dawn warns on every start without it.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
echo "node $("$node" --version), $("$ternion" --version 2>/dev/null || echo ternion), bundle: $(head -1 "$bundle/MANIFEST" 2>/dev/null || echo '(no MANIFEST)')"

if [ "$cpu" = 0 ]; then
  if ! ldconfig -p | grep 'libvulkan\.so\.1' >/dev/null; then
    echo "error: no Vulkan loader (libvulkan.so.1): install libvulkan1 first" >&2
    exit 1
  fi
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] && [ -f "$icd" ] &&
    ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1; then
    export VK_DRIVER_FILES="$icd"
  fi
fi

export XDG_CACHE_HOME="$work/cache"
model="$XDG_CACHE_HOME/ternion/synth-$model_name.gguf"
backend=gpu
[ "$cpu" = 1 ] && backend=cpu
# Writes the synthetic model into the cache folder (once).
"$ternion" bench --synthetic "$model_name" --backend cpu -P 1 -n 1 >/dev/null

results="$out/results.jsonl"
: >"$results"
# One line of results.jsonl: {"engine", "round", "result": the program's JSON line}.
record() {
  while IFS= read -r line; do
    case "$line" in
      \{*) printf '{"engine":"%s","round":%s,"result":%s}\n' "$1" "$2" "$line" >>"$results" ;;
    esac
  done
}
# run ENGINE ROUND COMMAND...: records the command's JSON lines; a failure is reported and
# the other runs go on.
run() {
  local engine="$1" round="$2"
  shift 2
  if ! "$@" | record "$engine" "$round"; then
    echo "warning: failed ($engine, round $round): $*" >&2
  fi
}
native() {
  local bench=("$ternion" bench --model "$model" --backend "$backend" -P "$n_prompt"
    -n "$n_gen" --json)
  if [ "$cpu" = 1 ]; then
    run native "$1" "${bench[@]}"
    return
  fi
  local v
  for v in "" "--gpu-prefill tiled" "--gpu-prefill tiled --gpu-no-f16" \
    "--gpu-prefill tiled --gpu-no-subgroups" "--gpu-prefill tiled --gpu-no-f16 --gpu-no-subgroups"; do
    # shellcheck disable=SC2086 # $v is a list of flags
    run native "$1" "${bench[@]}" $v
  done
}
web() {
  local bench=("$node" crates/ternion-web/examples/node-bench.mjs "$model" -P "$n_prompt"
    -n "$n_gen")
  if [ "$cpu" = 1 ]; then
    run node-cpu "$1" "${bench[@]}" --cpu
    run dawn-null "$1" "${bench[@]}" --webgpu "$tools/webgpu" --dawn backend=null \
      --variants all --no-generate --warmup-ms 0
  else
    local d
    for d in "${dawn_flags[@]}"; do bench+=(--dawn "$d"); done
    run dawn "$1" "${bench[@]}" --webgpu "$tools/webgpu" --variants all
  fi
}
for r in $(seq 1 "$rounds"); do
  echo "round $r of $rounds: native, then Dawn"
  native "$r"
  web "$r"
done

python3 - "$results" "$n_prompt" "$n_gen" <<'EOF' | tee "$out/table.txt"
import json, sys
from collections import defaultdict

path, n_prompt, n_gen = sys.argv[1], sys.argv[2], sys.argv[3]
runs = defaultdict(list)
info = {}
for line in open(path):
    rec = json.loads(line)
    r, engine = rec["result"], rec["engine"]
    k = r.get("kernels") or {}
    if k:
        variant = "{}, {}, {}".format(
            k["prefill"], "f16" if k["f16"] else "f32", "subgroups" if k["subgroups"] else "workgroup")
        info[engine] = k.get("adapter") or (r.get("adapter") or {}).get("description", "")
    else:
        variant = "cpu"
    runs[(engine, variant)].append(r)

def mean(xs):
    return sum(xs) / len(xs)

print(f"pp{n_prompt} and tg{n_gen} tok/s, the mean of the runs (each run in brackets)")
for engine, name in info.items():
    if name:
        print(f"  {engine}: {name}")
print(f"{'engine':<10} {'prefill, reductions':<32} {'pp tok/s':>26} {'tg tok/s':>26}")
best = {}
cell = lambda xs: f"{mean(xs):.1f} ({' '.join(f'{x:.0f}' for x in xs)})"
for (engine, variant), rs in sorted(runs.items()):
    if engine == "dawn-null":
        print(f"{engine:<10} {variant:<32} {'compiled (null backend: no figures)':>53}")
        continue
    pp = [x["prefill_tok_s"] for x in rs]
    tg = [x["decode_tok_s"] for x in rs]
    best[(engine, variant)] = (mean(pp), mean(tg))
    print(f"{engine:<10} {variant:<32} {cell(pp):>26} {cell(tg):>26}")
    if rs[0].get("generate_decode_tok_s") is not None:
        g = [x["generate_decode_tok_s"] for x in rs]
        print(f"{'':<10} {'  generate(), chained':<32} {'':>26} {cell(g):>26}")
    if rs[0].get("generate_per_token_decode_tok_s") is not None:
        g = [x["generate_per_token_decode_tok_s"] for x in rs]
        print(f"{'':<10} {'  generate(), token by token':<32} {'':>26} {cell(g):>26}")
native = {v: s for (e, v), s in best.items() if e == "native"}
dawn = {v: s for (e, v), s in best.items() if e == "dawn"}
if native and dawn:
    print("Dawn / native, same kernels:")
    for v in sorted(set(native) & set(dawn)):
        (npp, ntg), (dpp, dtg) = native[v], dawn[v]
        print(f"  {v:<32} pp {100 * dpp / npp:5.1f} %   tg {100 * dtg / ntg:5.1f} %")
    npp, ntg = max(s[0] for s in native.values()), max(s[1] for s in native.values())
    dpp, dtg = max(s[0] for s in dawn.values()), max(s[1] for s in dawn.values())
    print(f"  best of each                     pp {100 * dpp / npp:5.1f} %   tg {100 * dtg / ntg:5.1f} %"
          f"   (goal: 80 %)")
EOF
echo "results: $results, table: $out/table.txt"
