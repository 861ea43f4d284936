"""Bad input raises an exception naming the status and the library's message, never a crash."""

import os
import unittest

import numpy as np

import embstore
import embstore.ckpt
from support import TempDirTest


class ErrorTest(TempDirTest):
    def setUp(self):
        super().setUp()
        self.store = embstore.Store("host")
        self.addCleanup(self.store.close)
        self.t = self.store.create_table("t", 4)

    def test_exceptions_carry_status_and_message(self):
        with self.assertRaises(embstore.AlreadyExistsError) as cm:
            self.store.create_table("t", 4)
        e = cm.exception
        self.assertIsInstance(e, embstore.Error)
        self.assertEqual((e.status, e.status_name), (3, "EMBSTORE_ALREADY_EXISTS"))
        self.assertIn("'t'", e.message)
        self.assertIn("EMBSTORE_ALREADY_EXISTS", str(e))
        self.assertEqual(embstore.last_error(), e.message)

    def test_bad_table_configs(self):
        for kwargs in ({"dim": 0}, {"dim": 5000}, {"dim": 4, "learning_rate": -1},
                       {"dim": 4, "init": "uniform", "init_a": 1, "init_b": 0},
                       {"dim": 4, "optimizer": "adam", "epsilon": 0}):
            with self.subTest(**kwargs), self.assertRaises(embstore.InvalidArgumentError) as cm:
                self.store.create_table("u", **kwargs)
            self.assertTrue(cm.exception.message)
        with self.assertRaises(embstore.InvalidArgumentError):
            self.store.create_table("bad/name", 4)
        with self.assertRaises(embstore.InvalidArgumentError):
            self.store.create_table("u", 4, optimizer="lamb")
        with self.assertRaises(embstore.InvalidArgumentError):
            self.store.create_table("u\0x", 4)
        with self.assertRaises(TypeError):
            self.store.create_table("u", 4.5)
        with self.assertRaises(embstore.InvalidArgumentError):
            self.store.create_table("u", -1)

    def test_bad_arrays(self):
        with self.assertRaises(TypeError):
            self.t.lookup(np.array([1.5]))
        with self.assertRaises(TypeError):
            self.t.lookup(np.array(["a"]))
        with self.assertRaises(embstore.InvalidArgumentError):
            self.t.apply_gradients([1, 2], np.ones((3, 4)))
        with self.assertRaises(embstore.InvalidArgumentError):
            self.t.apply_gradients([1, 2], np.ones((4, 2)))  # the size alone is right
        with self.assertRaises(ValueError):
            self.t.lookup([1, 2], out=np.empty((2, 3), np.float32))
        with self.assertRaises(ValueError):
            self.t.lookup([1, 2], out=np.empty((2, 4), np.float64))
        readonly = np.empty((2, 4), np.float32)
        readonly.flags.writeable = False
        with self.assertRaises(ValueError):
            self.t.lookup([1, 2], out=readonly)
        with self.assertRaises(ValueError):
            self.t.lookup([1, 2], out=np.empty((4, 2), np.float32).T)

    def test_keys_that_are_not_int64_values(self):
        # 2^64 - 1 used to be the key -1, and timedelta64 arrays were taken as keys.
        self.t.lookup([1, 2], insert=True)
        for keys in (np.array([2**64 - 1], np.uint64), np.array([1, 2**63], np.uint64),
                     [2**63], [2**64 - 1]):
            with self.subTest(keys=keys), self.assertRaises(ValueError) as caught:
                self.t.lookup(keys)
            self.assertIn("2^63", str(caught.exception))
        np.testing.assert_array_equal(self.t.lookup(np.array([1, 2], np.uint64)),
                                      self.t.lookup([1, 2]))  # below 2^63: the same keys
        for keys in (np.array([1, 2], "timedelta64[s]"), np.array([1], "datetime64[D]"),
                     np.array([True]), np.array([1 + 2j])):
            with self.subTest(dtype=keys.dtype), self.assertRaises(TypeError):
                self.t.lookup(keys)
        with self.assertRaises(TypeError):
            self.t.apply_gradients([1], np.array([[1, 2, 3, 4]], "timedelta64[s]"))
        try:
            import torch
        except ImportError:  # pragma: no cover - the CI venv has torch
            return
        if hasattr(torch, "uint64"):
            with self.assertRaises(ValueError):
                self.t.lookup(torch.tensor([1, 2**63], dtype=torch.uint64))
            np.testing.assert_array_equal(
                self.t.lookup(torch.tensor([1, 2], dtype=torch.uint64)).numpy(),
                self.t.lookup([1, 2]))

    def test_bad_store_configs(self):
        with self.assertRaises(embstore.InvalidArgumentError):
            embstore.Store("host", staging_bytes=1024)
        with self.assertRaises(embstore.InvalidArgumentError):
            embstore.Store("tpu")
        with self.assertRaises(embstore.InvalidArgumentError):
            embstore.Store("host", io_queue_depth=0)

    def test_closed_store(self):
        s = embstore.Store("host")
        t = s.create_table("t", 2)
        s.close()
        s.close()  # idempotent
        self.assertTrue(s.closed)
        with self.assertRaises(embstore.InvalidArgumentError):
            t.lookup([1])
        with self.assertRaises(embstore.InvalidArgumentError):
            s.step(1)

    def test_missing_things(self):
        with self.assertRaises(embstore.NotFoundError):
            self.store.table("nope")
        with self.assertRaises(embstore.NotFoundError):
            self.store.restore(self.path("none"))
        with self.assertRaises(embstore.NotFoundError):
            self.store.restore_attachment("x")
        with self.assertRaises(embstore.NotFoundError):
            self.store.wait(12345)
        with self.assertRaises(embstore.NotFoundError):
            self.store.checkpoint_info(12345)
        with self.assertRaises(embstore.InvalidArgumentError):
            self.store.checkpoint("")
        with self.assertRaises(embstore.InvalidArgumentError):
            self.store.checkpoint(self.dir, "partial")

    def test_corrupt_checkpoint_raises_and_leaves_the_store(self):
        self.t.lookup(np.arange(50), insert=True)
        before = self.t.lookup(np.arange(50))
        self.store.step(1)
        self.store.checkpoint(self.dir, wait=True)
        rows = [os.path.join(r, f) for r, _, fs in os.walk(self.dir) for f in fs
                if f.endswith(".rows")]
        self.assertEqual(len(rows), 1)
        with open(rows[0], "r+b") as f:
            f.seek(os.path.getsize(rows[0]) // 2)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x40]))
        self.t.apply_gradients(np.arange(50), np.ones((50, 4)))
        after = self.t.lookup(np.arange(50))
        with self.assertRaises(embstore.CorruptError) as cm:
            self.store.restore(self.dir)
        self.assertIn(".rows", cm.exception.message)
        np.testing.assert_array_equal(self.t.lookup(np.arange(50)), after)
        self.assertFalse((after == before).all())
        self.assertFalse(embstore.ckpt.verify(self.dir))

    def test_second_writer_is_busy(self):
        self.store.step(1)
        self.store.checkpoint(self.dir, wait=True)
        with embstore.Store("host") as other:
            with self.assertRaises(embstore.BusyError) as cm:
                other.checkpoint(self.dir)
            self.assertIn("pid", cm.exception.message)

    def test_restore_mismatched_dim(self):
        self.store.step(1)
        self.store.checkpoint(self.dir, wait=True)
        with embstore.Store("host") as other:
            other.create_table("t", 8)
            with self.assertRaises(embstore.InvalidArgumentError):
                other.restore(self.dir)

if __name__ == "__main__":
    unittest.main()
