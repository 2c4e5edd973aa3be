#!/usr/bin/env bash
# Builds the folder that scripts/dawn-bench.sh unpacks on a GPU machine without network
# (issue 18): the wasm package (scripts/web-build.sh), the native `ternion` built from
# the same tree, a Node.js binary, the `webgpu` package's linux-x64 Dawn (dawn.node), and
# this machine's libstdc++ (dawn.node needs GCC 12's; used only where the GPU machine's is
# older), each xz-compressed (about 36 MB in all), with a MANIFEST of versions and sizes.
#
#   scripts/dawn-bundle.sh [OUT_DIR]        # default: devweb (add it to .git/info/exclude)
#
# NODE_BIN: the Node.js binary to ship (default: `node` on the PATH; it must need nothing
# but glibc and libstdc++, as the nodejs.org and NodeSource builds). WEBGPU_DIR: an
# unpacked `webgpu` package to take dawn.node from (default: `npm pack webgpu@$WEBGPU_VERSION`,
# which needs the npm registry). Needs what web-build.sh needs, and xz.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-devweb}"
webgpu_version="${WEBGPU_VERSION:-0.6.2}"
node_bin="${NODE_BIN:-$(command -v node || true)}"
[ -x "$node_bin" ] || { echo "error: no Node.js binary (set NODE_BIN)" >&2; exit 1; }
major=$("$node_bin" --version | sed -E 's/^v([0-9]+).*/\1/')
[ "$major" -ge 20 ] || { echo "error: $node_bin is Node $major; 20 or later is needed" >&2; exit 1; }
others=$(ldd "$node_bin" | grep -Ev 'linux-vdso|ld-linux|lib(c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so' || true)
if [ -n "$others" ]; then
  echo "error: $node_bin links libraries the GPU machine may lack:" >&2
  echo "$others" >&2
  echo "use a nodejs.org build (NODE_BIN=/path/to/node-v22-linux-x64/bin/node)" >&2
  exit 1
fi

./scripts/web-build.sh
cargo build --release -p ternion-cli -j2
target="${CARGO_TARGET_DIR:-target}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
webgpu="${WEBGPU_DIR:-}"
if [ -z "$webgpu" ]; then
  (cd "$tmp" && npm pack --silent "webgpu@$webgpu_version" >/dev/null && tar xzf webgpu-*.tgz)
  webgpu="$tmp/package"
fi
[ -f "$webgpu/dist/linux-x64/dawn.node" ] || { echo "error: no dist/linux-x64/dawn.node in $webgpu" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/webgpu"
cp "$webgpu/index.js" "$webgpu/package.json" "$webgpu/LICENSE.md" "$out/webgpu/"
xz -T2 -6 -c "$webgpu/dist/linux-x64/dawn.node" >"$out/dawn.node.xz"
xz -T2 -6 -c "$node_bin" >"$out/node.xz"
xz -T2 -6 -c "$target/release/ternion" >"$out/ternion.xz"
# (awk reads to the end: an early exit would stop ldconfig with SIGPIPE, which pipefail reports)
libstdcxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ && !p { p = $NF } END { print p }')
xz -T2 -6 -c "$(readlink -f "$libstdcxx")" >"$out/libstdc++.so.6.xz"
tar -C crates/ternion-web -cJf "$out/pkg.tar.xz" pkg
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "node $("$node_bin" --version)"
  echo "webgpu $(sed -nE 's/.*"version": "([^"]+)".*/\1/p' "$webgpu/package.json")"
  (cd "$out" && sha256sum dawn.node.xz node.xz ternion.xz pkg.tar.xz libstdc++.so.6.xz)
} >"$out/MANIFEST"
du -ab "$out" | sort -k2 >>"$out/MANIFEST"
cat "$out/MANIFEST"
echo "bundle in $out ($(du -sh "$out" | cut -f1)); on the GPU machine: scripts/dawn-bench.sh --bundle $out"
