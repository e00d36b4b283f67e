"""The client over https, against a real fenced serve with TLS on (its
certificate signed by a CA the test makes with the openssl command)."""

from __future__ import annotations

import os
import ssl
import subprocess
import tempfile
import time
import unittest
from unittest import mock

import fenced
from daemon import Daemon, unique


def make_certs(d: str) -> tuple[str, str, str]:
    """A CA and a server certificate it signed for 127.0.0.1 (not localhost),
    valid for two days, in d: (ca.pem, server.pem, server.key)."""
    ca, ca_key = os.path.join(d, "ca.pem"), os.path.join(d, "ca.key")
    cert, key, csr = os.path.join(d, "server.pem"), os.path.join(d, "server.key"), os.path.join(d, "server.csr")
    ext = os.path.join(d, "server.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for cmd in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=fenced test CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"],
        ["req", "-new", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
         "-days", "2", "-extfile", ext],
    ):
        subprocess.run(["openssl", *cmd], check=True, capture_output=True)
    return ca, cert, key


class TLSTest(unittest.TestCase):
    """fenced serve --tls-cert (leases and tokens in an embedded etcd)."""

    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.ca, cert, key = make_certs(cls.tmp.name)
        cls.daemon = Daemon("serve", "--lease-store", "etcd", "--etcd-data-dir", os.path.join(cls.tmp.name, "etcd"),
                            "--etcd-unsafe-no-fsync", "--tls-cert", cert, "--tls-key", key)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()
        cls.tmp.cleanup()

    def test_serves_https(self) -> None:
        self.assertTrue(self.daemon.url.startswith("https://127.0.0.1:"), self.daemon.url)

    def test_trusted_ca(self) -> None:
        # The README's way to trust a private CA: an ssl_context.
        c = fenced.Client(self.daemon.url, ssl_context=ssl.create_default_context(cafile=self.ca))
        self.addCleanup(c.close)
        name = unique()
        lease = c.acquire(name, ttl_ms=3000, wait_ms=1000)
        self.assertTrue(c.inspect(name).held)
        token = lease.token
        lease.refresh(3000)
        self.assertEqual(lease.token, token)
        lease.release()
        self.assertFalse(c.inspect(name).held)
        # The keep-alive, in its own thread (its own connection): refreshes
        # until the lease outlives two TTLs.
        with c.lock(name, ttl_ms=300) as lease:
            self.assertGreater(lease.token, token)
            end = time.monotonic() + 0.9
            while time.monotonic() < end:
                lease.check()
                time.sleep(0.05)  # not a synchronisation: the time the lease is held for
            self.assertGreaterEqual(lease._refreshes, 2)
            lease.check()
        self.assertFalse(c.inspect(name).held)

    def test_untrusted_ca_fails_at_once_and_says_why(self) -> None:
        # A certificate the client does not trust is no transient failure:
        # a waiting acquire rode it out as one, a new handshake every 100
        # ms to 1 s, until its wait was over, then raised a TransportError
        # (retryable) with OpenSSL's words alone.
        c = fenced.Client(self.daemon.url)
        self.addCleanup(c.close)
        handshakes = []
        connect = fenced._HTTPSConnection.connect

        def counted(conn: fenced._HTTPSConnection) -> None:
            handshakes.append(conn)
            connect(conn)

        began = time.monotonic()
        with mock.patch.object(fenced._HTTPSConnection, "connect", counted):
            with self.assertRaises(fenced.CertificateError) as cm:
                c.acquire(unique(), wait_ms=20_000)
        took = time.monotonic() - began
        e = cm.exception
        self.assertFalse(e.retryable)
        self.assertNotIsInstance(e, fenced.TransportError)
        self.assertEqual(len(handshakes), 1, "a certificate not trusted was tried again")
        self.assertLess(took, 10, "the wait rode out a certificate not trusted")
        msg = str(e)
        self.assertIn("not trusted", msg)
        self.assertIn("ssl_context", msg)  # what to do
        self.assertIn(self.daemon.url, msg)
        self.assertIsInstance(e.__cause__, ssl.SSLCertVerificationError)
        # The other calls alike: one attempt, a refresh and a release by id.
        for call in (lambda: c.try_acquire(unique()), lambda: c.refresh_id(unique(), "0" * 32),
                     lambda: c.release_id(unique(), "0" * 32), lambda: c.inspect(unique())):
            handshakes.clear()
            with mock.patch.object(fenced._HTTPSConnection, "connect", counted):
                with self.assertRaises(fenced.CertificateError):
                    call()
            self.assertEqual(len(handshakes), 1, "a certificate not trusted was tried again")

    def test_name_not_in_the_certificate(self) -> None:
        # Trusted CA, but a name the certificate does not hold: the same error.
        url = self.daemon.url.replace("127.0.0.1", "localhost")
        c = fenced.Client(url, ssl_context=ssl.create_default_context(cafile=self.ca))
        self.addCleanup(c.close)
        with self.assertRaises(fenced.CertificateError) as cm:
            c.inspect(unique())
        self.assertIn("not trusted", str(cm.exception))
        self.assertIn("localhost", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
