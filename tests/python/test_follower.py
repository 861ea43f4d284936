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

    def test_missing_directory(self):
        with self.assertRaises(embstore.NotFoundError):
            embstore.Follower(self.path("none"), backend="host")
        with self.assertRaises(embstore.InvalidArgumentError):
            embstore.Follower(self.dir, tables="(", backend="host")


if __name__ == "__main__":
    unittest.main()
