"""An HTTP proxy in front of a real `mlflow server` that answers every Nth request with a 500.

The failing request never reaches the server (a 500 of a server that did nothing);
every other one is forwarded as it came and its answer passed back. The counts go to
``--stats`` (JSON: requests, failed, failed_at: their times) on every request, so a test can read how hard
the supervisor tried.

Usage: python flaky_proxy.py --target 127.0.0.1:5000 --port 5001 --fail-every 3 [--stats FILE] [--down-while FILE]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fail-every", type=int, default=3)
    ap.add_argument("--stats", default="")
    ap.add_argument("--down-while", default="", help="every request fails while this file exists (an outage)")
    a = ap.parse_args()
    host, port = a.target.rsplit(":", 1)
    lock = threading.Lock()
    counts: dict = {"requests": 0, "failed": 0, "failed_at": []}  # failed_at: when each failed request came (first 500)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                counts["requests"] += 1
                fail = counts["requests"] % a.fail_every == 0 or bool(a.down_while and os.path.exists(a.down_while))
                counts["failed"] += fail
                if fail and len(counts["failed_at"]) < 500:
                    counts["failed_at"].append(time.time())
                if a.stats:
                    with open(a.stats, "w") as fh:
                        json.dump(counts, fh)
            if fail:
                payload = b'{"error_code": "INTERNAL_ERROR", "message": "injected failure"}'
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            conn.close()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
