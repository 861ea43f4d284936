"""The savers compared by bench_peers.py: each builds the same state (keys int64 (R,), values
float32 (R, 64), Adagrad accumulators float32 (R, 64)), saves it until durable, changes 1% of
its rows, saves again, and (in a fresh process) loads a saved checkpoint back into memory.

Every saver's save returns (stall_seconds, total_seconds): stall is how long the caller (the
training thread) is blocked, total is until the checkpoint is durable (files and directories
fsynced; the fsync is done here, inside the timed span, for savers that do not do it).
"""

import os

import numpy as np

from common import fsync_tree, now

DIM = 64
NAMES = ("keys", "values", "accum")


def mix64(x):
    """splitmix64's finalizer on uint64: a bijection, so distinct inputs give distinct keys."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x.view(np.int64)


def make_keys(rows):
    return mix64(np.arange(rows, dtype=np.uint64))


def make_state(rows, seed):
    """The peers' state: distinct random int64 keys, values ~ N(0, 0.01), accumulators in
    [0, 1); generated in place (no temporaries of the arrays' size)."""
    rng = np.random.default_rng(seed)
    keys = make_keys(rows)
    values = np.empty((rows, DIM), np.float32)
    accum = np.empty((rows, DIM), np.float32)
    step = 1 << 18
    for i in range(0, rows, step):
        rng.standard_normal(out=values[i:i + step], dtype=np.float32)
        values[i:i + step] *= np.float32(0.01)
        rng.random(out=accum[i:i + step], dtype=np.float32)
    return keys, values, accum


def touch(arr):
    """Reads one byte of every page of a numpy array (faults in lazily mapped data)."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return int(flat[::4096].sum(dtype=np.uint64)) if flat.size else 0


class Saver:
    name = "?"
    # What the saver writes and how it loads, for the JSON.
    notes = ""
    sync = True  # the caller is blocked for the whole save

    def import_libs(self):
        pass

    def build(self, rows, seed):
        self.keys, self.values, self.accum = make_state(rows, seed)

    def modify(self, idx, delta):
        self.values[idx] += delta
        self.accum[idx] += delta

    def sample(self, idx):
        return {"keys": self.keys[idx].copy(), "values": self.values[idx].copy(),
                "accum": self.accum[idx].copy()}

    def save(self, path):
        """-> (stall_s, total_s, extra dict)"""
        t0 = now()
        self._save(path)
        fsync_tree(path)
        t = now() - t0
        return t, t, {}

    def load(self, path, rows, meta):
        """Loads the checkpoint at path (untimed setup first, then the timed load):
        -> (seconds, sample function idx -> dict of arrays, extra dict)"""
        raise NotImplementedError

    @staticmethod
    def timed_load(read):
        """Times read() (a dict of the three arrays, numpy or CPU tensors) and the touch of every
        page it returns; the load() result for it."""
        t0 = now()
        loaded = read()
        arrs = {n: np.asarray(loaded[n]) for n in NAMES}  # a CPU tensor's memory, not a copy
        for a in arrs.values():
            touch(a)
        t = now() - t0
        return t, lambda idx: {n: arrs[n][idx] for n in NAMES}, {}


# ----------------------------------------------------------------------------------- numpy --

class NumpySaver(Saver):
    name = "numpy"
    notes = "np.save of the three arrays (three .npy files); load: np.load (no mmap)"

    def _save(self, path):
        os.mkdir(path)
        np.save(os.path.join(path, "keys.npy"), self.keys)
        np.save(os.path.join(path, "values.npy"), self.values)
        np.save(os.path.join(path, "accum.npy"), self.accum)

    def load(self, path, rows, meta):
        return self.timed_load(
            lambda: {n: np.load(os.path.join(path, n + ".npy")) for n in NAMES})


# ----------------------------------------------------------------------------------- torch --

class TorchStateSaver(Saver):
    """A saver of torch tensors sharing the numpy arrays' memory."""

    def import_libs(self):
        import torch
        self.torch = torch

    def build(self, rows, seed):
        super().build(rows, seed)
        self.sd = {n: self.torch.from_numpy(a) for n, a in
                   zip(NAMES, (self.keys, self.values, self.accum))}


class SafetensorsSaver(TorchStateSaver):
    name = "safetensors"
    notes = ("safetensors.torch.save_file of the three tensors (one file); load: "
             "safetensors.torch.load_file (its default backend, mmap) then every page read")

    def import_libs(self):
        super().import_libs()
        import safetensors.torch
        self.st = safetensors.torch

    def _save(self, path):
        os.mkdir(path)
        self.st.save_file(self.sd, os.path.join(path, "state.safetensors"))

    def load(self, path, rows, meta):
        return self.timed_load(
            lambda: self.st.load_file(os.path.join(path, "state.safetensors")))


class TorchSaveSaver(TorchStateSaver):
    name = "torch.save"
    notes = "torch.save of one dict of the three tensors; load: torch.load(weights_only=True)"

    def _save(self, path):
        os.mkdir(path)
        self.torch.save(self.sd, os.path.join(path, "state.pt"))

    def load(self, path, rows, meta):
        return self.timed_load(
            lambda: self.torch.load(os.path.join(path, "state.pt"), weights_only=True))


class DcpSaver(TorchStateSaver):
    """torch.distributed.checkpoint, one process. Without a process group where this torch
    allows it (save/load fall back to no_dist when none is initialized), else a gloo group of
    one process."""
    name = "torch DCP"
    notes = ("torch.distributed.checkpoint.save(state_dict, checkpoint_id=dir) (default "
             "FileSystemWriter: one file per rank, sync_files=True); load: "
             "torch.distributed.checkpoint.load into preallocated tensors (torch.empty)")
    mode = None

    def import_libs(self):
        super().import_libs()
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        self.dist = dist
        self.dcp = dcp

    def _gloo(self):
        import socket
        if self.dist.is_initialized():
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        self.dist.init_process_group("gloo", rank=0, world_size=1)

    def _with_fallback(self, fn):
        """fn() without a process group; on a failure that may come from its absence, again in
        a gloo group of one."""
        if self.mode is None:
            try:
                r = fn()
                DcpSaver.mode = "no process group (no_dist)"
                return r
            except Exception as e:  # noqa: BLE001 - any failure: try the group of one
                first = e
            try:
                self._gloo()
            except Exception:
                raise first
            DcpSaver.mode = f"gloo process group of 1 (without one: {first!r})"
        return fn()

    def _save_dcp(self, path):
        return self.dcp.save(self.sd, checkpoint_id=path)

    def save(self, path):
        t0 = now()
        self._with_fallback(lambda: self._save_dcp(path))
        fsync_tree(path)
        t = now() - t0
        return t, t, {"dcp_mode": self.mode}

    def load(self, path, rows, meta):
        torch = self.torch
        sd = {"keys": torch.empty(rows, dtype=torch.int64),
              "values": torch.empty(rows, DIM, dtype=torch.float32),
              "accum": torch.empty(rows, DIM, dtype=torch.float32)}
        t0 = now()
        self._with_fallback(lambda: self.dcp.load(sd, checkpoint_id=path))
        t = now() - t0
        arrs = {n: sd[n].numpy() for n in NAMES}
        return t, lambda idx: {n: arrs[n][idx] for n in NAMES}, {"dcp_mode": self.mode}


class DcpAsyncSaver(DcpSaver):
    name = "DCP async_save"
    notes = ("torch.distributed.checkpoint.async_save (thread executor, default stager: a "
             "blocking copy of the state into CPU memory, then the write in a thread); stall: "
             "until async_save returns; total: until its future completes, then fsync")
    sync = False

    def save(self, path):
        holder = {}

        def start():
            t0 = now()
            fut = self.dcp.async_save(self.sd, checkpoint_id=path)
            holder["stall"] = now() - t0
            holder["t0"] = t0
            # torch >= 2.9 returns AsyncSaveResponse when staging itself is asynchronous.
            upload = getattr(fut, "upload_completion", fut)
            upload.result()
        self._with_fallback(start)
        fsync_tree(path)
        total = now() - holder["t0"]
        return holder["stall"], total, {"dcp_mode": self.mode}


# ----------------------------------------------------------------------------------- orbax --

class OrbaxSaver(Saver):
    name = "Orbax"
    notes = ("orbax.checkpoint.StandardCheckpointer (an AsyncCheckpointer of a "
             "StandardCheckpointHandler with its defaults: OCDBT + zarr3 via TensorStore, zstd "
             "compression on) saving a "
             "dict of three jax arrays on the CPU (jax_enable_x64 for the int64 keys); stall: "
             "until save() returns; total: until wait_until_finished(), then fsync; load: "
             "restore() with ShapeDtypeStruct targets on the CPU device, block_until_ready")
    sync = False

    def import_libs(self):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        import orbax.checkpoint as ocp
        self.jax, self.jnp, self.ocp = jax, jnp, ocp

    def build(self, rows, seed):
        keys, values, accum = make_state(rows, seed)
        dev = self.jax.devices("cpu")[0]
        self.state = {}
        for n, a in zip(NAMES, (keys, values, accum)):
            self.state[n] = self.jax.device_put(a, dev).block_until_ready()
        del keys, values, accum
        self.ckptr = self.ocp.StandardCheckpointer()

    def modify(self, idx, delta):
        idx = self.jnp.asarray(idx)
        self.state = {
            "keys": self.state["keys"],
            "values": self.state["values"].at[idx].add(delta).block_until_ready(),
            "accum": self.state["accum"].at[idx].add(delta).block_until_ready(),
        }

    def sample(self, idx):
        return {n: np.asarray(self.state[n][np.asarray(idx)]) for n in NAMES}

    def save(self, path):
        t0 = now()
        self.ckptr.save(os.path.abspath(path), self.state)
        stall = now() - t0
        self.ckptr.wait_until_finished()
        fsync_tree(path)
        total = now() - t0
        return stall, total, {"orbax_version": self.ocp.__version__}

    def load(self, path, rows, meta):
        jax = self.jax
        dev = jax.devices("cpu")[0]
        sharding = jax.sharding.SingleDeviceSharding(dev)
        target = {"keys": jax.ShapeDtypeStruct((rows,), np.int64, sharding=sharding),
                  "values": jax.ShapeDtypeStruct((rows, DIM), np.float32, sharding=sharding),
                  "accum": jax.ShapeDtypeStruct((rows, DIM), np.float32, sharding=sharding)}
        ckptr = self.ocp.StandardCheckpointer()
        t0 = now()
        state = ckptr.restore(os.path.abspath(path), target)
        for a in state.values():
            a.block_until_ready()
        t = now() - t0
        ckptr.close()
        return t, lambda idx: {n: np.asarray(state[n][np.asarray(idx)]) for n in NAMES}, {}

    def close(self):
        self.ckptr.close()


# -------------------------------------------------------------------------------- embstore --

class EmbstoreSaver(Saver):
    name = "embstore"
    notes = ("embstore host store (host_threads=0), one Adagrad table of R rows x 64 filled by "
             "lookup(insert=True) in batches and one apply_gradients pass; full: "
             "checkpoint(dir, 'full') then wait(); delta: apply_gradients on 1% of the keys, "
             "checkpoint(dir, 'incremental') then wait(); stall: the time checkpoint() blocks "
             "plus checkpoint_info().stall_seconds; load: a new Store's restore(dir, version of "
             "the full) (verified by the library)")
    sync = False
    BATCH = 1 << 16

    def import_libs(self):
        import embstore
        self.embstore = embstore

    def build(self, rows, seed):
        rng = np.random.default_rng(seed)
        self.rows = rows
        self.keys = make_keys(rows)
        self.store = self.embstore.Store("host", host_threads=0)
        self.table = self.store.create_table("emb", DIM, optimizer="adagrad", learning_rate=0.01,
                                             initial_capacity=rows)
        grads = np.empty((self.BATCH, DIM), np.float32)
        for i in range(0, rows, self.BATCH):
            k = self.keys[i:i + self.BATCH]
            self.table.lookup(k, insert=True)
        for i in range(0, rows, self.BATCH):
            k = self.keys[i:i + self.BATCH]
            g = grads[:len(k)]
            rng.standard_normal(out=g, dtype=np.float32)
            self.table.apply_gradients(k, g)
        self.step = 1
        self.store.step(self.step)
        self.version_full = None
        self.dir = None

    def modify(self, idx, delta):
        k = self.keys[np.sort(idx)]
        g = np.full((self.BATCH, DIM), -delta * 100, np.float32)
        for i in range(0, len(k), self.BATCH):
            kb = k[i:i + self.BATCH]
            self.table.apply_gradients(kb, g[:len(kb)])
        self.step += 1
        self.store.step(self.step)

    def sample(self, idx):
        return {"keys": self.keys[idx].copy(),
                "values": np.array(self.table.lookup(self.keys[idx]))}

    def save_kind(self, ckpt_dir, kind):
        t0 = now()
        v = self.store.checkpoint(ckpt_dir, kind)
        blocked = now() - t0
        self.store.wait(v)
        total = now() - t0
        info = self.store.checkpoint_info(v)
        extra = {"version": v, "kind": info.kind, "capture_seconds": info.capture_seconds,
                 "write_seconds": info.write_seconds, "stall_seconds": info.stall_seconds,
                 "checkpoint_call_seconds": blocked, "rows_written": info.rows_written,
                 "bytes_written": info.bytes_written,
                 "copy_on_write_rows": info.copy_on_write_rows}
        return blocked + info.stall_seconds, total, extra

    def load(self, path, rows, meta):
        version = meta.get("version", self.embstore.LATEST)
        store = self.embstore.Store("host", host_threads=0)
        t0 = now()
        got = store.restore(path, version)
        t = now() - t0
        table = store.table("emb")

        def sample(idx):
            keys = meta["sample_keys"]  # the keys of rows idx, from the saving process
            return {"keys": keys, "values": np.array(table.lookup(keys))}
        self._restored = store
        return t, sample, {"version_restored": got, "rows": len(table)}


SAVERS = {cls.name: cls for cls in (NumpySaver, SafetensorsSaver, TorchSaveSaver, DcpSaver,
                                    DcpAsyncSaver, OrbaxSaver, EmbstoreSaver)}
ORDER = list(SAVERS)
