"""The training-step comparison of bench_peers.py: a small DLRM-like model on the CPU whose
sparse features live either in embstore.torch.EmbeddingBag tables (embstore's fused Adagrad,
applied during backward) or in nn.EmbeddingBag(sparse=True) tables updated by
torch.optim.Adagrad. The dense part (bottom MLP on 13 dense features, top MLP on the dense
output and the pooled embeddings) is the same and is trained by torch.optim.Adagrad in both.
"""

import os

import numpy as np

from common import now

FEATURES = 4
BAG = 8
DENSE = 13
DIM = 64
LR = 0.01
EPS = 1e-10  # torch.optim.Adagrad's default, given to embstore's tables too


def zipf_ids(rng, rows, n, s=1.05):
    """n ids in [0, rows) with P(rank k) ~ 1/(k+1)^s, ranks scattered over the rows by a fixed
    permutation (the hot rows are not contiguous)."""
    w = 1.0 / np.power(np.arange(1, rows + 1, dtype=np.float64), s)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n))
    perm = rng.permutation(rows)
    return perm[np.minimum(ranks, rows - 1)].astype(np.int64)


def make_batches(rows, batch, count, seed):
    rng = np.random.default_rng(seed)
    ids = [zipf_ids(rng, rows, count * batch * BAG).reshape(count, batch, BAG)
           for _ in range(FEATURES)]
    dense = rng.standard_normal((count, batch, DENSE), dtype=np.float32)
    labels = (rng.random((count, batch, 1)) < 0.25).astype(np.float32)
    return ids, dense, labels


def run(variant, rows, batch, steps, warmup, seed, threads):
    import torch
    from torch import nn
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    count = warmup + steps  # a batch of its own for every step: new ids keep coming
    ids, dense, labels = make_batches(rows, batch, count, seed)
    ids = [torch.from_numpy(x) for x in ids]
    dense = torch.from_numpy(dense)
    labels = torch.from_numpy(labels)

    bottom = nn.Sequential(nn.Linear(DENSE, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                           nn.Linear(256, DIM), nn.ReLU())
    top = nn.Sequential(nn.Linear(DIM * (FEATURES + 1), 512), nn.ReLU(), nn.Linear(512, 256),
                        nn.ReLU(), nn.Linear(256, 1))
    dense_params = list(bottom.parameters()) + list(top.parameters())
    dense_opt = torch.optim.Adagrad(dense_params, lr=LR, eps=EPS)
    store = None
    if variant == "embstore":
        import embstore
        import embstore.torch as et
        store = embstore.Store("host", host_threads=0)
        bags = nn.ModuleList([
            et.EmbeddingBag(store, f"f{i}", DIM, mode="sum", optimizer="adagrad",
                            learning_rate=LR, epsilon=EPS, initial_capacity=rows)
            for i in range(FEATURES)])
        sparse_opt = None
    else:
        bags = nn.ModuleList([nn.EmbeddingBag(rows, DIM, mode="sum", sparse=True)
                              for _ in range(FEATURES)])
        sparse_opt = torch.optim.Adagrad(bags.parameters(), lr=LR, eps=EPS)
    loss_fn = nn.BCEWithLogitsLoss()

    def step(s):
        j = s % count
        dense_opt.zero_grad(set_to_none=True)
        if sparse_opt is not None:
            sparse_opt.zero_grad(set_to_none=True)
        x = bottom(dense[j])
        pooled = [bag(ids[f][j]) for f, bag in enumerate(bags)]
        logits = top(torch.cat([x] + pooled, dim=1))
        loss = loss_fn(logits, labels[j])
        loss.backward()
        dense_opt.step()
        if sparse_opt is not None:
            sparse_opt.step()
        if store is not None:
            store.step(s + 1)
        return loss

    for s in range(warmup):
        step(s)
    times = []
    t_all = now()
    for s in range(warmup, warmup + steps):
        t0 = now()
        loss = step(s)
        times.append(now() - t0)
    total = now() - t_all
    out = {"variant": variant, "steps": steps, "warmup": warmup, "batch": batch,
           "table_rows": rows, "features": FEATURES, "bag": BAG, "threads": threads,
           "seconds": total, "steps_per_s": steps / total,
           "step_ms_median": float(np.median(times)) * 1e3,
           "final_loss": float(loss.detach())}
    if store is not None:
        out["rows_inserted"] = sum(len(b.table) for b in bags)
        store.close()
    return out
