"""The package as a user installs it: pip install of clients/python into a
virtual environment of its own, with no index (the standard library is
all it needs), then imported from outside this directory and used against
a real fenced dev. A wrong pyproject.toml passes every other test, which
imports the fenced directory from the source tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from daemon import Daemon, unique

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

USE = """
import json, os, sys
import fenced
client = fenced.Client(sys.argv[1])
lease = client.acquire(sys.argv[2], ttl_ms=5000)
other = client.try_acquire(sys.argv[2], ttl_ms=5000)
lease.release()
pkg = os.path.dirname(fenced.__file__)
print(json.dumps({"file": fenced.__file__, "token": lease.token, "other": other is not None,
                  "typed": os.path.exists(os.path.join(pkg, "py.typed"))}))
"""


class TestInstalledPackage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("dev")
        cls.addClassCleanup(cls.daemon.stop)
        cls.dir = tempfile.mkdtemp(prefix="fenced-py-pkg-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        # A copy: pip builds in the tree it is given, and would leave
        # build/ and fenced.egg-info/ in the checkout.
        src = os.path.join(cls.dir, "src")
        shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("tests", "examples", "__pycache__", "build", "*.egg-info"))
        venv = os.path.join(cls.dir, "venv")
        # With the system's packages: pip has no index here, and building
        # the wheel takes setuptools and wheel (Debian's python3-setuptools
        # and python3-wheel).
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True, capture_output=True)
        cls.python = os.path.join(venv, "bin", "python")
        r = subprocess.run([cls.python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                            "--disable-pip-version-check", "--quiet", src], capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"pip install of {SOURCE} failed:\n{r.stdout}\n{r.stderr}")
        cls.venv = venv

    def test_imported_from_the_environment(self):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        r = subprocess.run([self.python, "-c", USE, self.daemon.url, unique("pkg")],
                           cwd=self.dir, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = json.loads(r.stdout)
        self.assertTrue(got["file"].startswith(self.venv + os.sep), f"fenced imported from {got['file']}, not the venv")
        self.assertIsInstance(got["token"], int)
        self.assertGreater(got["token"], 0)
        self.assertFalse(got["other"], "a second try_acquire took a held lock")
        self.assertTrue(got["typed"], "py.typed is not installed: type checkers would ignore the hints")

    def test_metadata(self):
        r = subprocess.run([self.python, "-c", "import importlib.metadata as m; d = m.metadata('fenced'); "
                            "print(d['Name'], d['Requires-Python'], m.requires('fenced'))"],
                           cwd=self.dir, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["fenced", ">=3.9", "None"])


if __name__ == "__main__":
    unittest.main()
