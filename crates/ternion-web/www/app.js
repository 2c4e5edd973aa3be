// The chat page's logic: model picker, OPFS caching with download progress, loading
// through the wasm API (range requests or File slices into GPU buffers), streaming output.
//
// Query parameters drive it without clicks (the browser tests use them):
//   ?model=URL&prompt=TEXT&n=16&temperature=0&backend=webgpu|cpu&cache=0|1&chat=0|1
//   &ignore_eos=1&auto=1
// On completion document.body.dataset.state is "done" and window.ternionResult holds the
// result ({ promptTokens, tokens, text, ... }); on failure the state is "error" (or
// "nowebgpu" when the browser has no WebGPU) and #status holds the message.
import init, { Ternion } from "../pkg/ternion_web.js";

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

async function cacheName(url) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(url));
  const hex = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
  return `ternion-${hex.slice(0, 32)}.gguf`;
}

// The file at `url`, from the origin-private file system when a complete copy is there,
// else downloaded into it with progress. Returns null when OPFS is unavailable.
async function cachedFile(url) {
  if (!navigator.storage || !navigator.storage.getDirectory) return null;
  const root = await navigator.storage.getDirectory();
  const name = await cacheName(url);
  try {
    await root.getFileHandle(name + ".complete");
    const file = await (await root.getFileHandle(name)).getFile();
    return { file, cached: true };
  } catch (_) { /* not cached yet */ }
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`${url}: HTTP status ${resp.status}`);
  const total = Number(resp.headers.get("Content-Length")) || 0;
  const handle = await root.getFileHandle(name, { create: true });
  const out = await handle.createWritable();
  const reader = resp.body.getReader();
  let done = 0;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    await out.write(value);
    done += value.length;
    showProgress("download", done, total);
  }
  await out.close();
  await root.getFileHandle(name + ".complete", { create: true });
  return { file: await handle.getFile(), cached: false };
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
  const fromFile = document.querySelector("input[name=source]:checked").value === "file";
  $("load").disabled = true;
  const t0 = performance.now();
  try {
    model = null;
    if (fromFile) {
      const f = $("file").files[0];
      if (!f) throw new Error("choose a .gguf file first");
      model = await Ternion.loadFile(f, f.name, options, showProgress);
    } else {
      const url = new URL($("url").value, location.href).href;
      let cached = null;
      if ($("cache").checked) {
        try { cached = await cachedFile(url); } catch (e) { console.warn("OPFS cache:", e); }
      }
      model = cached
        ? await Ternion.loadFile(cached.file, url, options, showProgress)
        : await Ternion.loadUrl(url, options, showProgress);
    }
    const s = ((performance.now() - t0) / 1000).toFixed(1);
    setState("ready", `Loaded in ${s} s on ${model.backend} (${model.adapter}).`);
    for (const id of ["generate", "reset"]) $(id).disabled = false;
    return true;
  } catch (e) {
    setState("error", String(e.message || e), true);
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

function applyParams() {
  const p = (k) => params.get(k);
  if (p("model")) $("url").value = p("model");
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
  if (!(await webgpuUsable())) {
    setState("nowebgpu", "no WebGPU: this browser gives no WebGPU adapter. " +
      "Use a browser with WebGPU enabled, or the CPU backend for small models.", true);
  } else {
    setState("idle");
  }
  if (params.get("auto") === "1" && await load()) await generate();
}

main().catch((e) => setState("error", String(e.message || e), true));
