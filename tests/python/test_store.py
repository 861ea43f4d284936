"""Store and Table: the data path through numpy and torch, the optimizers' arithmetic, stats."""

import ctypes
import unittest

import numpy as np

import embstore
from embstore import _lib


class LayoutTest(unittest.TestCase):
    def test_config_structs_match_the_library(self):
        _lib._check_layouts()  # what import ran

        # A struct that drifted from the header (one field short) is caught.
        class Short(ctypes.Structure):
            _fields_ = _lib.StoreConfig._fields_[:-1]
        with self.assertRaises(ImportError):
            _lib._check_layouts(((Short, _lib.store_config_init),))

    def test_version(self):
        self.assertRegex(embstore.__version__, r"^\d+\.\d+\.\d+$")
        self.assertEqual(embstore.status_name(7), "EMBSTORE_CORRUPT")
        self.assertEqual(embstore.status_name(999), "EMBSTORE_UNKNOWN_STATUS")
        try:
            from importlib.metadata import PackageNotFoundError, version
            installed = version("embstore")
        except PackageNotFoundError:  # run from the source tree
            return
        self.assertEqual(installed, embstore.__version__)  # the package's and the library's


class DataPathTest(unittest.TestCase):
    def setUp(self):
        self.store = embstore.Store("host", host_threads=2)
        self.addCleanup(self.store.close)

    def test_lookup_inserts_only_in_training(self):
        t = self.store.create_table("t", 8, init="constant", init_a=0.25)
        keys = np.array([3, 1, 3, -7], dtype=np.int64)
        zeros = t.lookup(keys)
        self.assertEqual(zeros.shape, (4, 8))
        self.assertEqual(zeros.dtype, np.float32)
        self.assertTrue((zeros == 0).all())
        self.assertEqual(len(t), 0)
        rows = t.lookup(keys, insert=True)
        self.assertTrue((rows == 0.25).all())
        self.assertEqual(len(t), 3)  # duplicate keys get one row

    def test_output_keeps_the_keys_shape_and_fills_out_in_place(self):
        t = self.store.create_table("t", 4, init="normal", init_a=0, init_b=1, seed=5)
        keys = np.arange(6, dtype=np.int64).reshape(2, 3)
        rows = t.lookup(keys, insert=True)
        self.assertEqual(rows.shape, (2, 3, 4))
        out = np.empty((2, 3, 4), dtype=np.float32)
        self.assertIs(t.lookup(keys, out=out), out)
        np.testing.assert_array_equal(out, rows)

    def test_keys_of_other_integer_types_and_lists(self):
        t = self.store.create_table("t", 2, init="uniform", seed=1)
        a = t.lookup(np.array([1, 2], dtype=np.int32), insert=True)
        np.testing.assert_array_equal(t.lookup([1, 2]), a)
        np.testing.assert_array_equal(t.lookup(np.array([1, 2], dtype=np.uint8)), a)

    def test_sgd_sums_duplicates_then_updates(self):
        t = self.store.create_table("t", 3, optimizer="sgd", learning_rate=0.5, init="zeros")
        keys = np.array([4, 9, 4])
        t.lookup(keys, insert=True)
        grads = np.array([[1, 2, 3], [10, 10, 10], [1, 0, -1]], dtype=np.float32)
        t.apply_gradients(keys, grads)
        np.testing.assert_array_equal(t.lookup([4, 9]),
                                      np.array([[-1, -1, -1], [-5, -5, -5]], np.float32))

    def test_adagrad_matches_its_formula(self):
        lr, eps = 0.1, 1e-8
        t = self.store.create_table("t", 4, optimizer="adagrad", learning_rate=lr, epsilon=eps,
                                    init="uniform", seed=3)
        keys = np.array([11])
        w = t.lookup(keys, insert=True).astype(np.float64)
        acc = np.zeros_like(w)
        rng = np.random.default_rng(0)
        for _ in range(5):
            g = rng.standard_normal((1, 4)).astype(np.float32)
            t.apply_gradients(keys, g)
            acc += g.astype(np.float64) ** 2
            w -= lr * g / (np.sqrt(acc) + eps)
        np.testing.assert_allclose(t.lookup(keys), w, rtol=1e-6, atol=1e-7)

    def test_gradients_of_keys_without_rows_are_skipped(self):
        t = self.store.create_table("t", 2, optimizer="sgd")
        t.apply_gradients([5], np.ones((1, 2)))
        self.assertEqual(t.stats().skipped_keys, 1)
        self.assertEqual(len(t), 0)

    def test_stats_and_table_lookup_by_name(self):
        t = self.store.create_table("emb.users-1", 16)
        t.lookup(np.arange(100), insert=True)
        s = self.store["emb.users-1"].stats()
        self.assertEqual((s.rows, s.inserted, s.dirty_rows), (100, 100, 100))
        self.assertIs(self.store.table("emb.users-1"), t)
        self.assertEqual(repr(t), "embstore.Table('emb.users-1', dim=16, backend='host')")

    def test_eviction_by_idle_steps(self):
        t = self.store.create_table("t", 2, evict_idle_steps=2)
        t.lookup([1, 2], insert=True)
        self.store.step(10)  # runs the idle rule: both rows are 10 steps old
        self.assertEqual(t.stats().evicted, 2)
        self.assertEqual(len(t), 0)
        self.assertEqual(t.evict(), 0)

    def test_empty_batches(self):
        t = self.store.create_table("t", 2)
        self.assertEqual(t.lookup(np.array([], dtype=np.int64), insert=True).shape, (0, 2))
        t.apply_gradients(np.array([], dtype=np.int64), np.zeros((0, 2), np.float32))

    def test_zero_dimensional_and_unaligned_keys(self):
        t = self.store.create_table("t", 4, init="constant", init_a=2.0)
        self.assertEqual(t.lookup(np.int64(5), insert=True).shape, (4,))
        raw = np.zeros(8 * 3 + 1, dtype=np.uint8)
        unaligned = raw[1:].view(np.int64)  # 3 keys (0) one byte off alignment
        self.assertFalse(unaligned.flags.aligned)
        np.testing.assert_array_equal(t.lookup(unaligned), np.full((3, 4), 0, np.float32))
        unaligned[:] = 5
        np.testing.assert_array_equal(t.lookup(unaligned), np.full((3, 4), 2, np.float32))

    def test_closing_waits_for_calls_on_other_threads(self):
        import threading
        store = embstore.Store("host")
        t = store.create_table("t", 64)
        keys = np.arange(1 << 20)
        outcomes = []
        started = threading.Event()

        def lookups():
            started.set()
            while True:
                try:
                    t.lookup(keys, insert=True)
                except embstore.InvalidArgumentError as e:
                    outcomes.append(e.message)
                    return

        worker = threading.Thread(target=lookups)
        worker.start()
        started.wait()
        store.close()  # while the worker's lookups run
        worker.join(60)
        self.assertFalse(worker.is_alive())
        self.assertEqual(outcomes, ["the store is closed"])

    def test_handles_cannot_be_copied(self):
        import copy
        with self.assertRaises(TypeError):
            copy.copy(self.store)
        with self.assertRaises(TypeError):
            copy.deepcopy(self.store)

    def test_shard_of(self):
        self.assertEqual(embstore.shard_of(5, 1), 0)
        owners = embstore.shard_of(np.arange(1000), 4)
        self.assertEqual(owners.dtype, np.uint32)
        self.assertEqual(set(owners.tolist()), {0, 1, 2, 3})
        self.assertEqual(int(owners[17]), embstore.shard_of(17, 4))


