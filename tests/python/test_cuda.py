"""The package's CUDA paths: CUDA tensors passed by pointer on torch's current stream (or an
explicit one), the device checks, and the same numbers as the host backend. Skipped where torch
sees no GPU or the library was built without the CUDA backend (CI: no GPU).

The CUDA backend runs the per-row code the host backend runs (cuda/row/), so lookups and
optimizer updates are compared bit for bit. embstore.torch's modules are compared within the
tolerance of test_torch.py: torch pools a bag's rows in another order on the GPU, so the
gradients the tables receive differ by float32 rounding."""

import unittest

import numpy as np

import embstore
from support import TempDirTest, close

try:
    import torch

    import embstore.torch as et
except ImportError:  # pragma: no cover - the CI venv has torch
    torch = None


def _cuda_unavailable():
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        embstore.Store("cuda").close()
    except embstore.Error as e:
        return f"the library has no usable CUDA backend ({e.status_name})"
    return None


_SKIP = _cuda_unavailable()
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
DIM = 16


def table_options(optimizer):
    return dict(optimizer=optimizer, learning_rate=0.05, init="normal", init_a=0.0, init_b=0.5,
                seed=11, initial_capacity=64)


def batches(seed, steps=12, n=300, space=500):
    """Skewed keys (duplicates in every batch, new keys every step) and gradients, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        keys = (torch.rand(n, generator=g) ** 3 * space).long() - space // 3  # negatives too
        yield keys, torch.randn(n, DIM, generator=g)


@unittest.skipIf(_SKIP is not None, _SKIP or "")
class CudaTablesTest(TempDirTest):
    def stores(self):
        host, cuda = embstore.Store("host"), embstore.Store("cuda")
        self.addCleanup(host.close)
        self.addCleanup(cuda.close)
        self.assertEqual((host.backend, cuda.backend), ("host", "cuda"))
        return host, cuda

    def train_pair(self, optimizer):
        host, cuda = self.stores()
        h = host.create_table("t", DIM, **table_options(optimizer))
        c = cuda.create_table("t", DIM, **table_options(optimizer))
        for step, (keys, grads) in enumerate(batches(3), 1):
            expected = h.lookup(keys, insert=True)
            got = c.lookup(keys.cuda(), insert=True)
            self.assertTrue(got.is_cuda)
            self.assertTrue(torch.equal(got.cpu(), expected), f"{optimizer}, step {step}")
            h.apply_gradients(keys, grads)
            c.apply_gradients(keys.cuda(), grads.cuda())
            host.step(step)
            cuda.step(step)
        return host, cuda, h, c

    def test_updates_are_bit_identical_to_the_host_backend(self):
        for optimizer in OPTIMIZERS:
            with self.subTest(optimizer=optimizer):
                _, _, h, c = self.train_pair(optimizer)
                every = torch.arange(-200, 500)
                expected = h.lookup(every)
                got = c.lookup(every.cuda()).cpu()
                diff = (got - expected).abs().max().item()
                self.assertTrue(torch.equal(got, expected), f"{optimizer}: max diff {diff}")
                self.assertEqual(len(c), len(h))
                self.assertEqual(c.stats().dirty_rows, h.stats().dirty_rows)

    def test_outputs_shapes_and_out(self):
        _, cuda = self.stores()
        t = cuda.create_table("t", DIM, **table_options("adagrad"))
        keys = torch.arange(12, device="cuda").reshape(3, 4)
        rows = t.lookup(keys, insert=True)
        self.assertEqual((rows.device.type, tuple(rows.shape)), ("cuda", (3, 4, DIM)))
        out = torch.full((3, 4, DIM), float("nan"), device="cuda")
        self.assertIs(t.lookup(keys, out=out), out)
        self.assertTrue(torch.equal(out, rows))
        # int32 ids on the device are converted there once; an empty batch is a no-op.
        self.assertTrue(torch.equal(t.lookup(keys.int()), rows))
        self.assertEqual(tuple(t.lookup(torch.empty(0, dtype=torch.long, device="cuda")).shape),
                         (0, DIM))
        # Gradients as (n, dim) for 2-D keys.
        t.apply_gradients(keys, torch.ones(12, DIM, device="cuda"))
        self.assertFalse(torch.equal(t.lookup(keys), rows))

    def test_an_explicit_stream(self):
        _, cuda = self.stores()
        t = cuda.create_table("t", DIM, **table_options("sgd"))
        keys = torch.arange(1000, device="cuda")
        expected = t.lookup(keys, insert=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # keys were made on the current stream
        with torch.cuda.stream(side):  # the current stream is the side stream here
            on_current = t.lookup(keys)
        on_explicit = t.lookup(keys, stream=side)  # allocated on the default stream, run on side
        side.synchronize()
        self.assertTrue(torch.equal(on_current, expected))
        self.assertTrue(torch.equal(on_explicit, expected))
        grads = torch.ones(1000, DIM, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        t.apply_gradients(keys, grads, stream=side.cuda_stream)  # a raw handle works too
        torch.cuda.current_stream().wait_stream(side)
        torch.testing.assert_close(t.lookup(keys), expected - 0.05, rtol=0, atol=1e-6)

    def test_host_memory_is_refused_on_a_cuda_store(self):
        host, cuda = self.stores()
        c = cuda.create_table("t", DIM)
        h = host.create_table("t", DIM)
        for keys in (np.arange(4), torch.arange(4)):
            with self.assertRaises(embstore.InvalidArgumentError) as e:
                c.lookup(keys, insert=True)
            self.assertIn("CUDA", str(e.exception))
        with self.assertRaises(embstore.InvalidArgumentError):
            c.lookup(torch.arange(4, device="cuda"), out=torch.empty(4, DIM))
        with self.assertRaises(embstore.InvalidArgumentError):
            c.apply_gradients(torch.arange(4, device="cuda"), torch.ones(4, DIM))
        with self.assertRaises(embstore.InvalidArgumentError):
            h.lookup(torch.arange(4, device="cuda"))
        self.assertEqual(len(c), 0)

    def test_checkpoints_cross_backends(self):
        host, cuda, h, c = self.train_pair("adam")
        cuda.checkpoint(self.dir, "full", wait=True)
        keys, grads = next(batches(9, steps=1))
        c.apply_gradients(keys.cuda(), grads.cuda())
        h.apply_gradients(keys, grads)
        cuda.step(100)
        v = cuda.checkpoint(self.dir, "incremental", wait=True)
        self.assertEqual(cuda.checkpoint_info(v).kind, "incremental")
        every = torch.arange(-200, 500)
        with embstore.Store("host") as restored:
            self.assertEqual(restored.restore(self.dir), v)
            self.assertTrue(torch.equal(restored["t"].lookup(every), h.lookup(every)))
        with embstore.Store("cuda") as restored:
            restored.restore(self.dir)
            self.assertTrue(torch.equal(restored["t"].lookup(every.cuda()).cpu(),
                                        h.lookup(every)))

    def test_a_cuda_follower(self):
        host, _ = self.stores()
        h = host.create_table("t", DIM, **table_options("adagrad"))
        keys = torch.arange(300)
        h.lookup(keys, insert=True)
        host.step(1)
        host.checkpoint(self.dir, wait=True)
        with embstore.Follower(self.dir, backend="cuda") as f:
            got = f.lookup("t", keys.cuda())
            self.assertTrue(got.is_cuda)
            self.assertTrue(torch.equal(got.cpu(), h.lookup(keys)))
            h.apply_gradients(keys[:50], torch.ones(50, DIM))
            host.step(2)
            host.checkpoint(self.dir, "incremental", wait=True)
            self.assertEqual(f.poll(), 2)
            self.assertTrue(torch.equal(f.lookup("t", keys.cuda()).cpu(), h.lookup(keys)))
            with self.assertRaises(embstore.InvalidArgumentError):
                f.lookup("t", keys)


@unittest.skipIf(_SKIP is not None, _SKIP or "")
class CudaModulesTest(TempDirTest):
    def test_embedding_bag_trains_like_on_the_host(self):
        tables = {}
        for backend, device in (("host", "cpu"), ("cuda", "cuda")):
            store = embstore.Store(backend)
            self.addCleanup(store.close)
            bag = et.EmbeddingBag(store, "items", DIM, mode="mean", **table_options("adagrad"))
            for step, (keys, grads) in enumerate(batches(5, n=320), 1):
                target = grads[:40].to(device)
                pooled = bag(keys.reshape(40, 8).to(device))
                self.assertEqual(pooled.device.type, device)
                ((pooled - target) ** 2).sum().backward()
                store.step(step)
            bag.eval()
            every = torch.arange(-200, 500).to(device)
            tables[backend] = bag.table.lookup(every)
            if backend == "cuda":  # eval inserts nothing
                rows = len(bag.table)
                bag(torch.tensor([[10**9]], device="cuda"))
                self.assertEqual(len(bag.table), rows)
        close(self, tables["cuda"], tables["host"])

    def test_trainer_state_round_trips_from_a_cuda_store(self):
        store = embstore.Store("cuda")
        self.addCleanup(store.close)
        emb = et.Embedding(store, "t", DIM, **table_options("sgd"))
        mlp = torch.nn.Linear(DIM, 1).cuda()
        opt = torch.optim.Adagrad(mlp.parameters(), lr=0.1)
        for step, (keys, _) in enumerate(batches(2, steps=3), 1):
            loss = mlp(emb(keys.cuda())).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            store.step(step)
        et.checkpoint(store, self.dir, "full", wait=True, model=mlp, optimizer=opt, step=3)
        with embstore.Store("cuda") as again:
            mlp2 = torch.nn.Linear(DIM, 1).cuda()
            opt2 = torch.optim.Adagrad(mlp2.parameters(), lr=0.1)
            _, state = et.restore(again, self.dir, model=mlp2, optimizer=opt2)
            self.assertEqual(state["step"], 3)
            self.assertTrue(torch.equal(mlp2.weight, mlp.weight))
            every = torch.arange(-200, 500, device="cuda")
            self.assertTrue(torch.equal(again["t"].lookup(every), emb.table.lookup(every)))


if __name__ == "__main__":
    unittest.main()
