"""A protected HTTP resource in Python, by the contract of
docs/fencing-token-http.md: every write carries a Fencing-Token header, and
the resource admits it only if the token is at least the highest it has
admitted for that resource.

    PUT /items/{id}   body: the new value; header Fencing-Token: <token>
    GET /items/{id}   the value

Run it: python3 examples/http_resource.py [port]. It keeps everything in
memory, so it is for trying the contract; a real resource stores the highest
token beside its data, in the same transaction as the write.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HEADER = "Fencing-Token"
MAX_TOKEN = 2**63 - 1  # the largest token fenced issues (fenced.MAX_TOKEN)
_DIGITS = re.compile(r"[0-9]{1,20}")


class Store:
    """Values and, per resource, the highest token admitted. One lock makes
    the admit and the write one step: a request with a lower token cannot
    be admitted before a higher one and then write after it."""

    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.highest: dict[str, int] = {}
        self.values: dict[str, bytes] = {}


def parse_token(values: list[str] | None) -> int:
    """The token of the request's Fencing-Token headers; ValueError says why not."""
    if not values:
        raise ValueError(f"missing {HEADER} header; want one, a decimal number from 1 to {MAX_TOKEN}")
    if len(values) > 1:
        raise ValueError(f"{len(values)} {HEADER} headers; want exactly one")
    v = values[0]
    if not _DIGITS.fullmatch(v):
        raise ValueError(f"{HEADER} {v!r}: want 1 to 20 digits, a decimal number from 1 to {MAX_TOKEN}")
    t = int(v)
    # Above the largest token fenced issues: admitted, it would be the
    # highest for good, and every real token stale after it.
    if t == 0 or t > MAX_TOKEN:
        raise ValueError(f"{HEADER} {v!r}: want a decimal number from 1 to {MAX_TOKEN}")
    return t


def make_handler(store: Store):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _json(self, status: int, doc: dict) -> None:
            b = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

        def do_GET(self) -> None:
            key = self.path.removeprefix("/items/")
            with store.mu:
                value, highest = store.values.get(key), store.highest.get(key, 0)
            if value is None:
                self._json(404, {"error": {"code": "not_found", "message": f"no item {key!r}"}})
                return
            self._json(200, {"value": value.decode(), "highest": highest})

        def do_PUT(self) -> None:
            key = self.path.removeprefix("/items/")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                token = parse_token(self.headers.get_all(HEADER))
            except ValueError as e:
                self._json(400, {"error": {"code": "invalid_argument", "message": str(e)}})
                return
            with store.mu:
                highest = store.highest.get(key, 0)
                if token < highest:
                    msg = f'fence: stale token {token} for "{key}": highest admitted is {highest}'
                    self._json(409, {"error": {"code": "stale", "message": msg, "token": token, "highest": highest}})
                    return
                store.highest[key] = token  # admitted: remember it, then write
                store.values[key] = body
            self._json(200, {"value": body.decode(), "highest": token})

    return Handler


def serve(port: int = 0) -> ThreadingHTTPServer:
    """A server of a new Store on 127.0.0.1:port; run serve_forever yourself."""
    return ThreadingHTTPServer(("127.0.0.1", port), make_handler(Store()))


if __name__ == "__main__":
    srv = serve(int(sys.argv[1]) if len(sys.argv) > 1 else 8080)
    print(f"protected resource on http://127.0.0.1:{srv.server_address[1]}/items/ID", flush=True)
    srv.serve_forever()