class TorchTensorTest(unittest.TestCase):
    def setUp(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        self.torch = torch
        self.store = embstore.Store("host")
        self.addCleanup(self.store.close)

    def test_cpu_tensors_in_and_out(self):
        torch = self.torch
        t = self.store.create_table("t", 4, optimizer="sgd", learning_rate=1.0, init="zeros")
        keys = torch.tensor([[1, 2], [3, 1]])
        rows = t.lookup(keys, insert=True)
        self.assertIsInstance(rows, torch.Tensor)
        self.assertEqual(tuple(rows.shape), (2, 2, 4))
        t.apply_gradients(keys, torch.ones(2, 2, 4))
        np.testing.assert_array_equal(t.lookup(np.array([1, 2, 3])),
                                      np.array([[-2] * 4, [-1] * 4, [-1] * 4], np.float32))
        out = torch.empty(3, 4)
        self.assertIs(t.lookup(torch.tensor([1, 2, 3]), out=out), out)
        self.assertEqual(out[0, 0].item(), -2.0)

    def test_cuda_tensors_on_a_host_store_are_refused(self):
        torch = self.torch
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device")
        t = self.store.create_table("t", 4)
        with self.assertRaises(embstore.InvalidArgumentError):
            t.lookup(torch.tensor([1], device="cuda"))


if __name__ == "__main__":
    unittest.main()
