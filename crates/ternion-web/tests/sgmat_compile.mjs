// Compiles the browser's subgroup-matrix prompt tiles (ternary_sgmat.wgsl, plain and
// `#if FUSED3`) with Dawn's null backend, the shader compiler Chrome uses, so that CI catches
// a kernel Dawn would reject (naga cannot read it, and no CI machine has a GPU whose
// WebGPU offers subgroup matrices; the kernel's numbers are checked on a real GPU by
// examples/node-bench.mjs). The text is built as pipelines.rs builds it: the file
// preprocessed (#if / #else / #endif with the defines the browser passes), common.wgsl
// after it, web.rs's subgroup directives in front. The null adapter allows 16 KiB of
// workgroup memory, the kernel 40 KiB: the workgroup arrays keep their element type and
// every access its form, with fewer blocks of 16 rows (compilation only; nothing runs).
//
//   node crates/ternion-web/tests/sgmat_compile.mjs --webgpu DIR   (an unpacked `webgpu`
//   npm package; scripts/web-test.sh fetches it)
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const { values: args } = parseArgs({ options: { webgpu: { type: "string" } } });
assert.ok(args.webgpu, "usage: node sgmat_compile.mjs --webgpu DIR");
const kernels = new URL("../../ternion-gpu/src/kernels/", import.meta.url);
const read = (name) => readFileSync(new URL(name, kernels), "utf8");

// pipelines.rs's preprocessor: #if NAME / #else / #endif, nested.
function preprocess(text, defines) {
  const out = [];
  const stack = [];
  const active = () => stack.every((s) => s);
  for (const line of text.split("\n")) {
    const t = line.trim();
    if (t.startsWith("#if ")) stack.push(defines.includes(t.slice(4).trim()));
    else if (t === "#else") stack.push(!stack.pop());
    else if (t === "#endif") stack.pop();
    else if (active()) out.push(line);
  }
  assert.equal(stack.length, 0, "unbalanced #if");
  return out.join("\n");
}

function source(fused) {
  const defines = ["SUBGROUPS", ...(fused ? ["FUSED3"] : [])];
  let code = preprocess(read("ternary_sgmat.wgsl"), defines) + "\n" + read("common.wgsl");
  const decl = /var<workgroup> (\w+): array<array<i32, (\d+)>, (\d+)>;/g;
  const found = [...code.matchAll(decl)];
  assert.ok(found.length > 0, "ternary_sgmat.wgsl: no workgroup arrays of blocks");
  code = code.replace(decl, (_, name, words) => `var<workgroup> ${name}: array<array<i32, ${words}>, 4>;`);
  return "enable subgroups;\ndiagnostic(off, subgroup_uniformity);\n" + code;
}

const { create, globals } = await import(pathToFileURL(join(resolve(args.webgpu), "index.js")).href);
Object.assign(globalThis, globals);
const gpu = create(["backend=null", "enable-dawn-features=allow_unsafe_apis"]);
const adapter = await gpu.requestAdapter();
assert.ok(adapter, "Dawn's null backend gave no adapter");
const features = ["chromium-experimental-subgroup-matrix", "subgroups"];
for (const f of features) assert.ok(adapter.features.has(f), `the null adapter lacks ${f}`);
const device = await adapter.requestDevice({ requiredFeatures: features });

for (const fused of [false, true]) {
  const name = `ternary_sgmat.wgsl${fused ? " (FUSED3)" : ""}`;
  device.pushErrorScope("validation");
  const module = device.createShaderModule({ code: source(fused) });
  const errors = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
  assert.deepEqual(errors.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`), [], name);
  device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "matmul_tiled" } });
  const err = await device.popErrorScope();
  assert.equal(err, null, `${name}: ${err?.message}`);
  console.log(`${name}: compiled by Dawn (null backend)`);
}
device.destroy();
process.exit(0);
