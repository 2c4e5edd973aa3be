// The npm package under Node.js (run by scripts/node-test.sh): a micro synthetic model from
// the native CLI, loaded through the package's Node entry point (imported by the package's
// own name, so through package.json's "exports") from a file path, a file: URL and an
// http URL served from 127.0.0.1 with range requests, and an MLC directory from
// `ternion synth --mlc` by path; each must give the native CPU backend's greedy token ids
// (`ternion run --json`). Then the errors a caller can meet.
//
//   node crates/ternion-web/tests/node.mjs --ternion target/release/ternion
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import {
  mkdtempSync, openSync, readSync, closeSync, rmSync, statSync, writeFileSync,
} from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

import init, { load, Ternion } from "ternion-web";

const PROMPT = "Ternary weights in Node";
const N = 16;

const { values: args } = parseArgs({ options: { ternion: { type: "string" } } });
assert.ok(args.ternion, "usage: node node.mjs --ternion PATH");

function nativeIds(model) {
  const out = execFileSync(args.ternion, ["run", "--model", model, "--backend", "cpu",
    "--prompt", PROMPT, "-n", String(N), "--temperature", "0", "--ignore-eos", "--json"],
  { encoding: "utf8", stdio: "pipe" });
  const v = JSON.parse(out.trim().split("\n").at(-1));
  return { prompt: v.prompt_tokens, tokens: v.tokens };
}

// A static server for one file that answers range requests (206 with Content-Range).
function serve(path) {
  const size = statSync(path).size;
  const server = createServer((req, res) => {
    const m = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? "");
    const [start, end] = m ? [Number(m[1]), Math.min(Number(m[2]) + 1, size)] : [0, size];
    const body = Buffer.alloc(end - start);
    const fd = openSync(path, "r");
    readSync(fd, body, 0, body.length, start);
    closeSync(fd);
    const head = { "Content-Length": body.length };
    if (m) head["Content-Range"] = `bytes ${start}-${end - 1}/${size}`;
    res.writeHead(m ? 206 : 200, head);
    res.end(req.method === "HEAD" ? undefined : body);
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

async function generate(model, want, label) {
  const phases = new Set();
  const t = await load(model, { nCtx: 256 }, (phase, done, total) => {
    assert.ok(done <= total, `${label}: progress ${done} of ${total}`);
    phases.add(phase);
  });
  assert.equal(t.backend, "cpu", `${label}: the default backend without a gpu`);
  assert.ok(phases.has("weights"), `${label}: no progress reported`);
  let streamed = "";
  const r = await t.generate(PROMPT, { maxTokens: N, temperature: 0, ignoreEos: true },
    (_id, text) => { streamed += text; });
  assert.deepEqual(r.promptTokens, want.prompt, `${label}: prompt ids`);
  assert.deepEqual(r.tokens, want.tokens, `${label}: generated ids`);
  assert.equal(streamed, r.text, `${label}: streamed text`);
  console.log(`node ${label}: ${r.tokens.length} ids match native; ` +
    `prompt ${r.promptTokS.toFixed(1)} tok/s, decode ${r.decodeTokS.toFixed(1)} tok/s`);
  return t;
}

async function rejects(promise, pattern, label) {
  await assert.rejects(promise, (e) => {
    assert.match(String(e.message ?? e), pattern, label);
    console.log(`node error ${label}: ${e.message ?? e}`);
    return true;
  }, label);
}

const work = mkdtempSync(join(tmpdir(), "ternion-node-"));
// Removed however the script ends (an assertion failing exits through here too).
process.on("exit", () => rmSync(work, { recursive: true, force: true }));
const model = join(work, "micro.gguf");
execFileSync(args.ternion, ["synth", "--shape", "micro", "--seed", "7", "--out", model],
  { stdio: "pipe" });
const want = nativeIds(model);
console.log(`native CPU: prompt ${JSON.stringify(want.prompt)} -> ${JSON.stringify(want.tokens)}`);

await init();
const t = await generate(model, want, "path");
await generate(pathToFileURL(model), want, "file URL");
const server = await serve(model);
try {
  await generate(`http://127.0.0.1:${server.address().port}/micro.gguf`, want, "http URL");
} finally {
  server.close();
}

// An MLC directory from the native test writer, loaded by path (file-backed Blobs), must
// give the native MLC path's ids.
const mlc = join(work, "mlc");
execFileSync(args.ternion, ["synth", "--mlc", "--shape", "micro", "--seed", "7", "--vocab",
  new URL("../../../../shared/vocab/ggml-vocab-phi-3.gguf", import.meta.url).pathname,
  "--shard-bytes", String(256 << 10), "--out", mlc], { stdio: "pipe" });
await generate(mlc, nativeIds(mlc), "MLC directory");

// The sequence continues across calls until reset; after a reset it starts over.
t.reset();
const again = await t.generate(PROMPT, { maxTokens: N, temperature: 0, ignoreEos: true });
assert.deepEqual(again.tokens, want.tokens, "after reset");

const junk = join(work, "junk.gguf");
writeFileSync(junk, "not a gguf file at all");
await rejects(load(model, { backend: "webgpu" }), /no WebGPU.*pass \{ gpu \}/, "no gpu");
await rejects(load(join(work, "missing.gguf")), /ENOENT.*missing\.gguf/, "missing file");
await rejects(load(junk), /junk\.gguf/, "not GGUF");
await rejects(load(model, { backend: "vulkan" }), /backend 'vulkan'/, "unknown backend");
await rejects(Ternion.loadReader({ name: "r", size: 10 }, {}), /no read\(start, end\)/,
  "reader without read");
await rejects(Ternion.loadReader({ name: "r", size: -1, read: () => null }, {}),
  /size must be a whole number of bytes, got -1/, "reader with a bad size");
await rejects(Ternion.loadReader({ name: "r", size: 64, read: () => "text" },
  { backend: "cpu" }),
  /read\(0, 64\) returned no Uint8Array/, "reader returning text");

// A caller's gpu object becomes navigator.gpu for wgpu: one that has no adapter to give
// must be asked, and the load must say so.
let asked = 0;
const noAdapter = { requestAdapter: async () => { asked += 1; return null; } };
await rejects(load(model, { gpu: noAdapter }), /no GPU adapter found/, "gpu without adapter");
assert.ok(asked > 0, "the caller's gpu object was never asked for an adapter");
console.log("node package: ok");
