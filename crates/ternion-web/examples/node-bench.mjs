#!/usr/bin/env node
// The browser engine's speed under Node.js ≥ 20 (after scripts/web-build.sh): loads a
// GGUF through the npm package, on WebGPU through the `webgpu` package (Dawn, as in
// Chrome) or the CPU, and times prefill and decode as `ternion bench` times native wgpu
// (`Ternion#bench`: the same random prompt, a warm-up, greedy decode with the argmax on
// the GPU). Prints one JSON line per kernel variant; scripts/dawn-bench.sh runs it next to
// the native bench. `generate_*` fields time `generate()` on the same model (greedy, the
// bench's ids as the prompt): what an app sees, greedy steps chained on the GPU with the
// ids read back a few at a time and streamed to the callback; `generate_per_token_*` the
// same with `chain: false`, each token read back before the next step (--no-generate
// skips both: Dawn's backend=null, which validates every kernel but computes nothing,
// needs that).
//
//   node crates/ternion-web/examples/node-bench.mjs MODEL.gguf -P 512 -n 128
//   node crates/ternion-web/examples/node-bench.mjs MODEL.gguf --variants all
//   node crates/ternion-web/examples/node-bench.mjs MODEL.gguf --cpu -P 16 -n 8
//
// --variants takes `all` or a comma list of f16+subgroups, f16, subgroups, none (the
// portable prompt tiles) and subgroup-matrix (the int8 subgroup-matrix tiles where offered):
// each is a new device with only those features asked for (a variant the adapter lacks runs
// without it; the line says what ran). Every run must give the greedy ids of the first run
// with the same float width and reductions (whatever the prompt kernel, the logits are the
// same bits), else the script fails. --no-f16 / --no-subgroups turn one off for the
// default run. --prefill auto|tiled|subgroup-matrix sets the prompt kernel of every run
// (subgroup-matrix: fail where the adapter lacks it). --webgpu DIR loads the `webgpu` package from DIR instead of node_modules;
// --dawn FLAG (repeatable) is passed to its create(), e.g. backend=vulkan.
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import init, { load } from "ternion-web";

const USAGE = "usage: node-bench.mjs MODEL.gguf [-P N] [-n N] [--ubatch N] [--warmup-ms MS] " +
  "[--variants all|LIST] [--no-f16] [--no-subgroups] [--cpu] [--webgpu DIR] [--dawn FLAG]... " +
  "[--repeat N] [--no-generate] [--prefill auto|tiled|subgroup-matrix]";

function args(spec) {
  try {
    return parseArgs(spec);
  } catch (e) {
    console.error(`${e.message}\n${USAGE}`);
    process.exit(2);
  }
}

const { values: opt, positionals } = args({
  allowPositionals: true,
  options: {
    "prompt-tokens": { type: "string", short: "P", default: "512" },
    "n-predict": { type: "string", short: "n", default: "128" },
    ubatch: { type: "string", default: "512" },
    "warmup-ms": { type: "string", default: "1500" },
    variants: { type: "string" },
    "no-f16": { type: "boolean", default: false },
    "no-subgroups": { type: "boolean", default: false },
    cpu: { type: "boolean", default: false },
    webgpu: { type: "string" },
    dawn: { type: "string", multiple: true, default: [] },
    repeat: { type: "string", default: "1" },
    "no-generate": { type: "boolean", default: false },
    prefill: { type: "string" },
  },
});

function whole(name, min) {
  const v = Number(opt[name]);
  if (!Number.isInteger(v) || v < min) {
    console.error(`--${name} must be a whole number ≥ ${min}, got '${opt[name]}'`);
    process.exit(2);
  }
  return v;
}

if (positionals.length !== 1) {
  console.error(USAGE);
  process.exit(2);
}
const model = positionals[0];
const nPrompt = whole("prompt-tokens", 1);
const nGen = whole("n-predict", 1);
const ubatch = whole("ubatch", 1);
const warmupMs = whole("warmup-ms", 0);
const repeat = whole("repeat", 1);

// The portable prompt tiles with each feature set, and the int8 subgroup-matrix tiles
// (where the adapter offers them: Dawn needs --dawn enable-dawn-features=allow_unsafe_apis).
const VARIANTS = {
  "f16+subgroups": { f16: true, subgroups: true, prefill: "tiled" },
  f16: { f16: true, subgroups: false, prefill: "tiled" },
  subgroups: { f16: false, subgroups: true, prefill: "tiled" },
  none: { f16: false, subgroups: false, prefill: "tiled" },
  "subgroup-matrix": { f16: false, subgroups: true, prefill: "auto" },
};

function variantsAsked() {
  if (opt.cpu) return [null];
  if (opt.variants === undefined) {
    return [{ f16: !opt["no-f16"], subgroups: !opt["no-subgroups"] }];
  }
  const names = opt.variants === "all" ? Object.keys(VARIANTS) : opt.variants.split(",");
  return names.map((n) => {
    if (!VARIANTS[n]) {
      console.error(`unknown variant '${n}' (all, or a list of ${Object.keys(VARIANTS).join(", ")})`);
      process.exit(2);
    }
    return VARIANTS[n];
  });
}

