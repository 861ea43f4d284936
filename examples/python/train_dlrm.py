#!/usr/bin/env python3
"""A small DLRM-style click model trained with embstore tables, with incremental checkpoints.

    pip install '.[torch]'
    python examples/python/train_dlrm.py --dir /tmp/dlrm

Sparse features: one embstore table each (embstore.torch.EmbeddingBag, fused Adagrad in the
backward pass); dense features: a torch MLP with torch.optim.Adagrad. Clicks are synthetic:
ids drawn from a skewed (Zipf) distribution, labels from a hidden logistic model. Every
--checkpoint-every steps one incremental checkpoint holds the tables, the MLP, its optimizer's
state and the step. Kill the script (kill -9, or --kill-at-step) and run it again with the same
--dir: it restores the newest checkpoint and goes on, and on the CPU its final digest equals an
uninterrupted run's.
"""

import argparse
import hashlib
import os
import signal
import sys

import numpy as np
import torch
from torch import nn

import embstore
import embstore.torch as et


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="checkpoint directory (resumed from if it holds one)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--features", type=int, default=4, help="sparse features (tables)")
    p.add_argument("--ids", type=int, default=100_000, help="distinct ids per feature")
    p.add_argument("--bag", type=int, default=4, help="ids per sample per feature")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kill-at-step", type=int, default=0,
                   help="SIGKILL this process after that step (a crash, for the resume demo)")
    p.add_argument("--threads", type=int, default=0, help="torch and embstore threads (0: all)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


DENSE = 13


class DLRM(nn.Module):
    """Bottom MLP on the dense features, pooled embeddings, pairwise dot interactions, top MLP.
    The embedding bags live in the store; this module's parameters are the dense ones only."""

    def __init__(self, store, args):
        super().__init__()
        d = args.dim
        self.bags = nn.ModuleList([
            et.EmbeddingBag(store, f"feature_{i}", d, mode="sum", optimizer="adagrad",
                            learning_rate=0.05, epsilon=1e-8, init="uniform", init_a=-0.05,
                            init_b=0.05, seed=100 + i, initial_capacity=args.ids)
            for i in range(args.features)])
        self.bottom = nn.Sequential(nn.Linear(DENSE, 64), nn.ReLU(), nn.Linear(64, d), nn.ReLU())
        n = args.features + 1
        self.top = nn.Sequential(nn.Linear(d + n * (n - 1) // 2, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        vectors = torch.stack([x] + [bag(ids) for bag, ids in zip(self.bags, sparse)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))
        i, j = torch.triu_indices(vectors.shape[1], vectors.shape[1], offset=1)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


def batch(args, step):
    """The batch of a step: a function of (seed, step) alone, so a resumed run sees the same
    data as an uninterrupted one."""
    rng = np.random.default_rng([args.seed, step])
    dense = rng.standard_normal((args.batch, DENSE)).astype(np.float32)
    sparse = [(rng.zipf(1.2, (args.batch, args.bag)) - 1) % args.ids for _ in range(args.features)]
    # Hidden model: a dense direction plus each id's fixed (hashed) preference.
    truth = dense @ np.linspace(-1, 1, DENSE)
    for f, ids in enumerate(sparse):
        truth += (((ids * 2654435761 + f) % 1000) / 500.0 - 1.0).mean(axis=1)
    labels = (rng.random(args.batch) < 1 / (1 + np.exp(-truth))).astype(np.float32)
    return (torch.from_numpy(dense), [torch.from_numpy(s) for s in sparse],
            torch.from_numpy(labels))


def digest(model, store, args):
    """SHA-256 of every table's rows of the ids 0..ids-1 and of the dense parameters."""
    h = hashlib.sha256()
    keys = np.arange(args.ids, dtype=np.int64)
    for bag in model.bags:
        h.update(store.table(bag.table.name).lookup(keys).tobytes())
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    store = embstore.Store("host", host_threads=args.threads)
    model = DLRM(store, args)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.01)
    loss_fn = nn.BCEWithLogitsLoss()

    first = 1
    try:
        version, state = et.restore(store, args.dir, model=model, optimizer=optimizer)
        first = state["step"] + 1
        print(f"resumed from version {version} (step {state['step']})", flush=True)
    except embstore.NotFoundError:
        print(f"no checkpoint in {args.dir}: starting at step 1", flush=True)

    last = None
    for step in range(first, args.steps + 1):
        dense, sparse, labels = batch(args, step)
        loss = loss_fn(model(dense, sparse), labels)
        optimizer.zero_grad()
        loss.backward()  # the tables' rows are updated here, by their fused Adagrad
        optimizer.step()
        store.step(step)
        if step % args.checkpoint_every == 0 or step == args.steps:
            last = et.checkpoint(store, args.dir, "incremental", model=model,
                                 optimizer=optimizer, step=step)
        if not args.quiet and (step % 50 == 0 or step == args.steps):
            rows = sum(len(b.table) for b in model.bags)
            print(f"step {step:5d}  loss {loss.item():.4f}  rows {rows}", flush=True)
        if step == args.kill_at_step:
            print(f"killing myself after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    if last is not None:
        store.wait(last)
        info = store.checkpoint_info(last)
        print(f"checkpoint {last}: {info.kind}, {info.rows_written} rows, "
              f"{info.bytes_written / 1e6:.1f} MB in {info.write_seconds * 1e3:.0f} ms")
    print(f"digest {digest(model, store, args)}", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
