"""Codecs through Python: create_table's value_codec and state_codec reach the checkpoint files, a
restore gives lossless rows back bit for bit and int8 rows within half a step of each row's
range, a follower reads values-only deltas in the table's serving_codec, and codecs that are
unknown, or int8 for the optimizer state, raise."""

import shutil
import tempfile
import unittest

import numpy as np

import embstore
import embstore.ckpt


class CodecsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="embstore-py-codec-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def _train(self, store, codec):
        t = store.create_table("emb", 16, seed=9, init="normal", init_a=0, init_b=0.1,
                               value_codec=codec, state_codec="lossless")
        rng = np.random.default_rng(3)
        keys = np.arange(300, dtype=np.int64)
        for step in range(1, 4):
            t.lookup(keys, insert=True)
            t.apply_gradients(keys, rng.standard_normal((300, 16)).astype(np.float32))
            store.step(step)
        return keys, t.lookup(keys)

    def test_restore_is_exact_for_lossless_and_within_the_bound_for_int8(self):
        for codec in ("lossless", "int8"):
            with self.subTest(codec=codec):
                out = f"{self.dir}/{codec}"
                with embstore.Store("host") as store:
                    keys, before = self._train(store, codec)
                    store.checkpoint(out, wait=True)
                with embstore.Store("host") as back:
                    back.restore(out)
                    after = back.table("emb").lookup(keys)
                if codec == "lossless":
                    np.testing.assert_array_equal(after, before)
                    continue
                lo, hi = before.min(axis=1), before.max(axis=1)
                bound = (hi - lo) / 510 + 2.0**-22 * (np.abs(lo) + np.abs(hi)) + 2.0**-149
                err = np.abs(after.astype(np.float64) - before).max(axis=1)
                self.assertTrue((err <= bound).all(), f"int8 error {err.max()} over its bound")
                self.assertGreater(err.max(), 0)  # int8 is lossy: the rows did go through it

    def test_followers_read_values_only_deltas_in_the_serving_codec(self):
        out = f"{self.dir}/serving"
        with embstore.Store("host") as store:
            t = store.create_table("emb", 16, seed=9, serving_codec="bf16")
            store.set_policy(serving_deltas=True)
            keys = np.arange(300, dtype=np.int64)
            t.lookup(keys, insert=True)
            store.step(1)
            store.checkpoint(out, "full", wait=True)
            with embstore.Follower(out, lease_seconds=0) as follower:
                t.apply_gradients(keys, np.full((300, 16), 0.5, dtype=np.float32))
                store.step(2)
                store.checkpoint(out, "incremental", wait=True)
                self.assertEqual(follower.poll(), 2)
                stats = follower.stats()
                self.assertEqual(stats.serving_files_read, 1)
                self.assertEqual(stats.serving_fallbacks, 0)
                self.assertGreater(stats.delta_bytes_read, 0)
                want = t.lookup(keys)
                got = follower.lookup("emb", keys)
                # bf16: each value within a relative 2^-8 of training's, and rounded.
                np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=0)
                self.assertFalse(np.array_equal(got, want))
        with self.assertRaises(embstore.InvalidArgumentError):
            with embstore.Store("host") as store:
                store.create_table("a", 8, serving_codec="zip")

    def test_a_serving_dir_gets_each_checkpoint_values_only(self):
        out, serving = f"{self.dir}/ckpt", f"{self.dir}/serving-only"
        with embstore.Store("host") as store:
            t = store.create_table("emb", 16, seed=9, optimizer="adagrad")
            store.set_policy(out, serving_dir=serving)
            keys = np.arange(300, dtype=np.int64)
            t.lookup(keys, insert=True)
            store.step(1)
            store.checkpoint(out, "full", wait=True)
            with embstore.Follower(serving, lease_seconds=0) as follower:
                t.apply_gradients(keys, np.full((300, 16), 0.5, dtype=np.float32))
                store.step(2)
                store.checkpoint(out, "incremental", wait=True)
                self.assertEqual(follower.poll(), 2)
                np.testing.assert_array_equal(follower.lookup("emb", keys), t.lookup(keys))
            stats = store.checkpoint_stats()
            self.assertEqual(stats.serving_published, 2)
            self.assertEqual(stats.serving_skipped, 0)
        with embstore.Store("host") as back:
            with self.assertRaises(embstore.InvalidArgumentError):
                back.restore(serving)
        # verify answers for restore, unless asked for what a follower reads.
        self.assertTrue(embstore.ckpt.verify(out))
        self.assertFalse(embstore.ckpt.verify(serving))
        self.assertTrue(embstore.ckpt.verify(serving, serving=True))

    def test_bad_codecs_raise(self):
        with embstore.Store("host") as store:
            with self.assertRaises(embstore.InvalidArgumentError):
                store.create_table("a", 8, value_codec="zip")
            with self.assertRaisesRegex(embstore.InvalidArgumentError, "state_codec INT8"):
                store.create_table("b", 8, state_codec="int8")


if __name__ == "__main__":
    unittest.main()
