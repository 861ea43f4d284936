"""Sharded stores from Python: a communicator's callbacks (embstore.Communicator), the collective
lookups and updates against one process, checkpoints across world sizes, a failing communicator,
and embstore.torch.ProcessGroup over gloo in separate processes."""

import gc
import os
import subprocess
import sys
import threading
import traceback
import unittest
import warnings

import numpy as np

import embstore
from support import TempDirTest

DIM = 8
TABLE = dict(optimizer="adagrad", learning_rate=0.1, init="normal", init_a=0.0, init_b=0.1,
             seed=7)


class ThreadGroup:
    """A process group of threads in this process (ctypes releases the GIL in each embstore
    call, so the ranks' calls run side by side and meet in the callbacks)."""

    def __init__(self, world_size, fail=None):
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.slots = [None] * world_size
        self.fail = fail  # (rank, method): that rank's method raises
        self.calls = 0

    def comm(self, rank):
        return ThreadComm(self, rank)


class ThreadComm(embstore.Communicator):
    def __init__(self, group, rank):
        self.group = group
        self.rank = rank
        self.world_size = group.world_size

    def _exchange(self, what, mine):
        g = self.group
        if g.fail == (self.rank, what):
            g.barrier.abort()  # the others' collective fails too, as a broken group's would
            raise RuntimeError(f"rank {self.rank}: {what} failed on purpose")
        g.slots[self.rank] = mine
        g.barrier.wait()
        everyone = list(g.slots)
        g.barrier.wait()  # nobody overwrites a slot before all have read them
        if self.rank == 0:
            g.calls += 1
        return everyone

    def all_gather(self, send, recv):
        assert not send.flags.writeable and recv.size == send.size * self.world_size
        everyone = self._exchange("all_gather", bytes(send))
        recv[:] = np.frombuffer(b"".join(everyone), np.uint8)

    def all_to_all(self, send, send_counts, recv, recv_counts):
        assert len(send_counts) == len(recv_counts) == self.world_size
        assert send.size == sum(send_counts) and recv.size == sum(recv_counts)
        starts = np.cumsum([0] + send_counts)
        parts = [bytes(send[starts[q]:starts[q + 1]]) for q in range(self.world_size)]
        everyone = self._exchange("all_to_all", parts)
        got = b"".join(everyone[q][self.rank] for q in range(self.world_size))
        assert len(got) == recv.size
        recv[:] = np.frombuffer(got, np.uint8)


def run_ranks(world_size, body, group=None):
    """body(rank, comm) on one thread per rank; -> the results in rank order, or raises the
    first rank's exception (all are in .errors of the group)."""
    group = group or ThreadGroup(world_size)
    results, errors = [None] * world_size, [None] * world_size

    def run(rank):
        try:
            results[rank] = body(rank, group.comm(rank))
        except BaseException as e:  # noqa: B036 - reported below
            errors[rank] = e
    # Daemons: a rank stuck outside the callbacks (where no barrier times out) fails the test
    # below instead of keeping the test process from exiting.
    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"ranks {stuck} did not finish in 120 s"
    group.errors = errors
    for e in errors:
        if e is not None:
            raise e
    return results


def batches(world_size, steps, rng):
    """Each rank's batch per step: skewed ids with duplicates, and gradients."""
    out = []
    for _ in range(steps):
        step = []
        for _ in range(world_size):
            keys = (rng.zipf(1.3, size=40) % 97).astype(np.int64) - 20  # negative keys too
            step.append((keys, rng.standard_normal((40, DIM)).astype(np.float32)))
        out.append(step)
    return out


def train_one_process(store, steps):
    t = store.create_table("t", DIM, **TABLE)
    for i, step in enumerate(steps):
        keys = np.concatenate([k for k, _ in step])
        t.lookup(keys, insert=True)
        t.apply_gradients(keys, np.concatenate([g for _, g in step]))
        store.step(i + 1)
    return t