// The `webgpu` package's GPU object (Dawn), and what its adapter says about itself.
async function dawn() {
  const url = opt.webgpu ? pathToFileURL(join(resolve(opt.webgpu), "index.js")).href : "webgpu";
  const { create, globals } = await import(url).catch((e) => {
    throw new Error(`the webgpu package (npm install webgpu, or --webgpu DIR): ${e.message}`);
  });
  Object.assign(globalThis, globals);
  const gpu = create(opt.dawn);
  const adapter = await gpu.requestAdapter();
  if (!adapter) throw new Error(`Dawn found no adapter (create(${JSON.stringify(opt.dawn)}))`);
  const i = adapter.info;
  const info = {
    vendor: i.vendor, architecture: i.architecture, device: i.device,
    description: i.description, subgroupMinSize: i.subgroupMinSize,
    subgroupMaxSize: i.subgroupMaxSize,
    features: [...adapter.features].filter((f) => /f16|subgroup|timestamp/.test(f)).sort(),
  };
  return { gpu, info };
}

// The greedy ids of the first run of each float width and reduction kind, which every other
// such run must repeat (not on Dawn's null backend, which computes nothing).
const idsOf = new Map();
const noNull = !opt.dawn.includes("backend=null");

async function run(gpu, adapter, asked) {
  const options = { nCtx: nPrompt + nGen + 1, maxBatch: ubatch };
  if (asked) {
    const prefill = opt.prefill ?? asked.prefill;
    Object.assign(options, { gpu, f16: asked.f16, subgroups: asked.subgroups, prefill });
  }
  else options.backend = "cpu";
  const t0 = performance.now();
  const t = await load(model, options);
  const loadS = (performance.now() - t0) / 1e3;
  const kernels = t.gpu;
  for (let r = 0; r < repeat; r++) {
    const b = await t.bench({ promptTokens: nPrompt, genTokens: nGen, warmupMs });
    // Runs with the same reductions and float width compute the same logits bit for bit,
    // whatever their prompt kernel, so the same greedy ids.
    const ids = JSON.stringify(b.ids);
    const same = kernels && `f16 ${kernels.f16}, subgroups ${kernels.subgroups}`;
    if (same && noNull && idsOf.has(same) && idsOf.get(same).ids !== ids) {
      throw new Error(`ids differ between prompt kernels ${idsOf.get(same).prefill} and ` +
        `${kernels.prefill} (${same}): ${ids} against ${idsOf.get(same).ids}`);
    }
    if (same && !idsOf.has(same)) idsOf.set(same, { ids, prefill: kernels.prefill });
    // What an app sees: generate() with a callback per token; chained greedy steps, and
    // with `chain: false` one step per token, each read back before the next.
    let g = {};
    let gp = {};
    if (!opt["no-generate"]) {
      const tokens = Array.from({ length: nPrompt }, (_, i) => b.ids[i % b.ids.length]);
      const gen = async (chain) => {
        let streamed = 0;
        const r = await t.generate("", {
          tokens, maxTokens: nGen, temperature: 0, ignoreEos: true, chain,
        }, (id) => { if (id !== undefined) streamed++; });
        t.reset();
        if (streamed !== r.tokens.length) {
          throw new Error(`generate(chain: ${chain}): ${streamed} callbacks for ${r.tokens.length} tokens`);
        }
        return r;
      };
      g = await gen(true);
      gp = await gen(false);
      if (JSON.stringify(g.tokens) !== JSON.stringify(gp.tokens)) {
        throw new Error("generate(): chained and per-token ids differ");
      }
    }
    console.log(JSON.stringify({
      engine: `ternion-web (wasm) on Node ${process.version}`,
      backend: t.backend,
      dawn_flags: asked ? opt.dawn : undefined,
      adapter,
      asked,
      kernels: kernels && {
        ...kernels,
        reductions: kernels.subgroups
          ? `subgroup (rows of ≤ ${kernels.subgroupMinSize} lanes), else workgroup memory`
          : "workgroup memory",
      },
      model,
      n_prompt: nPrompt,
      n_gen: nGen,
      ubatch,
      run: r + 1,
      load_s: loadS,
      prefill_tok_s: b.prefillTokS,
      decode_tok_s: b.decodeTokS,
      prefill_ms: b.prefillMs,
      decode_ms: b.decodeMs,
      warmup_ms: b.warmupMs,
      warmup_rounds: b.warmupRounds,
      ids_head: b.ids.slice(0, 8),
      generate_prompt_tok_s: g.promptTokS,
      generate_decode_tok_s: g.decodeTokS,
      generate_per_token_decode_tok_s: gp.decodeTokS,
    }));
  }
  t.free();
}

try {
  await init();
  const asked = variantsAsked();
  const { gpu, info } = opt.cpu ? {} : await dawn();
  for (const a of asked) await run(gpu, info, a);
  process.exit(0);
} catch (e) {
  console.error(`node-bench: ${e.name}: ${e.message}`);
  process.exit(1);
}
