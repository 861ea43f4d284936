"""Checkpoints through Python: full and incremental, info and stats, policy, attachments,
restore into a new store, warm start, and embstore-ckpt from the package."""

import os
import subprocess
import unittest

import numpy as np

import embstore
import embstore.ckpt
from support import TempDirTest


def train(store, table, steps, first_step, rng, wait_policy=False):
    for s in range(first_step, first_step + steps):
        keys = rng.integers(0, 500, 64)
        table.lookup(keys, insert=True)
        table.apply_gradients(keys, rng.standard_normal((64, table.dim)).astype(np.float32))
        store.step(s)
        if wait_policy:  # the policy took version s at this step: let it commit
            try:
                store.wait(s)
            except embstore.NotFoundError:
                pass


class CheckpointTest(TempDirTest):
    def test_full_then_deltas_restore_bit_identical(self):
        rng = np.random.default_rng(1)
        all_keys = np.arange(500)
        with embstore.Store("host") as store:
            t = store.create_table("t", 8, optimizer="adagrad", seed=9)
            train(store, t, 5, 1, rng)
            v_full = store.checkpoint(self.dir, "full", wait=True)
            train(store, t, 5, 6, rng)
            v_delta = store.checkpoint(self.dir, "incremental")
            store.wait(v_delta)
            info = store.checkpoint_info(v_delta)
            self.assertEqual((info.kind, info.parent, info.status), ("incremental", v_full,
                                                                     "EMBSTORE_OK"))
            self.assertFalse(info.in_flight)
            self.assertLess(info.rows_written, 500)
            stats = store.checkpoint_stats()
            self.assertEqual((stats.committed, stats.deltas_committed, stats.last_version),
                             (2, 1, v_delta))
            expected = t.lookup(all_keys)
            expected_state = t.stats().rows
            after = np.random.default_rng(5)
            train(store, t, 3, 11, after)
            trained = t.lookup(all_keys)
        with embstore.Store("host") as store:
            self.assertEqual(store.restore(self.dir), v_delta)
            t = store.table("t")
            np.testing.assert_array_equal(t.lookup(all_keys), expected)
            self.assertEqual(len(t), expected_state)
            # Training goes on identically: the Adagrad state was restored with the rows.
            train(store, t, 3, 11, np.random.default_rng(5))
            np.testing.assert_array_equal(t.lookup(all_keys), trained)
            self.assertEqual(store.restore(self.dir, v_full), v_full)
        self.assertTrue(embstore.ckpt.verify(self.dir))
        self.assertTrue(embstore.ckpt.verify(self.dir, v_full))

    def test_verify_answers_for_the_version_restore_loads(self):
        # An older version damaged, the newest whole: restore(dir) succeeds, so verify(dir) is
        # True (the tool without --version checks every version: it said False).
        with embstore.Store("host") as store:
            t = store.create_table("t", 4)
            versions = []
            for step in (1, 2):
                store.step(step)
                t.lookup(np.arange(100) + 100 * step, insert=True)
                versions.append(store.checkpoint(self.dir, "full", wait=True))
        older = [d for d in os.listdir(self.dir) if d.startswith("%020d" % versions[0])][0]
        rows = [os.path.join(root, f) for root, _, files in os.walk(os.path.join(self.dir, older))
                for f in files if f.endswith(".rows")]
        self.assertTrue(rows)
        with open(rows[0], "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x40]))
        with embstore.Store("host") as store:
            self.assertEqual(store.restore(self.dir), versions[1])
        self.assertTrue(embstore.ckpt.verify(self.dir))
        self.assertFalse(embstore.ckpt.verify(self.dir, versions[0]))

    def test_attachments_round_trip(self):
        payload = np.arange(1000, dtype=np.float64)
        with embstore.Store("host") as store:
            store.create_table("t", 2)
            store.attach("dense", payload)
            store.attach("meta", b"step=7")
            store.attach("empty", b"")
            store.step(7)
            store.checkpoint(self.dir, wait=True)
        with embstore.Store("host") as store:
            store.restore(self.dir)
            self.assertEqual(np.frombuffer(store.restore_attachment("dense")).tolist(),
                             payload.tolist())
            self.assertEqual(store.restore_attachment("meta"), b"step=7")
            self.assertEqual(store.restore_attachment("empty"), b"")

    def test_policy_checkpoints_and_retention(self):
        rng = np.random.default_rng(2)
        with embstore.Store("host") as store:
            t = store.create_table("t", 4)
            store.set_policy(self.dir, full_every_steps=4, incremental_every_steps=1,
                             keep_full=1)
            train(store, t, 14, 1, rng, wait_policy=True)
            expected = t.lookup(np.arange(500))
        # Closing waited for the last policy checkpoint.
        versions = sorted(os.listdir(self.dir))
        full = [d for d in versions if d.endswith(".full")]
        deltas = [d for d in versions if d.endswith(".delta")]
        # Steps 4, 8, 12 took full checkpoints, the others deltas; only 12's chain is kept.
        self.assertEqual(full, ["00000000000000000012.full"], versions)
        self.assertEqual(len(deltas), 2, versions)
        with embstore.Store("host") as store:
            newest = store.restore(self.dir)
            self.assertEqual(newest, max(int(d.split(".")[0]) for d in full + deltas))
            self.assertEqual(newest, 14)
            np.testing.assert_array_equal(store["t"].lookup(np.arange(500)), expected)

    def test_warm_start_values_only(self):
        src = self.path("src")
        with embstore.Store("host") as store:
            a = store.create_table("user.a", 4, seed=1)
            store.create_table("item", 4, seed=2).lookup([1], insert=True)
            a.lookup([1, 2, 3], insert=True)
            store.step(1)
            store.checkpoint(src, wait=True)
            expected = a.lookup([1, 2, 3])
        with embstore.Store("host") as store:
            store.create_table("user.a", 4, optimizer="sgd")
            store.warm_start([embstore.WarmStartSource(src, tables=r"user\..*",
                                                       values_only=True)])
            np.testing.assert_array_equal(store["user.a"].lookup([1, 2, 3]), expected)
            with self.assertRaises(embstore.NotFoundError):
                store.table("item")
            with self.assertRaises(embstore.NotFoundError):
                store.warm_start([embstore.WarmStartSource(src, tables="nothing")])
            with self.assertRaises(embstore.InvalidArgumentError):
                store.warm_start([embstore.WarmStartSource(src, tables="(")])

    def test_warm_start_regex(self):
        # RE2: linear in the name (std::regex took tens of seconds on these), at most 1024 bytes,
        # no backreferences.
        src = self.path("src")
        name = "a" * 30 + "b"
        with embstore.Store("host") as store:
            store.create_table(name, 4).lookup([1], insert=True)
            store.step(1)
            store.checkpoint(src, wait=True)
        with embstore.Store("host") as store:
            for regex in ["(a+)+$", "(a|a)*$", "(.*a){20}$", "((a*)*)*c"]:
                with self.assertRaises(embstore.NotFoundError):
                    store.warm_start([embstore.WarmStartSource(src, tables=regex)])
            for regex in [name + "|" + "x" * (1024 - len(name)), r"(a)\1*b"]:
                with self.assertRaises(embstore.InvalidArgumentError):
                    store.warm_start([embstore.WarmStartSource(src, tables=regex)])
            longest = name + "|" + "x" * (1023 - len(name))
            store.warm_start([embstore.WarmStartSource(src, tables=longest)])
            self.assertEqual(store[name].lookup([1]).shape, (1, 4))

    def test_ckpt_tool_is_shipped(self):
        with embstore.Store("host") as store:
            store.create_table("t", 2).lookup([1, 2], insert=True)
            store.step(3)
            store.checkpoint(self.dir, wait=True)
        out = embstore.ckpt.run(["ls", self.dir], capture_output=True, text=True, check=True)
        self.assertIn("full", out.stdout)
        self.assertTrue(os.access(embstore.ckpt.binary(), os.X_OK))
        with self.assertRaises(subprocess.CalledProcessError):
            embstore.ckpt.run(["verify", self.path("missing")], capture_output=True, check=True)


if __name__ == "__main__":
    unittest.main()
