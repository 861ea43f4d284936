#!/usr/bin/env python3
"""What embstore's calls leave on the trainer's thread: the time of a loop of Python floats
(math.exp, math.log: code built for the x86-64 baseline, SSE) before any checkpoint, after a
full one and after a delta, on the thread that made the calls. A library that returns with the
vector registers' upper halves in use (libxxhash 0.8.1's AVX-512 XXH3 did, until io/format/xxh3
cleared them) makes the later ones slower; the same times in every column are what it should
show. Each is the median of --repeat loops.

    EMBSTORE_LIBRARY=build/libembstore.so PYTHONPATH=python python3 perf/caller_state.py
"""

import argparse
import math
import statistics
import tempfile
import time

import numpy as np

import embstore


def python_floats(n):
    start = time.perf_counter()
    acc = 0.0
    for i in range(1, n):
        acc += math.exp(-1.1 * math.log(i + 0.5)) * (i * 1e-6 + 0.5)
    return (time.perf_counter() - start) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="checkpoint directory's parent (default: a temp)")
    ap.add_argument("--loop", type=int, default=300000, help="iterations of the float loop")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()

    def timed():
        return statistics.median(python_floats(a.loop) for _ in range(a.repeat))

    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        store = embstore.Store("host")
        table = store.create_table("emb", 64)
        keys = np.arange(1, 5001, dtype=np.int64)
        grads = np.ones((keys.size, 64), dtype=np.float32)

        def train(step):
            table.lookup(keys, insert=True)
            table.apply_gradients(keys, grads)
            store.step(step)

        train(1)
        before = timed()
        store.checkpoint(d, "full", wait=True)
        after_full = timed()
        train(2)
        store.checkpoint(d, "incremental", wait=True)
        after_delta = timed()
        print(f"python floats ({a.loop} iterations, median of {a.repeat}): "
              f"before any checkpoint {before:.1f} ms, after a full {after_full:.1f} ms, "
              f"after a delta {after_delta:.1f} ms ({after_delta / before:.2f}x)")


if __name__ == "__main__":
    main()
