"""Follower through Python: serves the newest version and moves to new ones by poll."""

import unittest

import numpy as np

import embstore
from support import TempDirTest


class FollowerTest(TempDirTest):
    def test_follows_deltas(self):
        keys = np.arange(100)
        with embstore.Store("host") as store:
            t = store.create_table("t", 4, optimizer="sgd", learning_rate=1.0)
            t.lookup(keys, insert=True)
            store.step(1)
            store.checkpoint(self.dir, wait=True)
            with embstore.Follower(self.dir, backend="host") as f:
                self.assertEqual(f.version, 1)
                self.assertEqual(f.table_dim("t"), 4)
                np.testing.assert_array_equal(f.lookup("t", keys), t.lookup(keys))
                t.apply_gradients(keys[:10], np.ones((10, 4)))
                store.step(2)
                store.checkpoint(self.dir, "incremental", wait=True)
                self.assertEqual(f.poll(), 2)
                np.testing.assert_array_equal(f.lookup("t", keys.reshape(10, 10)),
                                              t.lookup(keys).reshape(10, 10, 4))
                s = f.stats()
                self.assertEqual((s.version, s.versions_applied, s.full_loads), (2, 1, 1))
                self.assertEqual(s.last_poll_status, "EMBSTORE_OK")
                with self.assertRaises(embstore.NotFoundError):
                    f.lookup("other", keys)
                with self.assertRaises(TypeError):
                    f.lookup("t", np.array([0.5]))
            with self.assertRaises(embstore.InvalidArgumentError):
                f.poll()

    def test_close_cancels_a_paced_poll_on_another_thread(self):
        # A poll paced at 1 KB/s over a delta of about 400 KB would take minutes: close() from
        # another thread used to wait for all of it.
        import threading
        import time
        keys = np.arange(20000)
        with embstore.Store("host") as store:
            t = store.create_table("t", 4, optimizer="sgd", learning_rate=1.0)
            t.lookup(keys, insert=True)
            store.step(1)
            store.checkpoint(self.dir, wait=True)
            f = embstore.Follower(self.dir, backend="host", apply_bytes_per_second=1000)
            t.apply_gradients(keys, np.ones((len(keys), 4)))
            store.step(2)
            store.checkpoint(self.dir, "incremental", wait=True)
        outcome = []

        def poll():
            try:
                outcome.append(f.poll())
            except embstore.Error as e:
                outcome.append(e)
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.3)  # the poll is pacing its reads
        started = time.monotonic()
        f.close()
        closed_in = time.monotonic() - started
        poller.join(timeout=30)
        self.assertFalse(poller.is_alive())
        self.assertLess(closed_in, 10)
        self.assertEqual(len(outcome), 1)
        # Cancelled while it paced; had the thread not entered it yet, refused as closed.
        self.assertIsInstance(outcome[0], (embstore.BusyError, embstore.InvalidArgumentError))

    def test_missing_directory(self):
        with self.assertRaises(embstore.NotFoundError):
            embstore.Follower(self.path("none"), backend="host")
        with self.assertRaises(embstore.InvalidArgumentError):
            embstore.Follower(self.dir, tables="(", backend="host")

    def test_tables_regex(self):
        # RE2: linear in the name (std::regex took tens of seconds on these), at most 1024 bytes,
        # no backreferences.
        name = "a" * 30 + "b"
        with embstore.Store("host") as store:
            store.create_table(name, 4).lookup([1], insert=True)
            store.step(1)
            store.checkpoint(self.dir, wait=True)
        for regex in ["(a+)+$", "(a|a)*$", "(.*a){20}$", "((a*)*)*c"]:
            with self.assertRaises(embstore.NotFoundError):
                embstore.Follower(self.dir, tables=regex, backend="host", lease_seconds=0)
        for regex in [name + "|" + "x" * (1024 - len(name)), r"(a)\1*b"]:
            with self.assertRaises(embstore.InvalidArgumentError):
                embstore.Follower(self.dir, tables=regex, backend="host", lease_seconds=0)
        longest = name + "|" + "x" * (1023 - len(name))
        with embstore.Follower(self.dir, tables=longest, backend="host", lease_seconds=0) as f:
            self.assertEqual(f.table_dim(name), 4)


if __name__ == "__main__":
    unittest.main()
