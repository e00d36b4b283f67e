"""Defect 169, against a real fenced (fenced dev): a lease whose deadline
has passed says lost when asked, though the keep-alive's thread has not
run since (a process paused past its deadline; here the keep-alive is
stalled or off): lost.is_set(), lost.wait(), check() and valid_for() read
the clock, and the first read past the deadline loses the lease (lost set,
on_lost called, once), as the Go client's Lease.Err does."""

from __future__ import annotations

import threading
import time
import unittest

import fenced
from daemon import Daemon, unique


class DeadlineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("dev")
        cls.client = fenced.Client(cls.daemon.url)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.stop()

    def sleep_past(self, lease: fenced.Lease) -> None:
        time.sleep(max(0.0, lease.deadline - time.monotonic()) + 0.02)

    def test_stalled_keep_alive_lost_is_set_at_the_deadline(self):
        """The keep-alive's thread cannot run (it waits for the lease's
        refresh lock, which this thread holds, as a paused process's would
        not run): the first lost.is_set() past the deadline says lost, and
        calls on_lost once, in this thread."""
        lease = self.client.acquire(unique(), ttl_ms=1000)
        calls: list[tuple[str, fenced.FencedError]] = []
        lease._refreshing.acquire()  # the keep-alive's refresh, at ttl/3, waits for it
        try:
            lease.keep_alive(on_lost=lambda l, err: calls.append((threading.current_thread().name, err)))
            self.sleep_past(lease)
            self.assertFalse(threading.Event.is_set(lease.lost), "the stalled keep-alive set lost")
            past = time.monotonic() - lease.deadline
            self.assertTrue(lease.lost.is_set(), f"lost.is_set() {past:.3f} s past the deadline: False")
            self.assertIsInstance(lease.lost_reason, fenced.LostError)
            self.assertIn("no successful refresh before its validity ran out", str(lease.lost_reason))
            self.assertEqual([(threading.current_thread().name, lease.lost_reason)], calls)
            self.assertTrue(lease.lost.is_set())
            self.assertEqual(1, len(calls), "on_lost called more than once")
        finally:
            lease._refreshing.release()
        lease.stop_keep_alive()
        self.assertEqual(1, len(calls), "on_lost called again by the keep-alive")
        with self.assertRaises(fenced.LostError):
            lease.check()
        self.assertEqual(0.0, lease.valid_for())
        with self.assertRaises(fenced.LostError):  # lost before: writes under it may have overlapped
            lease.release()

    def test_check_loses_the_lease(self):
        """check() past the deadline, keep-alive off: LostError, and the
        lease is lost (lost set, lost_reason the error raised)."""
        lease = self.client.acquire(unique(), ttl_ms=300)
        self.sleep_past(lease)
        with self.assertRaises(fenced.LostError) as cm:
            lease.check()
        self.assertTrue(threading.Event.is_set(lease.lost), "check() raised, lost not set")
        self.assertIs(cm.exception, lease.lost_reason)
        with self.assertRaises(fenced.LostError):
            lease.release()

    def test_valid_for_loses_the_lease(self):
        lease = self.client.acquire(unique(), ttl_ms=300)
        self.sleep_past(lease)
        self.assertEqual(0.0, lease.valid_for())
        self.assertTrue(threading.Event.is_set(lease.lost))
        with self.assertRaises(fenced.LostError):
            lease.release()

    def test_lost_wait_ends_at_the_deadline(self):
        """lost.wait(timeout) with no thread to set lost (keep-alive off)
        returns True at the deadline, not False at the timeout."""
        lease = self.client.acquire(unique(), ttl_ms=300)
        t0 = time.monotonic()
        self.assertTrue(lease.lost.wait(3.0), "lost.wait(3) past the deadline: False")
        self.assertLess(time.monotonic() - t0, 1.5)
        self.assertGreaterEqual(time.monotonic(), lease.deadline)
        self.assertTrue(lease.lost.wait(0.01))
        with self.assertRaises(fenced.LostError):
            lease.release()

    def test_held_until_the_deadline(self):
        """Before its deadline a lease is held, and lost.wait(timeout)
        times out."""
        lease = self.client.acquire(unique(), ttl_ms=5000)
        self.assertFalse(lease.lost.is_set())
        self.assertFalse(lease.lost.wait(0.05))
        lease.check()
        self.assertGreater(lease.valid_for(), 0)
        lease.release()

    def test_released_lease_stays_unlost(self):
        """A released lease is not the caller's: past its deadline, lost
        stays unset (README), and check() says released."""
        lease = self.client.acquire(unique(), ttl_ms=300)
        lease.release()
        self.sleep_past(lease)
        self.assertFalse(lease.lost.is_set())
        self.assertFalse(lease.lost.wait(0.05))
        with self.assertRaises(fenced.LostError) as cm:
            lease.check()
        self.assertIn("released", str(cm.exception))
        self.assertFalse(lease.lost.is_set())


if __name__ == "__main__":
    unittest.main()
