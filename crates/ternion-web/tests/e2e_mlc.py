#!/usr/bin/env python3
"""End-to-end browser test of MLC loading and the OPFS cache (run by scripts/web-test.sh).

1. The native test writer (`ternion synth --mlc`) writes a micro random-weight MLC
   `q4f16_1` Phi-3 directory over several shards; the native MLC path (`ternion run
   --model DIR --json`, CPU) gives the reference token ids.
2. Served from 127.0.0.1, the page loads it with `Ternion.loadMlc` on WebGPU (SwiftShader)
   through the OPFS cache: same ids. Reloaded, every file comes from the cache and the
   ids are the same again; the cache panel lists the files, and "Clear cache" empties it.
3. The CPU backend in the browser, by HTTP range requests (no cache): same ids.
4. WebLLM's Cache API entries (caches `webllm/model` and `webllm/config`, keyed by URL)
   under a base URL the server does not serve: the page loads from them alone.
5. OPFS writes failing with a (mocked) QuotaExceededError: the page says there is not
   enough browser storage and names the size needed.
"""
import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e import N, PROMPT, native_ids, report, serving  # noqa: E402
from webdriver import WEBGPU_FLAGS, Driver  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
VOCAB = os.path.join(REPO, "..", "shared", "vocab", "ggml-vocab-phi-3.gguf")


def url(port, base, auto=1, **extra):
    q = {"mlc": base, "prompt": PROMPT, "n": N, "temperature": 0, "chat": 0, "ignore_eos": 1,
         "auto": auto, **extra}
    return f"http://127.0.0.1:{port}/www/index.html?" + urllib.parse.urlencode(q)


def outcome(d, timeout):
    state = d.wait_state(["done", "error", "nowebgpu"], timeout)
    status = d.js("return document.getElementById('status').textContent")
    r = d.js("return window.ternionResult || null")
    load = d.js("return window.ternionLoad || null")
    return state, status, r, load


# Copies each file of the served directory into WebLLM's caches under another base URL.
FILL_WEBLLM = """
const [from, to, names, done] = arguments;
(async () => {
  for (const name of names) {
    const scope = name === "mlc-chat-config.json" ? "webllm/config" : "webllm/model";
    const cache = await caches.open(scope);
    await cache.put(new Request(to + name), await fetch(from + name));
  }
})().then(() => done("ok"), (e) => done(String(e)));
"""

MOCK_QUOTA = """
FileSystemWritableFileStream.prototype.write = function () {
  return Promise.reject(new DOMException("mocked: quota exceeded", "QuotaExceededError"));
};
document.getElementById("load").click();
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ternion", required=True, help="native ternion binary")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ternion-web-mlc-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    mlc = os.path.join(work, "mlc")
    subprocess.run([a.ternion, "synth", "--mlc", "--shape", "micro", "--vocab", VOCAB,
                    "--seed", "7", "--shard-bytes", str(256 << 10), "--out", mlc],
                   check=True, capture_output=True)
    names = sorted(f for f in os.listdir(mlc))
    shards = [f for f in names if f.startswith("params_shard_")]
    prompt_ids, want = native_ids(a.ternion, mlc)
    print(f"native MLC (CPU): {len(shards)} shards, prompt {prompt_ids} -> {want}")

    failures = []

    def check(what, state, status, r):
        got = r and r["tokens"]
        print(f"{what}: state {state}: {status}\n  ids {got}")
        if state != "done" or r["promptTokens"] != prompt_ids or got != want:
            failures.append(f"{what}: state {state}, ids {got} != native {want}: {status}")

    with serving(work) as port:
        with Driver(WEBGPU_FLAGS) as d:
            d.get(url(port, "/models/mlc/", cache=1))
            state, status, r, load = outcome(d, a.timeout)
            check("webgpu, first load (download into OPFS)", state, status, r)
            if not load or load["files"] != len(names) or load["fromCache"] != 0:
                failures.append(f"first load: {load} (want {len(names)} files, none cached)")
            d.get(url(port, "/models/mlc/", cache=1))
            state, status, r, load = outcome(d, a.timeout)
            check("webgpu, after a reload (from OPFS)", state, status, r)
            if not load or load["fromCache"] != len(names):
                failures.append(f"reload: {load} (want all {len(names)} files from the cache)")
            listed = d.js("return document.querySelectorAll('#cachelist li').length")
            d.js("document.getElementById('cacheclear').click()")
            d.wait_js("return document.body.dataset.cacheFiles === '0'", 30)
            print(f"cache panel: {listed} files listed, 0 after Clear")
            if listed != len(names):
                failures.append(f"cache panel listed {listed} files, want {len(names)}")

            d.get(url(port, "/models/mlc/", cache=0, backend="cpu"))
            check("cpu, HTTP ranges", *outcome(d, a.timeout)[:3])

            served = f"http://127.0.0.1:{port}/models/mlc/"
            absent = f"http://127.0.0.1:{port}/webllm-only/mlc/"
            filled = d.js_async(FILL_WEBLLM, served, absent, names)
            d.get(url(port, absent, cache=0))
            check(f"webgpu from WebLLM's Cache API ({filled})", *outcome(d, a.timeout)[:3])

        with Driver(WEBGPU_FLAGS) as d:
            d.get(url(port, "/models/mlc/", auto=0, cache=1))
            d.wait_state(["idle"], 60)
            d.js(MOCK_QUOTA)
            state, status, _, _ = outcome(d, a.timeout)
            need = os.path.getsize(os.path.join(mlc, "mlc-chat-config.json"))
            print(f"quota exceeded: state {state}: {status}")
            if state != "error" or "not enough browser storage" not in status \
                    or f"needs {need} bytes" not in status:
                failures.append(f"quota: state {state}, status {status!r}")
    report(failures, "browser MLC + cache e2e")


if __name__ == "__main__":
    main()
