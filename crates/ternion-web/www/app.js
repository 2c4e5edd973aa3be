// The chat page's logic: model picker (a GGUF URL, an MLC directory URL, a local file),
// OPFS caching with download progress (cache.js), loading through the wasm API (range
// requests or File slices into GPU buffers), streaming output, the cache panel.
//
// Query parameters drive it without clicks (the browser tests use them):
//   ?model=URL | mlc=BASE_URL, prompt=TEXT, n=16, temperature=0, backend=webgpu|cpu,
//   cache=0|1, chat=0|1, ignore_eos=1, auto=1
// After a load window.ternionLoad is { files, fromCache } (files read through the cache,
// and how many of them were already there).
// On completion document.body.dataset.state is "done" and window.ternionResult holds the
// result ({ promptTokens, tokens, text, ... }); on failure the state is "error" (or
// "nowebgpu" when the browser has no WebGPU) and #status holds the message.
import init, { Ternion } from "../pkg/ternion_web.js";
import { cachedFile, clearCache, hasOpfs, listCache, storageEstimate } from "./cache.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let model = null;

function setState(state, message, isError = false) {
  document.body.dataset.state = state;
  if (message !== undefined) {
    $("status").textContent = message;
    $("status").className = isError ? "error" : "";
  }
}

function showProgress(phase, done, total) {
  $("progress").max = total || 1;
  $("progress").value = done;
  const mb = (x) => (x / 1048576).toFixed(1);
  setState("loading", `${phase}: ${mb(done)} of ${mb(total)} MiB`);
}

// WebGPU is usable when the browser exposes navigator.gpu AND gives an adapter (Chromium
// exposes navigator.gpu but gives no adapter when WebGPU is blocked or disabled).
async function webgpuUsable() {
  if (!Ternion.hasWebGpu()) return false;
  try { return !!(await navigator.gpu.requestAdapter()); } catch (_) { return false; }
}

async function load() {
  const backend = $("backend").value;
  if (backend === "webgpu" && !(await webgpuUsable())) {
    setState("nowebgpu", "no WebGPU: this browser gives no WebGPU adapter. " +
      "Use a browser with WebGPU enabled (Chrome/Edge 113+, or --enable-unsafe-webgpu), " +
      "or the CPU backend for small models.", true);
    return false;
  }
  const options = { backend, nCtx: Number($("nctx").value) || 2048 };
  const source = document.querySelector("input[name=source]:checked").value;
  const useCache = $("cache").checked && hasOpfs();
  const fetched = { files: 0, fromCache: 0 };
  // A file through the OPFS cache (downloaded into it the first time).
  // A quota error shown as itself, not wrapped by the loader that called `open`.
  let quota = null;
  const viaCache = async (url, optional) => {
    const r = await cachedFile(url, showProgress, optional).catch((e) => {
      if (e.name === "QuotaExceeded") quota = e;
      throw e;
    });
    if (r.file) {
      fetched.files += 1;
      if (r.cached) fetched.fromCache += 1;
    }
    return r.file;
  };
  $("load").disabled = true;
  const t0 = performance.now();
  try {
    model = null;
    if (source === "file") {
      const f = $("file").files[0];
      if (!f) throw new Error("choose a .gguf file first");
      model = await Ternion.loadFile(f, f.name, options, showProgress);
    } else if (source === "mlc") {
      const base = new URL($("mlcurl").value, location.href).href;
      const open = useCache ? (url) => viaCache(url, true) : undefined;
      model = await Ternion.loadMlc(base, { ...options, open }, showProgress);
    } else {
      const url = new URL($("url").value, location.href).href;
      let file = null;
      if (useCache) {
        try {
          file = await viaCache(url, false);
        } catch (e) {
          if (e.name === "QuotaExceeded") throw e;
          console.warn("OPFS cache:", e);
        }
      }
      model = file
        ? await Ternion.loadFile(file, url, options, showProgress)
        : await Ternion.loadUrl(url, options, showProgress);
    }
    const s = ((performance.now() - t0) / 1000).toFixed(1);
    const cached = fetched.files ? ` ${fetched.fromCache} of ${fetched.files} files from the browser cache.` : "";
    window.ternionLoad = fetched;
    setState("ready", `Loaded in ${s} s on ${model.backend} (${model.adapter}).${cached}`);
    await showCache();
    for (const id of ["generate", "reset"]) $(id).disabled = false;
    return true;
  } catch (e) {
    setState("error", (quota || e).message || String(e), true);
    return false;
  } finally {
    $("load").disabled = false;
  }
}

