"""embstore.torch: the modules train to the values nn.Embedding / nn.EmbeddingBag reach with
torch.optim.SGD and Adagrad on the same batches, and the trainer state round-trips.

Tolerance: the reference runs in float64; embstore computes in float32. Each step rounds a
handful of float32 operations per element (the sum of duplicate keys' gradients, the update),
so after the STEPS steps here the rows stay within a few hundred float32 ulps of the exact
value: the tests allow 1e-5 of the rows' largest magnitude. A wrong sign, learning rate,
accumulator or duplicate handling is off by orders of magnitude more."""

import unittest

import embstore
from support import close

try:
    import torch
    from torch import nn

    import embstore.torch as et
except ImportError:  # pragma: no cover - the CI venv has torch
    torch = None

STEPS = 20
ROWS = 50
DIM = 8


def batches(seed, bag_len=None):
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        shape = (16, bag_len) if bag_len else (32,)
        # A skewed id distribution: duplicates in every batch.
        ids = (torch.rand(shape, generator=g) ** 3 * ROWS).long()
        target = torch.randn(*shape[:1], DIM, generator=g, dtype=torch.float64)
        yield ids, target


@unittest.skipIf(torch is None, "torch is not installed")
class MatchesTorchTest(unittest.TestCase):
    def run_pair(self, optimizer, bag_mode=None, offsets=False):
        lr = 0.05 if optimizer == "sgd" else 0.1
        store = embstore.Store("host")
        self.addCleanup(store.close)
        opts = dict(optimizer=optimizer, learning_rate=lr, init="normal", init_a=0.0,
                    init_b=0.5, seed=4)
        if optimizer == "adagrad":
            opts["epsilon"] = 1e-10  # torch.optim.Adagrad's default eps
        if bag_mode:
            ours = et.EmbeddingBag(store, "t", DIM, mode=bag_mode, **opts)
        else:
            ours = et.Embedding(store, "t", DIM, **opts)
        all_keys = torch.arange(ROWS)
        with torch.no_grad():
            initial = ours.table.lookup(all_keys, insert=True)  # the initializer's rows
        if bag_mode:
            ref = nn.EmbeddingBag(ROWS, DIM, mode=bag_mode).double()
        else:
            ref = nn.Embedding(ROWS, DIM).double()
        with torch.no_grad():
            ref.weight.copy_(initial.double())
        ref_opt = (torch.optim.SGD(ref.parameters(), lr=lr) if optimizer == "sgd" else
                   torch.optim.Adagrad(ref.parameters(), lr=lr))
        for ids, target in batches(7, bag_len=5 if bag_mode else None):
            args = (ids,)
            if offsets:  # 1-D ids, bags of 0 to 9 ids, weighted
                flat = ids.reshape(-1)
                starts = torch.tensor([0, 0, 3, 12, 20, 30, 39, 45, 50, 58, 60, 66, 70, 71, 75,
                                       79])
                weights = torch.linspace(-1, 2, flat.numel())
                args = (flat, starts, weights)
                ref_args = (flat, starts, weights.double())
            else:
                ref_args = args
            ((ours(*args).double() - target) ** 2).sum().backward()
            ref_opt.zero_grad()
            ((ref(*ref_args) - target) ** 2).sum().backward()
            ref_opt.step()
        close(self, ours.table.lookup(all_keys), ref.weight)
        # And something moved: the comparison is not of two untouched tables.
        self.assertGreater((ref.weight - initial.double()).abs().max().item(), 1e-2)

    def test_embedding_sgd(self):
        self.run_pair("sgd")

    def test_embedding_adagrad(self):
        self.run_pair("adagrad")

    def test_bag_sum_sgd(self):
        self.run_pair("sgd", "sum")

    def test_bag_mean_adagrad(self):
        self.run_pair("adagrad", "mean")

    def test_bag_offsets_weighted_adagrad(self):
        self.run_pair("adagrad", "sum", offsets=True)


