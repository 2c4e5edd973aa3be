// The package's Node.js (≥ 20) entry point: the same wasm module and `Ternion` class as in
// the browser, plus what Node lacks.
//
//   import init, { load } from "ternion-web";
//   await init();                                   // the wasm, read from this package
//   const t = await load("model.gguf", { nCtx: 2048 }, (phase, done, total) => {});
//   const r = await t.generate("Hello", { maxTokens: 32, temperature: 0 });
//
// `load` takes a file path, a file: URL (both read by ranges through a file handle) or an
// http(s) URL (range requests); a directory, or a URL ending in `/`, is an MLC `q4f16_1`
// directory (`Ternion.loadMlc`; local files as file-backed Blobs). The backend is WebGPU when `options.gpu` is given (a
// WebGPU `GPU` object, e.g. `create([])` from the `webgpu` package, Dawn for Node) or when
// `navigator.gpu` exists, and the CPU otherwise; `options.backend` overrides the choice.
import { openAsBlob } from "node:fs";
import { open, readFile, stat } from "node:fs/promises";
import { fileURLToPath, pathToFileURL } from "node:url";
import initWasm, { Ternion } from "../pkg/ternion_web.js";

export { Ternion };

let ready = null;

/** Instantiates the wasm module (once; later calls return the same promise). */
export default function init() {
  ready ??= readFile(new URL("../pkg/ternion_web_bg.wasm", import.meta.url)).then((bytes) =>
    initWasm({ module_or_path: bytes }),
  );
  return ready;
}

/**
 * A reader over the file at `path` for `Ternion.loadReader`: `{ name, size, read(start,
 * end), close() }`; each `read` reads just those bytes through one file handle.
 */
export async function openFile(path) {
  const handle = await open(path, "r");
  const { size } = await handle.stat();
  return {
    name: String(path),
    size,
    async read(start, end) {
      const buf = new Uint8Array(end - start);
      for (let at = 0; at < buf.length; ) {
        const { bytesRead } = await handle.read(buf, at, buf.length - at, start + at);
        if (bytesRead === 0) {
          throw new Error(`${path}: the file ends at byte ${start + at}, before ${end}`);
        }
        at += bytesRead;
      }
      return buf;
    },
    close: () => handle.close(),
  };
}

// The wasm reaches WebGPU the way wgpu does in a browser: `navigator.gpu` on a global
// object that has a `Window` (or `WorkerGlobalScope`). Node has neither, so the caller's
// `gpu` is put there.
function exposeGpu(gpu) {
  if (!gpu) {
    if (globalThis.navigator?.gpu) return;
    throw new Error(
      "no WebGPU: Node.js has no navigator.gpu; pass { gpu } (a WebGPU GPU object, e.g. " +
        "create([]) from the `webgpu` package) or use backend \"cpu\" for small models",
    );
  }
  if (!globalThis.navigator) {
    Object.defineProperty(globalThis, "navigator", { value: {}, configurable: true });
  }
  Object.defineProperty(globalThis.navigator, "gpu", { value: gpu, configurable: true });
  if (globalThis.Window === undefined && globalThis.WorkerGlobalScope === undefined) {
    Object.defineProperty(globalThis, "Window", { value: class Window {}, configurable: true });
  }
}

function asUrl(model) {
  if (model instanceof URL) return model;
  return /^(https?|file):/i.test(String(model)) ? new URL(model) : null;
}

// A local MLC directory's files as file-backed Blobs, for `Ternion.loadMlc`'s `open`.
async function openLocal(url) {
  const path = fileURLToPath(url);
  try {
    if (!(await stat(path)).isFile()) return null;
  } catch (e) {
    if (e.code === "ENOENT") return null;
    throw e;
  }
  return openAsBlob(path);
}

async function isDir(path) {
  try { return (await stat(path)).isDirectory(); } catch (_) { return false; }
}

/**
 * Loads a GGUF model (or an MLC directory) from a file path or URL; `options` as `Ternion.loadUrl`'s plus `gpu`
 * (see the module comment), `onProgress(phase, done, total)` as weights arrive.
 */
export async function load(model, options = {}, onProgress = undefined) {
  await init();
  const { gpu, ...rest } = options;
  const backend = rest.backend ?? (gpu || globalThis.navigator?.gpu ? "webgpu" : "cpu");
  if (backend === "webgpu") exposeGpu(gpu);
  const wasmOptions = { ...rest, backend };
  const url = asUrl(model);
  const path = url ? (url.protocol === "file:" ? fileURLToPath(url) : null) : String(model);
  if (path !== null && (await isDir(path))) {
    const base = pathToFileURL(path).href.replace(/\/?$/, "/");
    return Ternion.loadMlc(base, { ...wasmOptions, open: openLocal }, onProgress);
  }
  if (url && url.pathname.endsWith("/") && url.protocol !== "file:") {
    return Ternion.loadMlc(url.href, wasmOptions, onProgress);
  }
  if (url && url.protocol !== "file:") {
    return Ternion.loadUrl(url.href, wasmOptions, onProgress);
  }
  const reader = await openFile(path);
  try {
    return await Ternion.loadReader(reader, wasmOptions, onProgress);
  } finally {
    await reader.close();
  }
}