async function generate() {
  if (!model) return null;
  $("generate").disabled = true;
  $("stop").disabled = false;
  setState("generating", "Generating…");
  const options = {
    maxTokens: Number($("maxTokens").value) || 128,
    temperature: Number($("temperature").value),
    chat: $("chat").checked,
    ignoreEos: params.get("ignore_eos") === "1",
  };
  try {
    const r = await model.generate($("prompt").value, options, (_id, text) => {
      $("output").textContent += text;
    });
    $("output").textContent += "\n";
    $("stats").textContent = `prompt ${r.promptTokens.length} tokens, ${r.promptTokS.toFixed(1)} tok/s · ` +
      `decode ${r.tokens.length} tokens, ${r.decodeTokS.toFixed(1)} tok/s · finish: ${r.finish}`;
    window.ternionResult = r;
    setState("done", `Done on ${model.backend} (${model.adapter}).`);
    return r;
  } catch (e) {
    setState("error", String(e.message || e), true);
    return null;
  } finally {
    $("generate").disabled = false;
    $("stop").disabled = true;
  }
}

// The cache panel: every cached file with its size, and the storage in use.
async function showCache() {
  const files = await listCache();
  const list = $("cachelist");
  list.replaceChildren(...files.map((f) => {
    const li = document.createElement("li");
    li.textContent = `${f.url} (${(f.size / 1048576).toFixed(1)} MiB)`;
    return li;
  }));
  const total = files.reduce((n, f) => n + f.size, 0);
  const e = await storageEstimate();
  const quota = e && e.quota ? ` · this site uses ${(e.usage / 1048576).toFixed(1)} of ` +
    `${(e.quota / 1048576).toFixed(0)} MiB allowed` : "";
  $("cacheinfo").textContent = hasOpfs()
    ? `${files.length} files, ${(total / 1048576).toFixed(1)} MiB${quota}`
    : "this browser has no origin-private file system; nothing is cached";
  document.body.dataset.cacheFiles = String(files.length);
}

function applyParams() {
  const p = (k) => params.get(k);
  if (p("model")) $("url").value = p("model");
  if (p("mlc")) {
    $("mlcurl").value = p("mlc");
    document.querySelector("input[name=source][value=mlc]").checked = true;
  }
  if (p("prompt") !== null) $("prompt").value = p("prompt");
  if (p("n")) $("maxTokens").value = p("n");
  if (p("temperature") !== null) $("temperature").value = p("temperature");
  if (p("backend")) $("backend").value = p("backend");
  if (p("cache") !== null) $("cache").checked = p("cache") === "1";
  if (p("chat") !== null) $("chat").checked = p("chat") === "1";
}

async function main() {
  applyParams();
  await init();
  $("load").onclick = load;
  $("generate").onclick = generate;
  $("stop").onclick = () => model && model.stop();
  $("reset").onclick = () => {
    if (model) { model.reset(); $("output").textContent = ""; $("stats").textContent = ""; }
  };
  $("cacherefresh").onclick = showCache;
  $("cacheclear").onclick = async () => {
    const n = await clearCache();
    await showCache();
    $("cacheinfo").textContent += ` (removed ${n} entries)`;
  };
  await showCache();
  if (!(await webgpuUsable())) {
    setState("nowebgpu", "no WebGPU: this browser gives no WebGPU adapter. " +
      "Use a browser with WebGPU enabled, or the CPU backend for small models.", true);
  } else {
    setState("idle");
  }
  if (params.get("auto") === "1" && await load()) await generate();
}

main().catch((e) => setState("error", String(e.message || e), true));
