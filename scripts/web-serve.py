#!/usr/bin/env python3
"""Static file server for the browser page, with HTTP range requests (the page loads
models by ranges). Serves crates/ternion-web (the page under /www/, the wasm package under
/pkg/) and, with --models DIR, the files of DIR under /models/ (subfolders too: an MLC
directory under /models/<name>/).

    python3 scripts/web-serve.py [--port 8080] [--models DIR]
    # then open http://127.0.0.1:8080/www/
"""
import argparse
import functools
import http.server
import os
import re
import urllib.parse

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "ternion-web")


class Handler(http.server.SimpleHTTPRequestHandler):
    models = None
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".js": "text/javascript"}

    def translate_path(self, path):
        if self.models and path.startswith("/models/"):
            rel = urllib.parse.unquote(path.split("?", 1)[0][len("/models/"):])
            parts = [p for p in rel.split("/") if p]
            if any(p in (".", "..") or os.sep in p for p in parts):
                return os.path.join(self.models, "\0")  # no such file: 404
            return os.path.join(self.models, *parts)
        return super().translate_path(path)

    def end_headers(self):
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def send_head(self):
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if not m or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        if start > end:
            self.send_error(416, "range not satisfiable")
            return None
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self.range_left = end - start + 1
        return f

    def copyfile(self, source, outputfile):
        left = getattr(self, "range_left", None)
        if left is None:
            return super().copyfile(source, outputfile)
        while left > 0:
            chunk = source.read(min(left, 1 << 20))
            if not chunk:
                break
            outputfile.write(chunk)
            left -= len(chunk)

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--models", help="directory served under /models/")
    a = ap.parse_args()
    Handler.models = os.path.abspath(a.models) if a.models else None
    handler = functools.partial(Handler, directory=os.path.abspath(ROOT))
    http.server.ThreadingHTTPServer(("127.0.0.1", a.port), handler).serve_forever()


if __name__ == "__main__":
    main()
