"""examples/pg_ledger.py against a real fenced dev and Postgres, with the
fence installed by fenced admin pg-sql piped to psql."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

from daemon import Daemon, fenced_bin, unique

HERE = os.path.dirname(os.path.abspath(__file__))
DATABASE_URL = os.environ.get("FENCED_TEST_POSTGRES") or os.environ.get("DATABASE_URL") or \
    "postgres://postgres@127.0.0.1:5432/test"


def psql(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", DATABASE_URL],
                          input=script, capture_output=True, text=True, check=True)


class ExampleTest(unittest.TestCase):
    def test_pg_ledger(self) -> None:
        daemon = Daemon("dev")
        self.addCleanup(daemon.stop)
        schema = unique("fenced_py").replace("-", "_")
        script = subprocess.run([fenced_bin(), "admin", "pg-sql", "--schema", schema],
                                capture_output=True, text=True, check=True).stdout
        psql(script)
        self.addCleanup(psql, f"DROP SCHEMA {schema} CASCADE;")

        # Debian's python3 has psycopg (python3-psycopg); the example needs it.
        out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "..", "examples", "pg_ledger.py"),
                              "--fenced-url", daemon.url, "--database-url", DATABASE_URL, "--schema", schema],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertRegex(out.stdout, r"writer A: REJECTED by Postgres, SQLSTATE SF001: fence: stale token \d+ for \"account-[0-9a-f]+\": highest admitted is \d+")
        self.assertIn("writer B: balance 100 -> 50, committed", out.stdout)
        self.assertIn("final balance 50", out.stdout)
        sys.stdout.write(out.stdout)


if __name__ == "__main__":
    unittest.main()
