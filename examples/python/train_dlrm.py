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

Under torchrun it trains on several processes (a torch.distributed gloo group):

    torchrun --nproc-per-node 2 examples/python/train_dlrm.py --dir /tmp/dlrm2

Each table is then one sharded store's (embstore.torch.ProcessGroup): every rank takes its
slice of each step's batch, the tables' rows live on the rank that owns their key, and the
dense gradients are summed across the ranks. Checkpoints are collective (each rank writes its
shard and its own copy of the trainer state, rank 0 commits). A run resumes on any number of
processes that divides --batch: the tables restore at any world size, and the trainer state is
rank 0's. On the same number of processes, a resumed run's digest equals an uninterrupted
one's; at the end the ranks check that their dense replicas are identical.

--value-codec and --state-codec set the tables' checkpoint codecs (docs/checkpoints.md,
"Codecs"): with bf16 or int8 a resumed run goes on from rows within the codec's bound of the
trained ones, no longer bit-identical; --loss-log FILE writes each step's loss, and
perf/codec_resume.py compares such runs (docs/codec-resume.png).
"""

import argparse
import hashlib
import os
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist
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
    codecs = ["none", "lossless", "bf16", "int8"]
    p.add_argument("--value-codec", default="none", choices=codecs,
                   help="how checkpoints store the tables' values")
    p.add_argument("--state-codec", default="none", choices=codecs[:3],
                   help="how checkpoints store the tables' Adagrad state")
    p.add_argument("--loss-log", help="append 'step loss' lines to this file (rank 0)")
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
                            init_b=0.05, seed=100 + i, initial_capacity=args.ids,
                            value_codec=args.value_codec, state_codec=args.state_codec)
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


def digest(model, store, args, world):
    """SHA-256 of every table's rows of the ids 0..ids-1 and of the dense parameters. On several
    ranks a collective call: each rank reads every row from its owner, and the ranks check that
    their dense replicas are still identical."""
    h = hashlib.sha256()
    keys = np.arange(args.ids, dtype=np.int64)
    for bag in model.bags:
        h.update(store.table(bag.table.name).sharded_lookup(keys).tobytes())
    dense = hashlib.sha256()
    for name, p in model.state_dict().items():
        dense.update(name.encode())
        dense.update(p.detach().contiguous().numpy().tobytes())
    if world > 1:
        replicas = [None] * world
        dist.all_gather_object(replicas, dense.hexdigest())
        if len(set(replicas)) != 1:
            raise SystemExit(f"the dense replicas differ across ranks: {replicas}")
    h.update(dense.digest())
    return h.hexdigest()


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun
    rank, comm = 0, None
    if world > 1:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        comm = et.ProcessGroup()
        if args.batch % world:
            raise SystemExit(f"--batch {args.batch} is not a multiple of {world} processes")
    mine = slice(rank * args.batch // world, (rank + 1) * args.batch // world)
    threads = args.threads
    if threads == 0 and world > 1:  # the cores shared by the processes of this machine
        threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    store = embstore.Store("host", host_threads=threads, comm=comm)
    model = DLRM(store, args)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.01)
    # The mean over the whole step's batch, whichever slice of it this rank holds.
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")

    first = 1
    try:
        version = store.restore(args.dir)
    except embstore.NotFoundError:
        version = None
        if rank == 0:
            print(f"no checkpoint in {args.dir}: starting at step 1", flush=True)
    if version is not None:
        state = load_trainer_state(store, rank, world, model, optimizer)
        first = state["step"] + 1
        if rank == 0:
            print(f"resumed from version {version} (step {state['step']})", flush=True)

    last = None
    loss_log = open(args.loss_log, "a") if args.loss_log and rank == 0 else None
    for step in range(first, args.steps + 1):
        dense, sparse, labels = batch(args, step)
        dense, sparse, labels = dense[mine], [s[mine] for s in sparse], labels[mine]
        loss = loss_fn(model(dense, sparse), labels) / args.batch
        optimizer.zero_grad()
        loss.backward()  # the tables' rows are updated here, by their fused Adagrad
        if world > 1:
            sum_dense_gradients(model)
        optimizer.step()
        store.step(step)
        if loss_log is not None:
            loss_log.write(f"{step} {loss.item() * world:.9g}\n")
        if step % args.checkpoint_every == 0 or step == args.steps:
            last = et.checkpoint(store, args.dir, "incremental", model=model,
                                 optimizer=optimizer, step=step)
        if not args.quiet and rank == 0 and (step % 50 == 0 or step == args.steps):
            # On several ranks: rank 0's share of the loss (scaled) and rows of its shards.
            rows = sum(len(b.table) for b in model.bags)
            print(f"step {step:5d}  loss {loss.item() * world:.4f}  rows {rows}", flush=True)
        if step == args.kill_at_step and rank == world - 1:
            print(f"killing myself after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    if loss_log is not None:
        loss_log.close()
    if last is not None:
        store.wait(last)
    if last is not None and rank == 0:
        info = store.checkpoint_info(last)
        shard = " (rank 0's shard)" if world > 1 else ""
        print(f"checkpoint {last}{shard}: {info.kind}, {info.rows_written} rows, "
              f"{info.bytes_written / 1e6:.1f} MB in {info.write_seconds * 1e3:.0f} ms")
    d = digest(model, store, args, world)
    if rank == 0:
        print(f"digest {d}", flush=True)
    store.close()
    if world > 1:
        dist.destroy_process_group()
    return 0


def load_trainer_state(store, rank, world, model, optimizer):
    """The restored checkpoint's trainer state (the dense parameters, their optimizer's state
    and the step) into model and optimizer. They are replicated, the same on every rank, so on
    several ranks rank 0's is sent to all: each rank's own copy is in the checkpoint too, but a
    rank that the checkpoint's run did not have (resuming on more processes) has none."""
    if world == 1:
        return et.load_state(store, model=model, optimizer=optimizer)
    raw = [store.restore_attachment("trainer") if rank == 0 else None]
    dist.broadcast_object_list(raw, src=0)
    return et.load_state_bytes(raw[0], model=model, optimizer=optimizer)


def sum_dense_gradients(model):
    """The dense parameters' gradients summed over the ranks (one all-reduce), so that every
    rank's torch optimizer takes the same step."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


if __name__ == "__main__":
    sys.exit(main())
