#!/usr/bin/env python3
"""The embedding training step, alone, on a device: embstore.torch.Embedding (a lookup with
insert in forward, the fused Adagrad during backward) against nn.Embedding(rows, dim,
sparse=True) + torch.optim.Adagrad and, where fbgemm_gpu is installed, FBGEMM's table-batched
embedding with its fused exact Adagrad (TBE, as TorchRec runs it), on the same ids; then the
Python door's cost per call (embstore's Python checks, ctypes, autograd) at a batch so small
that the work itself is negligible.

    embedding_step.py [--device cuda|cpu] [--rows N] [--dim D] [--batch B] [--zipf S]
                      [--steps N] [--warmup N] [--repeat N] [--calls N] [--out FILE]

A step is: out = emb(ids); loss = (out * w).sum() (w fixed, so every id's gradient is its row
of w); loss.backward(); then the torch optimizer's step (nn.Embedding) or store.step (embstore,
whose update ran in backward). The ids are Zipf(S) ranks over the rows, scattered by a fixed
permutation, drawn before anything is timed and already on the device; every variant sees the
same ones. Each variant's steps/s is timed over --steps steps after --warmup, synchronized at
the end; --repeat runs every variant that many times, in alternating order, and the medians
are reported. embstore's rows start as torch's do (normal(0, 1), torch's nn.Embedding init),
Adagrad's lr and eps are the same everywhere, the accumulators start at 0.

The door: per call, the mean over --calls calls of Table.lookup(insert=True) and
Table.apply_gradients of 8 keys, the module's forward + backward on 8 ids, the same lookup
made through ctypes alone (the floor: the library call and ctypes' own cost), and
nn.Embedding's forward + backward + Adagrad step on 8 ids; on CUDA each call ends with a
stream synchronization, so it is the latency a step with small tables pays per table.

Writes one JSON object (stdout, or --out): every figure, the device and the package versions.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

LR = 0.01
EPS = 1e-10  # torch.optim.Adagrad's default


def zipf_ids(rng, rows, n, s):
    """n ids in [0, rows): P(rank k) ~ 1/k^s, ranks scattered over the rows by a permutation."""
    w = 1.0 / np.power(np.arange(1, rows + 1, dtype=np.float64), s)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n)), rows - 1)
    return rng.permutation(rows)[ranks].astype(np.int64)


def sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_torch(rows, dim, device):
    import torch
    from torch import nn
    emb = nn.Embedding(rows, dim, sparse=True, device=device)
    opt = torch.optim.Adagrad(emb.parameters(), lr=LR, eps=EPS)
    return emb, opt.step, lambda: opt.zero_grad(set_to_none=True), None


def make_embstore(rows, dim, device):
    import embstore
    import embstore.torch as et
    store = embstore.Store("cuda" if device.type == "cuda" else "host",
                           **({"device": device.index or 0} if device.type == "cuda" else {}))
    emb = et.Embedding(store, "t", dim, optimizer="adagrad", learning_rate=LR, epsilon=EPS,
                       initial_accumulator=0.0, init="normal", init_a=0.0, init_b=1.0,
                       initial_capacity=rows)
    state = {"step": 0}

    def step():
        state["step"] += 1
        store.step(state["step"])
    return emb, step, lambda: None, store


def make_fbgemm(rows, dim, device):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (EmbeddingLocation,
                                                                       PoolingMode)
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        SplitTableBatchedEmbeddingBagsCodegen)
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import ComputeDevice
    except ImportError:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice
    import torch
    cuda = device.type == "cuda"
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST,
          ComputeDevice.CUDA if cuda else ComputeDevice.CPU)],
        optimizer=OptimType.EXACT_ADAGRAD, learning_rate=LR, eps=EPS,
        pooling_mode=PoolingMode.NONE, device=device)

    class Tbe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tbe = tbe

        def forward(self, ids):
            offsets = torch.arange(ids.numel() + 1, device=ids.device, dtype=ids.dtype)
            return self.tbe(ids, offsets)
    return Tbe(), lambda: None, lambda: None, None


VARIANTS = {"torch": make_torch, "embstore": make_embstore, "fbgemm": make_fbgemm}


def available(name):
    if name != "fbgemm":
        return True
    try:
        import fbgemm_gpu  # noqa: F401
        return True
    except ImportError:
        return False


def time_steps(name, a, ids, w, device):
    """Steps/s of one variant over ids[warmup:]; a fresh table each time."""
    import torch
    emb, opt_step, zero_grad, store = VARIANTS[name](a.rows, a.dim, device)

    def step(batch):
        zero_grad()
        out = emb(batch)
        (out * w).sum().backward()
        opt_step()

    try:
        for s in range(a.warmup):
            step(ids[s])
        sync(device)
        t0 = time.perf_counter()
        for s in range(a.warmup, a.warmup + a.steps):
            step(ids[s])
        sync(device)
        seconds = time.perf_counter() - t0
    finally:
        if store is not None:
            store.close()
        del emb
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return a.steps / seconds


def door(a, device):
    """The Python door's cost per call, at 8 keys: see the module's docstring."""
    import ctypes

    import torch
    from torch import nn

    import embstore
    import embstore.torch as et
    from embstore import _lib

    cuda = device.type == "cuda"
    store = embstore.Store("cuda" if cuda else "host",
                           **({"device": device.index or 0} if cuda else {}))
    out = {}
    try:
        table = store.create_table("door", a.dim, optimizer="adagrad", learning_rate=LR)
        keys = torch.arange(8, dtype=torch.int64, device=device)
        grads = torch.full((8, a.dim), 1e-3, device=device)
        rows = torch.empty((8, a.dim), device=device)

        def per_call(fn):
            fn()
            sync(device)
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn()
                sync(device)
            return (time.perf_counter() - t0) / a.calls

        out["lookup_seconds"] = per_call(lambda: table.lookup(keys, insert=True, out=rows))
        out["apply_gradients_seconds"] = per_call(lambda: table.apply_gradients(keys, grads))
        stream = torch.cuda.current_stream(device).cuda_stream if cuda else None
        k_ptr, r_ptr = ctypes.c_void_p(keys.data_ptr()), ctypes.c_void_p(rows.data_ptr())
        handle = table._handle

        def raw_lookup():
            if _lib.lookup(handle, k_ptr, 8, r_ptr, 1, stream) != 0:
                raise RuntimeError("embstore_lookup failed")
        out["ctypes_lookup_seconds"] = per_call(raw_lookup)

        emb = et.Embedding(store, "door_module", a.dim, optimizer="adagrad", learning_rate=LR)
        w = torch.ones((8, a.dim), device=device)
        out["module_forward_backward_seconds"] = per_call(
            lambda: (emb(keys) * w).sum().backward())
        ref = nn.Embedding(1024, a.dim, sparse=True, device=device)
        opt = torch.optim.Adagrad(ref.parameters(), lr=LR, eps=EPS)

        def torch_step():
            opt.zero_grad(set_to_none=True)
            (ref(keys) * w).sum().backward()
            opt.step()
        out["torch_forward_backward_step_seconds"] = per_call(torch_step)
    finally:
        store.close()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where usable)")
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--variants", default="torch,embstore,fbgemm")
    p.add_argument("--no-door", action="store_true")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    for name in ("rows", "dim", "batch", "steps", "repeat", "calls"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if a.warmup < 0 or not a.zipf > 0:
        p.error("--warmup must be >= 0 and --zipf > 0")

    import torch
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rng = np.random.default_rng(a.seed)
    ids_np = zipf_ids(rng, a.rows, (a.warmup + a.steps) * a.batch, a.zipf)
    ids = torch.from_numpy(ids_np).view(a.warmup + a.steps, a.batch).to(device)
    w = torch.from_numpy(rng.standard_normal((a.batch, a.dim), dtype=np.float32)).to(device)
    first = ids_np[a.warmup * a.batch:(a.warmup + 1) * a.batch]
    _, counts = np.unique(first, return_counts=True)

    result = {"device": str(device), "rows": a.rows, "dim": a.dim, "batch": a.batch,
              "zipf": a.zipf, "steps": a.steps, "warmup": a.warmup, "repeat": a.repeat,
              "distinct_ids_first_batch": int(counts.size),
              "hottest_id_count_first_batch": int(counts.max()),
              "python": platform.python_version(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    names = [v for v in a.variants.split(",") if v]
    for v in names:
        if v not in VARIANTS:
            p.error(f"--variants: unknown {v!r}")
    skipped = [v for v in names if not available(v)]
    names = [v for v in names if v not in skipped]
    result["variants_not_installed"] = skipped
    rates = {v: [] for v in names}
    for r in range(a.repeat):
        for v in (names if r % 2 == 0 else names[::-1]):
            rates[v].append(time_steps(v, a, ids, w, device))
            print(f"  {v}: {rates[v][-1]:.1f} steps/s", file=sys.stderr, flush=True)
    for v in names:
        result[f"{v}_steps_per_second"] = statistics.median(rates[v])
        result[f"{v}_steps_per_second_runs"] = rates[v]
    if "torch" in rates:
        for v in names:
            if v != "torch":
                result[f"{v}_vs_torch"] = (result[f"{v}_steps_per_second"] /
                                           result["torch_steps_per_second"])
    if not a.no_door:
        result["door"] = door(a, device)
    text = json.dumps(result, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
