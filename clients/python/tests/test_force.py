"""force_release against a real fenced dev: with a token it releases only
that grant and is safe to send again; without, a request that may have
been applied (a 503, a lost answer) is not sent again."""

from __future__ import annotations

import http.client
import http.server
import threading
import unittest
import urllib.parse
from typing import Callable, Optional

import fenced
from daemon import Daemon, unique


class _Served(http.server.ThreadingHTTPServer):
    """A test HTTP server on a free loopback port, served by a thread of
    its own from the start: url is its address, stop() ends it."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
        super().__init__(("127.0.0.1", 0), handler)
        self.daemon_threads = True
        self._t = threading.Thread(target=self.serve_forever, daemon=True)
        self._t.start()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._t.join()


class AppliedThenFails(_Served):
    """An HTTP/1.1 proxy in front of a fenced that forwards every request,
    but answers the first DELETE with a failure after the server applied
    it: it forwards the DELETE, calls applied() (the test waits there for
    the next holder), then answers 503 ("503"), a proxy's 502 page ("502":
    not fenced's decision, defect 119) or closes the connection without an
    answer ("drop"). deletes counts the DELETEs that reached
    the server. stop() ends it."""

    def __init__(self, target_url: str, fail: str, applied: Callable[[], None]):
        u = urllib.parse.urlsplit(target_url)
        target = (u.hostname, u.port)
        self.deletes = 0
        self.first_status: Optional[int] = None
        outer = self
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                up = http.client.HTTPConnection(*target, timeout=30)
                try:
                    hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    up.request(self.command, self.path, body=body, headers=hdrs)
                    r = up.getresponse()
                    data = r.read()
                finally:
                    up.close()
                first = False
                if self.command == "DELETE":
                    with lock:
                        outer.deletes += 1
                        first = outer.deletes == 1
                if first:
                    outer.first_status = r.status
                    applied()
                    if fail == "drop":
                        self.close_connection = True
                        return
                    if fail == "502":
                        page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
                        self.send_response(502)
                        self.send_header("Content-Type", "text/html")
                        self.send_header("Content-Length", str(len(page)))
                        self.end_headers()
                        self.wfile.write(page)
                        return
                    msg = b'{"error":{"code":"unavailable","message":"lease store: context deadline exceeded"}}'
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("connection", "content-length", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _any

        super().__init__(Handler)


class Redirector(_Served):
    """Answers every request with a redirect of status to the same path
    and query on target, as an ingress that sends http:// to https:// does,
    with body as its body (some send a JSON one). stop() ends it."""

    def __init__(self, target: str, status: int, body: bytes = b""):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                self.send_response(status)
                self.send_header("Location", target + self.path)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _any

        super().__init__(Handler)


class ForceReleaseTest(unittest.TestCase):
    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon("dev")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    def setUp(self) -> None:
        self.client = fenced.Client(self.daemon.url)
        self.addCleanup(self.client.close)

    def _held_with_a_waiter(self, name: str) -> tuple[fenced.Lease, threading.Event, list[fenced.Lease]]:
        """name held, and another client waiting for it in a thread: it
        sets the event once it holds the lock (its lease in the list)."""
        first = self.client.acquire(name, ttl_ms=30_000)
        waiter = fenced.Client(self.daemon.url)
        self.addCleanup(waiter.close)
        got: list[fenced.Lease] = []
        done = threading.Event()

        def wait() -> None:
            try:
                got.append(waiter.acquire(name, ttl_ms=30_000, wait_ms=20_000))
            finally:
                waiter.close()  # this thread's connection
                done.set()

        t = threading.Thread(target=wait)
        t.start()
        self.addCleanup(t.join)
        deadline = 200
        while self.client.inspect(name).waiters != 1:
            deadline -= 1
            self.assertGreater(deadline, 0, "the waiter never queued")
            done.wait(0.05)
        return first, done, got

    def _through(self, name: str, fail: str, done: threading.Event) -> tuple[fenced.Client, AppliedThenFails]:
        p = AppliedThenFails(self.daemon.url, fail, lambda: done.wait(20))
        self.addCleanup(p.stop)
        c = fenced.Client(p.url)
        self.addCleanup(c.close)
        c.inspect(name)  # a kept connection, as a client that was used before has
        return c, p

    def _next_still_holds(self, name: str, done: threading.Event, got: list[fenced.Lease], p: AppliedThenFails) -> fenced.Lease:
        self.assertTrue(done.wait(20), "the waiter never got the lock")
        self.assertEqual(p.first_status, 200, "the first DELETE did not release the lock")
        self.assertEqual(len(got), 1, "the waiter failed")
        nxt = got[0]
        self.addCleanup(nxt.release)
        st = self.client.inspect(name)
        self.assertTrue(st.held and st.token == nxt.token,
                        f"the next holder (token {nxt.token}) lost the lock: {st}; DELETEs that reached the server: {p.deletes}")
        return nxt

    def test_unconditional_is_not_sent_again(self) -> None:
        # The server applied the force-release and answered 503 (its
        # backend call timed out after it was done), or its answer was lost
        # on a kept connection (http.client's request on it was sent again
        # at once, as for a connection the server closed while idle). Sent
        # again, the DELETE released the waiter the first one woke.
        for fail, error in (("503", fenced.UnavailableError), ("drop", fenced.TransportError),
                            ("502", fenced.FencedError)):
            with self.subTest(fail=fail):
                name = unique()
                _, done, got = self._held_with_a_waiter(name)
                c, p = self._through(name, fail, done)
                with self.assertRaises(error) as cm:
                    c.force_release(name)
                self._next_still_holds(name, done, got, p)
                self.assertIn("may have reached the server and released the lock", cm.exception.message)
                # Its advice: a free lock has no token to force-release by.
                self.assertIn("inspect the lock to see whether it is held now", cm.exception.message)
                self.assertEqual(p.deletes, 1)

    def test_with_token_is_sent_again_and_spares_the_next_holder(self) -> None:
        for fail in ("503", "drop", "502"):
            with self.subTest(fail=fail):
                name = unique()
                first, done, got = self._held_with_a_waiter(name)
                c, p = self._through(name, fail, done)
                with self.assertRaises(fenced.HeldByOtherError) as cm:
                    c.force_release(name, token=first.token)
                nxt = self._next_still_holds(name, done, got, p)
                self.assertEqual(p.deletes, 2, "the conditional DELETE was not sent again")
                self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.token), (409, "held", nxt.token))
                self.assertIsInstance(cm.exception, fenced.HeldError)

    def test_with_token(self) -> None:
        name = unique()
        lease = self.client.acquire(name, ttl_ms=30_000, owner="py-stuck")
        with self.assertRaises(fenced.HeldByOtherError) as cm:
            self.client.force_release(name, token=lease.token + 1000)
        self.assertEqual(cm.exception.token, lease.token)
        self.assertIn("nothing was released", cm.exception.message)
        self.assertTrue(self.client.inspect(name).held)
        st = self.client.force_release(name, token=lease.token)
        self.assertEqual((st.held, st.token, st.owner), (True, lease.token, "py-stuck"))
        self.assertFalse(self.client.force_release(name, token=lease.token).held)
        for bad in (0, -1, True, "5", 1.0, fenced.MAX_TOKEN + 1):
            with self.assertRaises(fenced.InvalidArgumentError) as cm2:
                self.client.force_release(name, token=bad)  # type: ignore[arg-type]
            self.assertEqual((cm2.exception.field, cm2.exception.status), ("token", 0))

    def test_by_token_as_the_readme_shows(self) -> None:
        # The README's cheat sheet force-released by the token inspect
        # showed, right after a force-release that left the lock free:
        # inspect of a free lock shows token 0, which no grant has, and
        # the call raised InvalidArgumentError without sending. It now
        # looks at held first, as this does; the error that says a
        # force-release may have been applied says so too.
        name = unique()
        lease = self.client.acquire(name, ttl_ms=30_000)
        self.client.force_release(name)
        for want_held in (False, True):
            if want_held:
                lease = self.client.acquire(name, ttl_ms=30_000)
            st = self.client.inspect(name)
            self.assertEqual(st.held, want_held)
            if st.held:
                self.assertEqual(self.client.force_release(name, token=st.token).token, lease.token)
            self.assertFalse(self.client.inspect(name).held)
        with self.assertRaises(fenced.InvalidArgumentError):
            self.client.force_release(name, token=self.client.inspect(name).token)  # token 0: no grant

    def test_redirect_is_refused(self) -> None:
        # http.client follows no redirect, but the client took a 3xx as an
        # answer: its body, if a JSON object, as the lock's state (a
        # force-release "released" a lock still held), else an error that
        # said the lock may have been released. A redirect is never
        # fenced's answer: nothing was applied (the Go client's package
        # documentation, "Errors").
        name = unique()
        lease = self.client.acquire(name, ttl_ms=30_000)
        self.addCleanup(lease.release)
        for status in (301, 302, 303, 307, 308):
            for body in (b"", b"{}"):
                with self.subTest(status=status, body=body):
                    r = Redirector(self.daemon.url, status, body)
                    self.addCleanup(r.stop)
                    c = fenced.Client(r.url)
                    self.addCleanup(c.close)
                    for call in (lambda: c.force_release(name), lambda: c.force_release(name, token=lease.token),
                                 lambda: c.try_acquire(name, ttl_ms=30_000), lambda: c.inspect(name)):
                        with self.assertRaises(fenced.FencedError) as cm:
                            call()
                        e = cm.exception
                        self.assertEqual((e.status, e.code), (status, None), str(e))
                        self.assertIn("point the client at " + self.daemon.url + ";", e.message)
                        self.assertNotIn("may have", e.message)
                        self.assertIsInstance(e, fenced.RedirectError)
                        self.assertTrue(e.location.startswith(self.daemon.url + "/v1/locks/"), e.location)
                        self.assertFalse(e.retryable)
                    st = self.client.inspect(name)
                    self.assertTrue(st.held and st.token == lease.token,
                                    f"after calls through a {status} redirect: {st}")


if __name__ == "__main__":
    unittest.main()
