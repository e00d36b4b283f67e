"""A real fenced daemon for the tests: built from this repository (or
$FENCED_BIN), started on a free port, stopped by its owner."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import tempfile
import time
import uuid

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
_built: str | None = None


def fenced_bin() -> str:
    """$FENCED_BIN, or fenced built once from this repository with go build."""
    global _built
    if os.environ.get("FENCED_BIN"):
        return os.environ["FENCED_BIN"]
    if _built is None:
        out = os.path.join(tempfile.mkdtemp(prefix="fenced-py-"), "fenced")
        subprocess.run(["go", "build", "-o", out, "./cmd/fenced"], cwd=REPO, check=True)
        _built = out
    return _built


def unique(prefix: str = "py") -> str:
    """A name unique to this run, valid as a lock name."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Daemon:
    """fenced ARGS --listen 127.0.0.1:0, with url set from its first line.
    stop() ends it (SIGTERM, then SIGKILL) and is safe to call twice."""

    def __init__(self, *args: str, timeout: float = 60.0):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FENCED_")}
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([fenced_bin(), *args, "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        try:
            line = self._first_line(timeout)
            prefix = "fenced listening on "
            if not line.startswith(prefix):
                raise RuntimeError(f"fenced {' '.join(args)}: first line {line!r}")
            self.url = line[len(prefix):].strip()
        except BaseException:
            self.stop()
            raise

    def _first_line(self, timeout: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        buf = b""
        deadline = time.monotonic() + timeout
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise RuntimeError(f"fenced printed no line in {timeout}s; stderr:\n{self.log()}")
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"fenced exited ({self.proc.wait()}); stderr:\n{self.log()}")
                buf += chunk
        finally:
            sel.close()
        return buf.split(b"\n", 1)[0].decode()

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): requests hang unanswered."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.stderr.close()