@unittest.skipIf(torch is None, "torch is not installed")
class ModuleTest(unittest.TestCase):
    def setUp(self):
        self.store = embstore.Store("host")
        self.addCleanup(self.store.close)

    def test_bag_with_offsets_matches_fixed_bags_and_torch(self):
        bag = et.EmbeddingBag(self.store, "t", 4, mode="sum", init="uniform", seed=1)
        ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
        fixed = bag(ids)
        flat = bag(ids.reshape(-1), torch.tensor([0, 3]))
        torch.testing.assert_close(fixed, flat, rtol=0, atol=1e-6)
        ref = nn.EmbeddingBag(7, 4, mode="sum")
        with torch.no_grad():
            ref.weight.copy_(bag.table.lookup(torch.arange(7)))
        w = torch.tensor([0.5, 2.0, 1.0, 1.0, -1.0, 3.0])
        torch.testing.assert_close(bag(ids.reshape(-1), torch.tensor([0, 2]),
                                       per_sample_weights=w),
                                   ref(ids.reshape(-1), torch.tensor([0, 2]),
                                       per_sample_weights=w))

    def test_eval_mode_does_not_insert(self):
        emb = et.Embedding(self.store, "t", 4, init="constant", init_a=1.0)
        emb.eval()
        out = emb(torch.tensor([5, 6]))
        self.assertFalse(out.requires_grad)
        self.assertTrue((out == 0).all())
        self.assertEqual(len(emb.table), 0)
        emb.train()
        self.assertTrue((emb(torch.tensor([5])) == 1).all())
        self.assertEqual(len(emb.table), 1)

    def test_module_has_no_parameters_and_binds_existing_tables(self):
        emb = et.Embedding(self.store, "t", 4)
        self.assertEqual(list(emb.parameters()), [])
        self.assertEqual(dict(emb.state_dict()), {})
        again = et.Embedding(self.store, "t", 4)
        self.assertIs(again.table, emb.table)
        with self.assertRaises(embstore.InvalidArgumentError):
            et.Embedding(self.store, "t", 8)

    def test_bad_input_raises(self):
        emb = et.EmbeddingBag(self.store, "t", 4, mode="mean")
        with self.assertRaises(TypeError):
            emb(torch.tensor([0.5, 1.5]), torch.tensor([0]))
        with self.assertRaises(embstore.InvalidArgumentError):
            emb(torch.tensor([1, 2]))  # 1-D without offsets
        with self.assertRaises(embstore.InvalidArgumentError):
            emb(torch.tensor([1, 2]), torch.tensor([1]))  # not from 0
        with self.assertRaises(embstore.InvalidArgumentError):
            emb(torch.tensor([1, 2]), torch.tensor([0, 3]))  # past the input
        with self.assertRaises(embstore.InvalidArgumentError):
            emb(torch.tensor([1, 2]), torch.tensor([0]), per_sample_weights=torch.ones(2))
        with self.assertRaises(embstore.InvalidArgumentError):
            et.EmbeddingBag(self.store, "u", 4, mode="max")
        with self.assertRaises(TypeError):
            emb([1, 2])
        with self.assertRaises(embstore.InvalidArgumentError):
            emb(torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64))  # empty offsets
        with self.assertRaises(TypeError):
            emb.table.lookup(torch.tensor([True, False]))
        with self.assertRaises(TypeError):
            emb.table.lookup(torch.tensor([1 + 2j]))


@unittest.skipIf(torch is None, "torch is not installed")
class TrainerStateTest(unittest.TestCase):
    def test_one_checkpoint_restores_the_whole_trainer(self):
        import shutil
        import tempfile
        d = tempfile.mkdtemp(prefix="embstore-py-")
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        torch.manual_seed(0)
        mlp = nn.Linear(4, 1)
        opt = torch.optim.Adam(mlp.parameters(), lr=0.01)
        with embstore.Store("host") as store:
            emb = et.Embedding(store, "t", 4)
            for step in range(1, 4):
                loss = mlp(emb(torch.tensor([1, 2, 3]))).pow(2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
                store.step(step)
            rng = torch.get_rng_state()
            v = et.checkpoint(store, d, "incremental", wait=True, model=mlp, optimizer=opt,
                              step=3, rng=rng)
            rows = emb.table.lookup(torch.arange(4))
        mlp2 = nn.Linear(4, 1)
        opt2 = torch.optim.Adam(mlp2.parameters(), lr=0.01)
        with embstore.Store("host") as store:
            version, state = et.restore(store, d, model=mlp2, optimizer=opt2)
            self.assertEqual((version, state["step"]), (v, 3))
            torch.testing.assert_close(state["rng"], rng, rtol=0, atol=0)
            torch.testing.assert_close(store["t"].lookup(torch.arange(4)), rows, rtol=0, atol=0)
            for a, b in zip(mlp.parameters(), mlp2.parameters()):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            self.assertEqual(opt.state_dict()["state"][0]["step"],
                             opt2.state_dict()["state"][0]["step"])
            with self.assertRaises(embstore.NotFoundError):
                et.load_state(store, model=mlp2, missing=opt2)
            with self.assertRaises(embstore.NotFoundError):
                et.load_state(store, name="other")


if __name__ == "__main__":
    unittest.main()
