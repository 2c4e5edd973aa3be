#!/usr/bin/env python3
"""End-to-end browser test of the chat page (run by scripts/web-test.sh).

1. Writes a micro synthetic BitNet model (~0.3 M parameters) with the native CLI and
   records the native CPU backend's greedy token ids (`ternion run --json`).
2. Serves the page and the model from 127.0.0.1 (scripts/web-serve.py, range requests).
3. Headless Chromium with WebGPU on SwiftShader loads the model through the page (OPFS
   cache, then File slices into GPU buffers) and generates: the token ids must equal the
   native ones. The CPU backend in the browser must match too.
4. Negative control: Chromium without the WebGPU flag; the page must say "no WebGPU".
5. With --screenshot PATH, saves the page after the WebGPU generation.
"""
import argparse
import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from webdriver import WEBGPU_FLAGS, Driver, free_port  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
PROMPT = "Ternary weights on the web"
N = 16


def native_ids(ternion, model):
    """The native CPU backend's greedy (prompt ids, generated ids) for `model` (a GGUF
    file or an MLC directory)."""
    out = subprocess.run([ternion, "run", "--model", model, "--backend", "cpu", "--prompt", PROMPT,
                          "-n", str(N), "--temperature", "0", "--ignore-eos", "--json"],
                         check=True, capture_output=True, text=True).stdout
    v = json.loads(out.strip().splitlines()[-1])
    return v["prompt_tokens"], v["tokens"]


@contextlib.contextmanager
def serving(models):
    """scripts/web-serve.py on a free port with `models` under /models/, for the `with`
    block; yields the port once it answers."""
    port = free_port()
    server = subprocess.Popen([sys.executable, os.path.join(REPO, "scripts", "web-serve.py"),
                               "--port", str(port), "--models", models])
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/www/index.html", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield port
    finally:
        server.terminate()
        server.wait()


def report(failures, what):
    """Prints the failures and exits 1, or prints that `what` passed."""
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"{what}: ok")


def page_url(port, **extra):
    q = {"model": "/models/micro.gguf", "prompt": PROMPT, "n": N, "temperature": 0, "chat": 0,
         "ignore_eos": 1, "auto": 1, **extra}
    return f"http://127.0.0.1:{port}/www/index.html?" + urllib.parse.urlencode(q)


def run_page(flags, url, timeout, screenshot=None):
    with Driver(flags) as d:
        t0 = time.time()
        d.get(url)
        state = d.wait_state(["done", "error", "nowebgpu"], timeout)
        status = d.js("return document.getElementById('status').textContent")
        result = d.js("return window.ternionResult || null")
        if screenshot and state == "done":
            d.screenshot(screenshot)
        return state, status, result, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ternion", required=True, help="native ternion binary")
    ap.add_argument("--screenshot", help="save the page after generation here")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ternion-web-e2e-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    model = os.path.join(work, "micro.gguf")
    subprocess.run([a.ternion, "synth", "--shape", "micro", "--seed", "7", "--out", model],
                   check=True, capture_output=True)
    prompt_ids, want = native_ids(a.ternion, model)
    print(f"native CPU: prompt {prompt_ids} -> {want}")

    failures = []
    with serving(work) as port:
        for backend, shot in (("webgpu", a.screenshot), ("cpu", None)):
            state, status, r, secs = run_page(WEBGPU_FLAGS, page_url(port, backend=backend),
                                              a.timeout, shot)
            got = r and r["tokens"]
            print(f"browser {backend}: state {state} in {secs:.1f} s: {status}")
            if r:
                print(f"  prompt {r['promptTokens']} -> {got}; "
                      f"prompt {r['promptTokS']:.1f} tok/s, decode {r['decodeTokS']:.1f} tok/s")
            if state != "done" or r["promptTokens"] != prompt_ids or got != want:
                failures.append(f"{backend}: state {state}, ids {got} != native {want}")

        state, status, _, _ = run_page([], page_url(port, backend="webgpu"), 60)
        print(f"without the WebGPU flag: state {state}: {status}")
        if state != "nowebgpu" or "no WebGPU" not in status:
            failures.append(f"negative control: state {state}, status {status!r}")
    report(failures, "browser e2e")


if __name__ == "__main__":
    main()
