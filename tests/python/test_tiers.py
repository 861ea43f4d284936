"""Tiers through Python: a table with memory_rows over the store's tier_dir trains as an untiered
one, its stats count the tiers, prefetch brings rows up, and a bad directory raises."""

import os
import shutil
import tempfile
import unittest

import numpy as np

import embstore


def _disk_dir():
    """A fresh directory on a disk (the tier refuses tmpfs, which /tmp may be)."""
    for base in ("/var/tmp", "/tmp", os.getcwd()):
        try:
            d = tempfile.mkdtemp(prefix="embstore-py-tier-", dir=base)
        except OSError:
            continue
        st = os.statvfs(d)
        if st.f_bfree > 0:  # a file system with blocks; tmpfs is refused by the library anyway
            return d
    raise unittest.SkipTest("no writable directory for the tier")


class TiersTest(unittest.TestCase):
    def setUp(self):
        self.tier = _disk_dir()
        self.addCleanup(shutil.rmtree, self.tier, True)

    def test_a_tiered_table_trains_as_an_untiered_one(self):
        rng = np.random.default_rng(7)
        with embstore.Store("host") as plain, embstore.Store("host", tier_dir=self.tier) as tiered:
            a = plain.create_table("emb", 8, seed=3)
            try:
                b = tiered.create_table("emb", 8, seed=3, memory_rows=32)
            except embstore.InvalidArgumentError as e:  # the tier_dir is on tmpfs here
                self.skipTest(str(e))
            for step in range(1, 9):
                keys = rng.integers(0, 500, size=128)
                grads = rng.standard_normal((128, 8)).astype(np.float32)
                np.testing.assert_array_equal(a.lookup(keys, insert=True),
                                              b.lookup(keys, insert=True))
                a.apply_gradients(keys, grads)
                b.apply_gradients(keys, grads)
                plain.step(step)
                tiered.step(step)
            s = b.stats()
            self.assertEqual(s.rows, a.stats().rows)
            self.assertLessEqual(s.rows_in_memory, 32)
            self.assertEqual(s.rows_in_memory + s.rows_on_disk, s.rows)
            self.assertGreater(s.rows_moved_down, 0)
            self.assertGreater(s.tier_bytes_written, 0)
            self.assertEqual(a.stats().rows_on_disk, 0)
            # The prefetch's read runs in the background; the lookup takes its rows.
            cold = np.arange(0, 500)
            b.prefetch(cold)
            np.testing.assert_array_equal(a.lookup(cold), b.lookup(cold))
            after = b.stats()
            self.assertGreater(after.rows_moved_up, s.rows_moved_up)
            self.assertGreater(after.tier_bytes_read, s.tier_bytes_read)
            self.assertLessEqual(after.rows_in_memory, 32)

    def test_memory_rows_without_a_tier_dir_raises(self):
        with embstore.Store("host") as store:
            with self.assertRaisesRegex(embstore.InvalidArgumentError, "tier_dir"):
                store.create_table("emb", 8, memory_rows=10)
        with embstore.Store("host", tier_dir=os.path.join(self.tier, "missing")) as store:
            with self.assertRaisesRegex(embstore.InvalidArgumentError, "missing"):
                store.create_table("emb", 8, memory_rows=10)


if __name__ == "__main__":
    unittest.main()
