"""A loopback-only HTTP key-value store for gloo's rendezvous (Paddle 2.6 GlooParallelContext).

Same protocol as paddle.distributed.fleet.utils.http_server.KVHandler (PUT/GET /scope/key), but
bound to 127.0.0.1 (paddle's KVServer binds '' = every interface) and without paddle imports.
Used as a thread of pd_launch.py, or standalone by rank 0 under `python -m
paddle.distributed.launch` (GlooParallelContext.init() holds the GIL while it waits for the store,
so the store must not be a thread of a worker):  python _gloo_kv.py PORT [MAX_SECONDS]
"""
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOOPBACK = "127.0.0.1"


class _KVHandler(BaseHTTPRequestHandler):
    """Gloo's HTTP rendezvous store (same protocol as paddle's fleet KVHandler: /scope/key)."""

    def _parts(self):
        parts = self.path.split("/")
        return parts[1:3] if len(parts) == 3 else (None, None)

    def _code(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        scope, key = self._parts()
        with self.server.lock:
            value = self.server.kv.get(scope, {}).get(key)
        if value is None:
            return self._code(404)
        self.send_response(200)
        self.send_header("Content-Length", str(len(value)))
        self.end_headers()
        self.wfile.write(value)

    def do_PUT(self):
        scope, key = self._parts()
        value = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.kv.setdefault(scope, {})[key] = value
        self._code(200)

    def do_DELETE(self):
        self._code(200)

    def log_message(self, *args):
        pass


class GlooRendezvous:
    """A loopback-only HTTP key-value store for gloo's rendezvous, served by a thread of the
    launcher (paddle's own KVServer binds every interface and, run inside a worker, deadlocks:
    GlooParallelContext.init() keeps the GIL while it waits for the store)."""

    def __init__(self, port=0):
        self.httpd = ThreadingHTTPServer((LOOPBACK, port), _KVHandler)
        self.httpd.kv, self.httpd.lock = {}, threading.Lock()
        self.endpoint = f"{LOOPBACK}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()



if __name__ == "__main__":
    store = GlooRendezvous(int(sys.argv[1]))
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 120.0)   # bounded lifetime
    store.close()