class ShardedStoreTest(TempDirTest):
    def test_ranks_train_as_one_process_and_restore_at_any_world_size(self):
        world = 3
        steps = batches(world, 6, np.random.default_rng(1))
        every_key = np.unique(np.concatenate([k for s in steps for k, _ in s]))

        def train(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                self.assertEqual((s.rank, s.world_size), (rank, world))
                t = s.create_table("t", DIM, **TABLE)
                for i, step in enumerate(steps):
                    keys, grads = step[rank]
                    rows = t.sharded_lookup(keys, insert=True)
                    self.assertEqual(rows.shape, (len(keys), DIM))
                    t.sharded_apply_gradients(keys, grads)
                    s.step(i + 1)
                    if i == 2:
                        s.checkpoint(self.path("ckpt"), "full")
                s.attach("rank", str(rank).encode())
                v = s.checkpoint(self.path("ckpt"), "incremental", wait=True)
                self.assertEqual((s.checkpoint_info(v).kind, s.checkpoint_info(v).parent),
                                 ("incremental", 3))
                owned = every_key[embstore.shard_of(every_key, world) == rank]
                # Plain calls take only the keys this rank owns.
                np.testing.assert_array_equal(t.lookup(owned), t.sharded_lookup(owned))
                return v, len(t), t.sharded_lookup(every_key)

        results = run_ranks(world, train)
        version = results[0][0]
        self.assertEqual([r[0] for r in results], [version] * world)
        with embstore.Store("host", host_threads=1) as one:
            expected = train_one_process(one, steps).lookup(every_key)
            self.assertEqual(sum(r[1] for r in results), len(every_key))
            for _, _, rows in results:  # every rank read every key's row from its owner
                np.testing.assert_array_equal(rows, expected)

            # The 3-rank checkpoint (a full and a delta) restores into one process, optimizer
            # state included: one more update lands on the same values.
            with embstore.Store("host", host_threads=1) as restored:
                self.assertEqual(restored.restore(self.path("ckpt")), version)
                t, u = restored.table("t"), one.table("t")
                np.testing.assert_array_equal(t.lookup(every_key), expected)
                grads = np.random.default_rng(2).standard_normal((len(every_key), DIM))
                t.apply_gradients(every_key, grads.astype(np.float32))
                u.apply_gradients(every_key, grads.astype(np.float32))
                np.testing.assert_array_equal(t.lookup(every_key), u.lookup(every_key))
            one.checkpoint(self.path("one"), "full", wait=True)
            after = one.table("t").lookup(every_key)

        # And one process's checkpoint restores into two ranks, each keeping its own keys.
        def restore(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                s.restore(self.path("one"))
                t = s.table("t")
                owned = every_key[embstore.shard_of(every_key, 2) == rank]
                self.assertEqual(len(t), len(owned))
                return t.sharded_lookup(every_key)
        for rows in run_ranks(2, restore):
            np.testing.assert_array_equal(rows, after)

    def test_each_rank_restores_its_own_attachments(self):
        def save(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                s.create_table("t", DIM).sharded_lookup(np.arange(5), insert=True)
                s.attach("state", f"rank {rank}".encode())
                s.checkpoint(self.path("ckpt"), wait=True)
        run_ranks(2, save)

        def load(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                s.restore(self.path("ckpt"))
                return s.restore_attachment("state")
        self.assertEqual(run_ranks(2, load), [b"rank 0", b"rank 1"])

    def test_warm_start_of_a_sharded_store(self):
        def save(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                t = s.create_table("t", DIM, **TABLE)
                t.sharded_lookup(np.arange(30) + 7 * rank, insert=True)
                s.create_table("other", DIM).sharded_lookup(np.arange(4), insert=True)
                s.checkpoint(self.path("ckpt"), wait=True)
                return t.sharded_lookup(np.arange(45))
        saved = run_ranks(3, save)[0]

        def warm(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                s.warm_start([embstore.WarmStartSource(self.path("ckpt"), tables="t")])
                with self.assertRaises(embstore.NotFoundError):
                    s.table("other")  # not chosen
                return s.table("t").sharded_lookup(np.arange(45))
        for rows in run_ranks(2, warm):
            np.testing.assert_array_equal(rows, saved)

    def test_a_bad_argument_on_one_rank_fails_every_rank_at_once(self):
        # Each rank's Python checks run before the collective: the rank that fails them still
        # enters it, so that the others fail at once instead of waiting for it.
        def body(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                t = s.create_table("t", DIM)
                keys = np.arange(6) + rank
                outcomes = []
                for bad in ("grads", "keys"):
                    try:
                        if bad == "grads":
                            grads = np.ones((6, DIM + (rank == 1)), np.float32)
                            t.sharded_apply_gradients(keys, grads)
                        else:
                            t.sharded_lookup(keys.astype(np.float64) if rank == 1 else keys)
                        outcomes.append(None)
                    except embstore.Error as e:
                        outcomes.append(e)
                    except TypeError as e:
                        outcomes.append(e)
                # The group is still in step: a good call goes through on every rank.
                t.sharded_lookup(keys, insert=True)
                return outcomes
        group = ThreadGroup(2)
        outcomes = run_ranks(2, body, group)
        self.assertEqual(group.errors, [None, None])
        self.assertIsInstance(outcomes[1][0], embstore.InvalidArgumentError)
        self.assertIn("grads: shape", str(outcomes[1][0]))
        self.assertIsInstance(outcomes[1][1], TypeError)
        for e in outcomes[0]:
            self.assertIsInstance(e, embstore.InvalidArgumentError)
            self.assertIn("rank 1", str(e))

    def test_a_failing_communicator_fails_every_rank_with_comm_error(self):
        group = ThreadGroup(2, fail=(1, "all_to_all"))

        def body(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                t = s.create_table("t", DIM)
                try:
                    t.sharded_lookup(np.arange(10) + rank, insert=True)
                except embstore.CommError as e:
                    return e
                return None
        errors = run_ranks(2, body, group)
        for rank, e in enumerate(errors):
            self.assertIsInstance(e, embstore.CommError, f"rank {rank}")
            self.assertEqual(e.status_name, "EMBSTORE_COMM_ERROR")
        # The exception of the communicator is the CommError's cause, on the rank it came from.
        self.assertIsInstance(errors[1].__cause__, RuntimeError)
        self.assertIn("failed on purpose", str(errors[1].__cause__))
        self.assertIsInstance(errors[0].__cause__, threading.BrokenBarrierError)
        # The cause's frames no longer hold the views of the library's buffers (freed when the
        # call returned): formatting it with its locals reads none of that memory.
        text = "".join(traceback.TracebackException.from_exception(
            errors[1], capture_locals=True).format())
        self.assertIn("failed on purpose", text)
        self.assertNotIn("dtype=uint8", text)  # the views' repr, were they still there

    def test_keyboard_interrupt_in_the_communicator_is_raised_as_itself(self):
        class Interrupted(ThreadComm):
            def all_to_all(self, send, send_counts, recv, recv_counts):
                if self.rank == 1:
                    self.group.barrier.abort()
                    raise KeyboardInterrupt
                super().all_to_all(send, send_counts, recv, recv_counts)

        class Group(ThreadGroup):
            def comm(self, rank):
                return Interrupted(self, rank)

        def body(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                t = s.create_table("t", DIM)
                try:
                    t.sharded_lookup(np.arange(4), insert=True)
                except (embstore.CommError, KeyboardInterrupt) as e:
                    return type(e)
        self.assertEqual(run_ranks(2, body, Group(2)), [embstore.CommError, KeyboardInterrupt])

    def test_a_failure_the_library_absorbs_is_chained_to_its_later_report(self):
        # step() first settles a checkpoint in flight with an all_gather. When that exchange
        # fails (on every rank, once), the checkpoint fails (wait reports it) and step goes on.
        class Armed(ThreadComm):
            def all_gather(self, send, recv):
                super().all_gather(send, recv)  # every rank exchanges, then fails
                raised = self.group.armed.pop(self.rank, None)
                if raised is not None:
                    raise raised(f"rank {self.rank}: settle failed on purpose")

        class Group(ThreadGroup):
            def comm(self, rank):
                return Armed(self, rank)

        for raised in (RuntimeError, KeyboardInterrupt):
            group = Group(2)
            group.armed = {}

            def body(rank, comm, group=group, raised=raised):
                s = embstore.Store("host", host_threads=1, comm=comm)
                t = s.create_table("t", DIM)
                t.sharded_lookup(np.arange(20000) * 2 + rank, insert=True)
                v = s.checkpoint(self.path(f"ckpt-{raised.__name__}"))
                group.barrier.wait()  # both captured before the failure is armed
                group.armed[rank] = raised if rank == 1 else RuntimeError
                outcome = []
                try:
                    s.step(2)
                    outcome.append("step ok")
                    s.wait(v)
                except (embstore.Error, KeyboardInterrupt) as e:
                    outcome += [type(e), type(e.__cause__)]
                try:
                    s.close()
                except embstore.Error:
                    pass
                return outcome
            got = run_ranks(2, body, group)
            # Rank 0's RuntimeError, absorbed by step, is the cause of wait's CommError.
            self.assertEqual(got[0], ["step ok", embstore.CommError, RuntimeError])
            if raised is RuntimeError:
                self.assertEqual(got[1], ["step ok", embstore.CommError, RuntimeError])
            else:  # raised as itself, from the call that ran it, though that call succeeded
                self.assertEqual(got[1], [KeyboardInterrupt, type(None)])

    def test_bad_module_input_on_one_rank_fails_every_rank_at_once(self):
        import torch

        import embstore.torch as et

        def body(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                emb = et.Embedding(s, "e", DIM)
                bag = et.EmbeddingBag(s, "b", DIM, mode="sum")
                outcomes = []
                for bad in ("float ids", "offsets", "stream"):
                    try:
                        if bad == "float ids":
                            emb(torch.ones(3) if rank == 1 else torch.arange(3))
                        elif bad == "offsets":
                            bag(torch.arange(4), torch.tensor([0, 5] if rank == 1 else [0, 2]))
                        else:
                            emb.table.sharded_lookup(np.arange(3),
                                                     stream="x" if rank == 1 else None)
                        outcomes.append(None)
                    except (embstore.Error, TypeError, ValueError) as e:
                        outcomes.append(type(e))
                emb(torch.arange(3)).sum().backward()  # still in step
                return outcomes
        group = ThreadGroup(2)
        group.barrier = threading.Barrier(2, timeout=20)  # a rank left waiting fails the test
        got = run_ranks(2, body, group)
        self.assertEqual(got[0], [embstore.InvalidArgumentError] * 3)
        self.assertEqual(got[1], [TypeError, embstore.InvalidArgumentError, ValueError])

    def test_unclosed_sharded_stores_are_not_freed_collectively_by_the_garbage_collector(self):
        def body(rank, comm):
            s = embstore.Store("host", host_threads=1, comm=comm)
            s.create_table("t", DIM).sharded_lookup(np.arange(8), insert=True)
            s.checkpoint(self.path("ckpt"))  # in flight until a collective call settles it
            return s
        for in_flight in (True, False):
            stores = run_ranks(2, body) if in_flight else [
                embstore.Store("host", host_threads=1, comm=ThreadGroup(2).comm(r))
                for r in range(2)]
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                del stores
                gc.collect()
            # Left unfreed: a warning shown by default; freed: a ResourceWarning.
            kind = RuntimeWarning if in_flight else ResourceWarning
            texts = [str(w.message) for w in seen if w.category is kind]
            self.assertEqual(len(texts), 2, [str(w.message) for w in seen])
            for text in texts:
                self.assertIn("left unfreed" if in_flight else "freed here", text)

    def test_bad_communicators_are_refused(self):
        with self.assertRaises(TypeError):
            embstore.Store("host", comm=object())
        comm = ThreadGroup(2).comm(0)
        comm.world_size = 0
        with self.assertRaises(embstore.InvalidArgumentError):
            embstore.Store("host", comm=comm)
        comm = ThreadGroup(2).comm(0)
        comm.rank = 2  # outside [0, world_size)
        with self.assertRaises(embstore.InvalidArgumentError):
            embstore.Store("host", comm=comm)

        class NotMethods:
            rank, world_size, all_gather, all_to_all = 0, 2, 1, 2
        with self.assertRaises(TypeError):
            embstore.Store("host", comm=NotMethods())

        class NoRank(embstore.Communicator):  # rank and world_size have no defaults
            def all_gather(self, send, recv):
                pass

            def all_to_all(self, send, send_counts, recv, recv_counts):
                pass
        with self.assertRaises(TypeError):
            embstore.Store("host", comm=NoRank())

    def test_a_store_of_one_rank_with_a_communicator_is_a_plain_store(self):
        with embstore.Store("host", host_threads=1, comm=ThreadGroup(1).comm(0)) as s:
            t = s.create_table("t", DIM, **TABLE)
            keys = np.array([3, 1, 3], np.int64)
            np.testing.assert_array_equal(t.sharded_lookup(keys, insert=True), t.lookup(keys))


# ------------------------------------------------- embstore.torch.ProcessGroup over gloo --

WORKER = r"""
import datetime
import sys
import numpy as np
import torch
import torch.distributed as dist
import embstore
import embstore.torch as et

rank, world, init, ckpt, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
rank, world = int(rank), int(world)
# A short timeout: a rank that died does not leave the other waiting for gloo's 30 minutes.
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))
data = np.load(out + ".in.npz")
with embstore.Store("host", host_threads=1, comm=et.ProcessGroup()) as store:
    bag = et.EmbeddingBag(store, "items", 8, mode="sum", optimizer="adagrad",
                          learning_rate=0.1, init="normal", init_b=0.1, seed=3)
    for step in range(data["ids"].shape[0]):
        ids = torch.from_numpy(data["ids"][step, rank])
        (bag(ids).sum() * (rank + 1)).backward()
        store.step(step + 1)
    store.checkpoint(ckpt, "full", wait=True)
    keys = torch.from_numpy(data["every_key"])
    np.save(f"{out}.{rank}.npy", bag.table.sharded_lookup(keys).numpy())
dist.destroy_process_group()
"""


def _torch_distributed():
    try:
        import torch.distributed as dist
        return dist.is_available() and dist.is_gloo_available()
    except ImportError:
        return False


@unittest.skipUnless(_torch_distributed(), "needs torch.distributed with gloo")
class TorchProcessGroupTest(TempDirTest):
    def test_two_processes_train_an_embedding_bag_as_one(self):
        import torch

        import embstore.torch as et
        world, steps = 2, 4
        rng = np.random.default_rng(5)
        ids = (rng.zipf(1.4, size=(steps, world, 6, 5)) % 50).astype(np.int64)
        every_key = np.unique(ids)
        base = self.path("rank")
        np.savez(base + ".in.npz", ids=ids, every_key=every_key)
        script = self.path("worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        init = "file://" + self.path("rendezvous")
        env = dict(os.environ, PYTHONWARNINGS="ignore", GLOO_SOCKET_IFNAME="lo")
        procs = [subprocess.Popen([sys.executable, script, str(r), str(world), init,
                                   self.path("ckpt"), base], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(world)]
        try:
            for p in procs:
                out, _ = p.communicate(timeout=300)
                self.assertEqual(p.returncode, 0, out)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        rows = np.load(base + ".0.npy")
        np.testing.assert_array_equal(np.load(base + ".1.npy"), rows)  # both read every row

        # One process, each step's bags of both ranks in one batch, rank r's loss scaled by
        # r + 1 as in the workers: the same rows, bit for bit.
        with embstore.Store("host", host_threads=1) as one:
            bag = et.EmbeddingBag(one, "items", 8, mode="sum", optimizer="adagrad",
                                  learning_rate=0.1, init="normal", init_b=0.1, seed=3)
            scale = torch.tensor([1.0] * 6 + [2.0] * 6).unsqueeze(1)
            for step in range(steps):
                batch = torch.from_numpy(ids[step].reshape(world * 6, 5))
                (bag(batch) * scale).sum().backward()
                one.step(step + 1)
            np.testing.assert_array_equal(rows, bag.table.lookup(every_key))
            # The two ranks' checkpoint restores here, to the same rows.
            with embstore.Store("host", host_threads=1) as restored:
                restored.restore(self.path("ckpt"))
                np.testing.assert_array_equal(restored.table("items").lookup(every_key), rows)

    def test_sharded_modules_train_as_one_process(self):
        # Embedding and a mean EmbeddingBag over offsets, 2 ranks as threads: the modules use
        # the collective calls on a sharded store.
        import torch

        import embstore.torch as et
        rng = np.random.default_rng(8)
        ids = [[torch.from_numpy((rng.zipf(1.3, 12) % 40).astype(np.int64)) for _ in range(2)]
               for _ in range(3)]
        offsets = torch.tensor([0, 3, 3, 7])  # bags of 3, 0, 4 and 5 ids

        def train(store, step_ids):
            emb = et.Embedding(store, "e", DIM, optimizer="sgd", learning_rate=0.5,
                               init="normal", init_b=0.1, seed=1)
            bag = et.EmbeddingBag(store, "b", DIM, mode="mean", optimizer="adagrad",
                                  learning_rate=0.1, init="normal", init_b=0.1, seed=2)
            for i, x in enumerate(step_ids):
                per_rank = x if isinstance(x, list) else [x]
                loss = sum((emb(v) ** 2).sum() + (bag(v, offsets) * 3).sum() for v in per_rank)
                loss.backward()
                store.step(i + 1)
            every = torch.arange(40)
            lookup = (emb.table.sharded_lookup if store.world_size > 1 else emb.table.lookup)
            blookup = (bag.table.sharded_lookup if store.world_size > 1 else bag.table.lookup)
            return lookup(every), blookup(every)

        def rank_body(rank, comm):
            with embstore.Store("host", host_threads=1, comm=comm) as s:
                return train(s, [step[rank] for step in ids])
        sharded = run_ranks(2, rank_body)

        # One process: each step's ids of both ranks in one forward (bags of rank 1 after
        # rank 0's), so that each row's gradients are summed in the same order.
        both = torch.tensor([0, 3, 3, 7, 12, 15, 15, 19])
        with embstore.Store("host", host_threads=1) as one:
            emb = et.Embedding(one, "e", DIM, optimizer="sgd", learning_rate=0.5,
                               init="normal", init_b=0.1, seed=1)
            bag = et.EmbeddingBag(one, "b", DIM, mode="mean", optimizer="adagrad",
                                  learning_rate=0.1, init="normal", init_b=0.1, seed=2)
            for i, step in enumerate(ids):
                x = torch.cat(step)
                ((emb(x) ** 2).sum() + (bag(x, both) * 3).sum()).backward()
                one.step(i + 1)
            every = torch.arange(40)
            expected = (emb.table.lookup(every), bag.table.lookup(every))
        for e, b in sharded:
            torch.testing.assert_close(e, expected[0], rtol=0, atol=0)
            torch.testing.assert_close(b, expected[1], rtol=0, atol=0)

    def test_process_group_needs_torch_distributed_initialized(self):
        import torch.distributed as dist

        import embstore.torch as et
        if dist.is_initialized():
            self.skipTest("a process group is initialized in this process")
        with self.assertRaises(embstore.InvalidArgumentError):
            et.ProcessGroup()


if __name__ == "__main__":
    unittest.main()
