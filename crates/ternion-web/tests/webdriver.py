"""A minimal W3C WebDriver client for chromedriver (no third-party packages): start a
headless Chromium session with given flags, navigate, run scripts, take screenshots."""
import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

# Flags every session gets: headless, no sandbox (root in CI), no background traffic
# (the CI network is closed), and a fresh profile.
BASE_FLAGS = [
    "--headless", "--no-sandbox", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic",
    "--no-first-run", "--window-size=1100,1000",
]
# WebGPU on SwiftShader (Chromium's software Vulkan) in headless mode.
WEBGPU_FLAGS = ["--enable-unsafe-webgpu", "--enable-features=Vulkan",
                "--use-angle=swiftshader", "--use-webgpu-adapter=swiftshader"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Driver:
    """chromedriver process plus one browser session."""

    def __init__(self, flags, chromedriver="chromedriver", chromium="/usr/bin/chromium"):
        self.port = free_port()
        # Chromium's own temporary files (its singleton socket, scoped folders) go under a
        # folder of ours, removed with the profile in close().
        self.tmp = tempfile.mkdtemp(prefix="ternion-chrome-tmp-")
        self.proc = subprocess.Popen([chromedriver, f"--port={self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**os.environ, "TMPDIR": self.tmp})
        self.profile = tempfile.mkdtemp(prefix="ternion-chrome-")
        for _ in range(100):
            try:
                self._call("GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium,
                                   "args": BASE_FLAGS + flags + [f"--user-data-dir={self.profile}"]},
        }}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"webdriver {method} {path}: {e.read().decode()[:2000]}") from None

    def cmd(self, method, path, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url):
        self.cmd("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def js_async(self, script, *args):
        """Runs `script` whose last argument is the callback that returns its value."""
        self.cmd("POST", "/timeouts", {"script": 600_000})
        return self.cmd("POST", "/execute/async", {"script": script, "args": list(args)})

    def wait_state(self, states, timeout):
        """Polls document.body.dataset.state until it is one of `states`."""
        end = time.time() + timeout
        while time.time() < end:
            s = self.js("return document.body && document.body.dataset.state || null")
            if s in states:
                return s
            time.sleep(0.25)
        raise TimeoutError(f"page state never reached {states} in {timeout} s")

    def wait_js(self, script, timeout):
        """Polls `script` until it returns something truthy."""
        end = time.time() + timeout
        while time.time() < end:
            if self.js(script):
                return
            time.sleep(0.25)
        raise TimeoutError(f"never true in {timeout} s: {script}")

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.cmd("GET", "/screenshot")))

    def close(self):
        try:
            self._call("DELETE", f"/session/{self.session}")
        finally:
            self.proc.terminate()
            self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
