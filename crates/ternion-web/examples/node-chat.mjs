#!/usr/bin/env node
// A terminal chat on the npm package under Node.js ≥ 20 (after scripts/web-build.sh):
//
//   node crates/ternion-web/examples/node-chat.mjs MODEL.gguf            # chat, CPU backend
//   node crates/ternion-web/examples/node-chat.mjs URL --prompt "Hi" -n 64  # one reply
//   node crates/ternion-web/examples/node-chat.mjs MODEL.gguf --gpu      # WebGPU via Dawn
//
// MODEL is a file path or an http(s) URL of a server that answers range requests. --gpu
// needs the `webgpu` package (Dawn for Node: `npm install webgpu`) and a GPU that Dawn
// accepts; without it the CPU backend runs (whole file in memory: small models only).
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import init, { load } from "ternion-web";

const { values: opt, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    prompt: { type: "string" },
    n: { type: "string", short: "n", default: "256" },
    temperature: { type: "string", default: "0.8" },
    system: { type: "string" },
    gpu: { type: "boolean", default: false },
    "n-ctx": { type: "string", default: "2048" },
  },
});
if (positionals.length !== 1) {
  console.error("usage: node-chat.mjs MODEL.gguf|URL [--prompt TEXT] [-n N] [--temperature T] " +
    "[--system TEXT] [--gpu] [--n-ctx N]");
  process.exit(2);
}

async function webgpu() {
  const { create, globals } = await import("webgpu").catch(() => {
    throw new Error("--gpu needs the `webgpu` package (npm install webgpu)");
  });
  Object.assign(globalThis, globals);
  return create([]);
}

await init();
const gpu = opt.gpu ? await webgpu() : undefined;
const t = await load(positionals[0], { nCtx: Number(opt["n-ctx"]), gpu }, (phase, done, total) => {
  process.stderr.write(`\r${phase}: ${(done / 1048576).toFixed(1)} of ` +
    `${(total / 1048576).toFixed(1)} MiB`);
});
process.stderr.write(`\nloaded on ${t.backend} (${t.adapter})\n`);

const settings = {
  chat: true,
  system: opt.system,
  maxTokens: Number(opt.n),
  temperature: Number(opt.temperature),
};

async function reply(text) {
  const r = await t.generate(text, settings, (_id, piece) => { process.stdout.write(piece); });
  process.stderr.write(`\n[${r.tokens.length} tokens, prompt ${r.promptTokS.toFixed(1)} tok/s, ` +
    `decode ${r.decodeTokS.toFixed(1)} tok/s, ${r.finish}]\n`);
}

if (opt.prompt !== undefined) {
  await reply(opt.prompt);
} else {
  // Ctrl-C stops a reply, or quits at the prompt; /reset forgets the conversation.
  const rl = createInterface({ input: process.stdin, output: process.stdout, prompt: "> " });
  let busy = false;
  rl.on("SIGINT", () => (busy ? t.stop() : rl.close()));
  rl.prompt();
  for await (const line of rl) {
    if (line === "/quit") break;
    if (line === "/reset") {
      t.reset();
    } else if (line.trim()) {
      busy = true;
      await reply(line);
      busy = false;
    }
    rl.prompt();
  }
  rl.close();
}
