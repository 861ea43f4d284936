"""The README's Python example, whole: a table trained for a few steps with checkpoints (a full
one, then deltas of the rows changed since), restored into a new store and compared.
    python examples/python/quickstart.py [DIR]      (default: a temporary directory)
Needs the package (pip install .) or, from a build tree, PYTHONPATH=python and
EMBSTORE_LIBRARY=build/libembstore.so. Exits 77 (skipped) where numpy is missing, 0 when the
restored rows equal the trained ones. tests/python/test_examples.py runs it.
"""
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipped", file=sys.stderr)
    sys.exit(77)
import embstore

tmp = None if len(sys.argv) > 1 else tempfile.TemporaryDirectory(prefix="embstore-quickstart-")
ckpt = sys.argv[1] if tmp is None else tmp.name  # a temporary one is removed at exit

# --- the README's example starts here ---
with embstore.Store("host") as store:                # "auto": CUDA where usable
    items = store.create_table("items", 8, optimizer="adagrad", learning_rate=0.05)
    for step in range(1, 4):
        store.step(step)
        keys = np.arange(1000) if step == 1 else np.array([3, 17, 3, 42])   # int64 ids
        rows = items.lookup(keys, insert=True)        # (n, 8) float32; new keys get a row
        items.apply_gradients(keys, np.full_like(rows, 0.5))  # duplicates summed, fused Adagrad
        store.attach("reader", f"offset={step}".encode())     # your own state, saved with it
        v = store.checkpoint(ckpt, "full" if step == 1 else "incremental", wait=True)
        print(store.checkpoint_info(v).kind, store.checkpoint_info(v).rows_written)
    trained = items.lookup(np.arange(1000))

with embstore.Store("host") as store:                # after a restart
    version = store.restore(ckpt)                     # the newest version, its chain applied
    print(version, store.restore_attachment("reader"))         # 3 b'offset=3'
    assert np.array_equal(store["items"].lookup(np.arange(1000)), trained)
# --- and ends here ---
print(f"restored version {version}: rows equal the trained ones")
