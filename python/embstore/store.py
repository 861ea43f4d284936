"""Store and Table: the C API's store, tables, data path and checkpoints, one to one."""

import ctypes
import dataclasses
import os
import weakref

from . import _arrays, _lib
from ._handle import Handle, Owner
from .comm import _Callbacks
from .errors import Error, InvalidArgumentError, check, error_for

LATEST = 2**64 - 1  # EMBSTORE_LATEST

_BACKENDS = {"auto": 0, "host": 1, "cuda": 2}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}
_SPILL = {"auto": 0, "never": 1, "always": 2}
_OPTIMIZERS = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 2, "adam": 3}
_INITS = {"zeros": 0, "constant": 1, "uniform": 2, "normal": 3}
_CODECS = {"none": 0, "lossless": 1, "bf16": 2, "int8": 3}
_KINDS = {"full": 1, "incremental": 2}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
LOOKUP_INSERT = 1
_COMM_ERROR = 12  # EMBSTORE_COMM_ERROR


def _choice(table, value, what):
    try:
        return table[str(value).lower()]
    except KeyError:
        raise InvalidArgumentError(1, f"unknown {what} {value!r} (one of "
                                   f"{', '.join(sorted(table))})") from None


def _path_bytes(path, what):
    if path is None:
        raise InvalidArgumentError(1, f"{what} is None")
    b = os.fsencode(path)
    if not b or b"\0" in b:
        raise InvalidArgumentError(1, f"{what} is empty or holds a NUL byte")
    return b


def _name_bytes(name, what="name"):
    if not isinstance(name, str):
        raise TypeError(f"{what}: a str is expected, got {type(name).__name__}")
    b = name.encode()
    if b"\0" in b:
        raise InvalidArgumentError(1, f"{what} holds a NUL byte")
    return b


def _struct_dict(s, skip=("struct_size",)):
    return {name: getattr(s, name) for name, _ in s._fields_ if name not in skip}


@dataclasses.dataclass(frozen=True)
class TableStats:
    """A table's counters (Table.stats; embstore_table_stats_t): live rows, rows allocated,
    rows dirty since the last capture, rows ever inserted and evicted, keys pending admission,
    gradient keys that had no row, rows that training lookups inserted; and its tiers: live
    rows in device memory, in host memory and on disk, rows ever moved up and down, and the
    bytes read from and written to the SSD tier's file."""

    rows: int
    capacity: int
    dirty_rows: int
    inserted: int
    evicted: int
    pending_admission: int
    skipped_keys: int
    admitted: int
    rows_in_device: int
    rows_in_memory: int
    rows_on_disk: int
    rows_moved_up: int
    rows_moved_down: int
    tier_bytes_read: int
    tier_bytes_written: int


@dataclasses.dataclass(frozen=True)
class CheckpointStats:
    """A store's checkpoint counters (Store.checkpoint_stats; embstore_checkpoint_stats_t,
    whose comments in embstore.h say what each field counts). Times are in seconds."""

    committed: int
    failed: int
    last_version: int  # LATEST when none
    in_flight: int
    rows_written: int
    bytes_written: int
    copy_on_write_rows: int
    stall_seconds_total: float
    stall_seconds_max: float
    capture_seconds_last: float
    deltas_committed: int
    deferred: int
    serving_published: int
    serving_skipped: int


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint as its store saw it (Store.checkpoint_info; embstore_checkpoint_info_t):
    what was written and what training paid for it. Times are in seconds."""

    status: str  # "EMBSTORE_OK" while in flight and once committed, else its failure
    in_flight: bool
    kind: str  # "full" or "incremental", as written
    from_policy: bool
    version: int
    parent: int  # LATEST for a full checkpoint
    rows_captured: int
    rows_written: int
    bytes_written: int
    capture_seconds: float
    write_seconds: float
    stall_seconds: float
    copy_on_write_rows: int


@dataclasses.dataclass
class WarmStartSource:
    """One source of Store.warm_start: tables of `dir` (at `version`, LATEST: the newest) whose
    whole names match the regex `tables` (RE2 syntax: no backreferences or lookaround; at most
    1024 bytes); values_only: no optimizer state."""
    dir: str
    tables: str = ".*"
    version: int = LATEST
    values_only: bool = False


class Store(Owner):
    """A store of embedding tables (embstore_store_t). Close it (or use it as a context
    manager): closing waits for checkpoints in flight and raises the failure of one nobody was
    told of.

    Store(backend="auto"|"host"|"cuda", device=0, host_threads=0, staging_bytes=None,
          io_queue_depth=None, restore_spill="auto", spill_dir=None, comm=None, tier_dir=None)

    tier_dir: a directory on a disk (not tmpfs) for the SSD tier of tables created with
    memory_rows (see docs/tiers.md).

    comm: a Communicator (embstore.comm; embstore.torch.ProcessGroup for a torch.distributed
    group) makes a sharded store of comm.world_size ranks, created by every rank together: each
    holds the shard of every table that embstore.shard_of assigns to its rank. Its collective
    calls (Table.sharded_lookup and sharded_apply_gradients, checkpoint, wait, step, restore,
    warm_start, close) must be made by every rank in the same order; a checkpoint of any world
    size restores into a store of any other. Host backend only in Python: a sharded CUDA store
    needs an NCCL communicator (nccl_comm), which the package does not take yet.
    """

    def __init__(self, backend="auto", *, device=0, host_threads=0, staging_bytes=None,
                 io_queue_depth=None, restore_spill="auto", spill_dir=None, comm=None,
                 tier_dir=None):
        cfg = _lib.StoreConfig()
        _lib.store_config_init(ctypes.byref(cfg))
        callbacks = None
        if comm is not None:
            _check_communicator(comm)
            cfg.rank = _int_arg(comm.rank, "comm.rank", minimum=0, maximum=2**31 - 1)
            cfg.world_size = _int_arg(comm.world_size, "comm.world_size", minimum=1,
                                      maximum=2**31 - 1)
            callbacks = _Callbacks(comm, cfg.world_size)
            cfg.comm_callbacks = ctypes.addressof(callbacks.struct)  # copied at create
        cfg.backend = _choice(_BACKENDS, backend, "backend")
        cfg.device = _int_arg(device, "device")
        cfg.host_threads = _int_arg(host_threads, "host_threads")
        if staging_bytes is not None:
            cfg.staging_bytes = _int_arg(staging_bytes, "staging_bytes", minimum=0)
        if io_queue_depth is not None:
            cfg.io_queue_depth = _int_arg(io_queue_depth, "io_queue_depth")
        cfg.restore_spill = _choice(_SPILL, restore_spill, "restore_spill")
        # The library copies the path at create.
        cfg.spill_dir = _path_bytes(spill_dir, "spill_dir") if spill_dir is not None else None
        cfg.tier_dir = _path_bytes(tier_dir, "tier_dir") if tier_dir is not None else None
        handle = ctypes.c_void_p()
        self._callbacks = callbacks
        self._absorbed_failure = None
        check(self._checked(_lib.store_create(ctypes.byref(cfg), ctypes.byref(handle)),
                            _lib.store_create), "embstore_store_create")
        self._handle = Handle(handle.value, _lib.store_destroy, "store", keep=callbacks,
                              collective=_checkpoint_in_flight if cfg.world_size > 1 else None)
        # Weak: a table refers to its store, and a cycle would leave an unreferenced store to the
        # cyclic garbage collector (whenever it runs) instead of freeing it at once.
        self._tables = weakref.WeakValueDictionary()
        with self._handle.use() as h:
            self.backend = _BACKEND_NAMES[_lib.store_backend(h)]
        self.device = device
        self.rank = cfg.rank
        self.world_size = cfg.world_size

    def _call(self, fn, *args):
        """fn(store handle, *args) while the store cannot be closed under it."""
        with self._handle.use() as h:
            return self._checked(fn(h, *args), fn)

    def _checked(self, result, fn):
        """result as it is, except that a call failed by the communicator raises here: its
        CommError from the communicator's exception, or that exception itself where it was not
        an error (KeyboardInterrupt, SystemExit) once the call has returned."""
        failure = self._callbacks.take_failure() if self._callbacks is not None else None
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # whatever the call returned
        if result == 0:
            if failure is not None:
                # The library absorbed it: a checkpoint's collective commit failed inside a call
                # that succeeded (step), and the checkpoint reports COMM_ERROR later (wait).
                self._absorbed_failure = failure
            return result
        failure = failure or (self._absorbed_failure if result == _COMM_ERROR else None)
        if failure is not None:
            if failure is self._absorbed_failure:
                self._absorbed_failure = None
            raise error_for(result, fn.__name__) from failure
        return result

    def close(self):
        """Refuses new calls, waits for calls in flight on other threads and for checkpoints in
        flight, then frees the store (raising the failure of a checkpoint nobody was told of).
        Idempotent. On a sharded store it is collective while a checkpoint is in flight: close
        sharded stores explicitly, on every rank (garbage collection does not, see Handle)."""
        try:
            super().close()
        except Error as e:
            failure = self._callbacks.take_failure() if self._callbacks is not None else None
            failure = failure or self._absorbed_failure
            if failure is None:
                raise
            if not isinstance(failure, Exception):
                raise failure from e
            raise e from failure

    # close() (from Owner) also waits for checkpoints in flight, and raises the failure of one
    # nobody was told of (the store is freed all the same).
    _destroy_call = "embstore_store_destroy"

    # -- tables --
    def create_table(self, name, dim, *, optimizer="adagrad", learning_rate=0.01, epsilon=1e-8,
                     beta1=0.9, beta2=0.999, weight_decay=0.0, initial_accumulator=0.0,
                     init="uniform", init_a=-0.01, init_b=0.01, seed=0, initial_capacity=1024,
                     max_capacity=0, admit_after=0, evict_idle_steps=0, evict_idle_seconds=0.0,
                     evict_when_full=False, admit_bloom_bytes=0, device_rows=0, memory_rows=0,
                     value_codec="none", state_codec="none", serving_codec="none"):
        """Creates a table (embstore_table_create); the defaults are the C API's. memory_rows:
        rows kept in host memory (on CUDA, below device_rows), the rest in the store's tier_dir
        (0: every row in memory).
        value_codec, state_codec: how checkpoints store the values and the optimizer state,
        "none", "lossless", "bf16" or "int8" (values only): docs/checkpoints.md, "Codecs".
        serving_codec: the values in values-only deltas for followers (set_policy's
        serving_deltas): docs/serving.md, "Values-only deltas"."""
        cfg = _lib.TableConfig()
        _lib.table_config_init(ctypes.byref(cfg))
        name_b = _name_bytes(name)
        cfg.name = name_b
        cfg.dim = _int_arg(dim, "dim", minimum=0, maximum=2**32 - 1)
        cfg.initial_capacity = _int_arg(initial_capacity, "initial_capacity", minimum=0)
        cfg.max_capacity = _int_arg(max_capacity, "max_capacity", minimum=0)
        cfg.optimizer = _choice(_OPTIMIZERS, optimizer, "optimizer")
        cfg.learning_rate = float(learning_rate)
        cfg.epsilon = float(epsilon)
        cfg.beta1 = float(beta1)
        cfg.beta2 = float(beta2)
        cfg.weight_decay = float(weight_decay)
        cfg.initial_accumulator = float(initial_accumulator)
        cfg.init = _choice(_INITS, init, "init")
        cfg.init_a = float(init_a)
        cfg.init_b = float(init_b)
        cfg.seed = _int_arg(seed, "seed", minimum=0)
        cfg.admit_after = _int_arg(admit_after, "admit_after", minimum=0, maximum=2**32 - 1)
        cfg.evict_idle_steps = _int_arg(evict_idle_steps, "evict_idle_steps", minimum=0)
        cfg.evict_idle_seconds = float(evict_idle_seconds)
        cfg.evict_when_full = 1 if evict_when_full else 0
        cfg.admit_bloom_bytes = _int_arg(admit_bloom_bytes, "admit_bloom_bytes", minimum=0)
        cfg.device_rows = _int_arg(device_rows, "device_rows", minimum=0)
        cfg.memory_rows = _int_arg(memory_rows, "memory_rows", minimum=0)
        cfg.value_codec = _choice(_CODECS, value_codec, "value_codec")
        cfg.state_codec = _choice(_CODECS, state_codec, "state_codec")
        cfg.serving_codec = _choice(_CODECS, serving_codec, "serving_codec")
        handle = ctypes.c_void_p()
        check(self._call(_lib.table_create, ctypes.byref(cfg), ctypes.byref(handle)),
              "embstore_table_create")
        return self._table(name, handle.value)

    def table(self, name):
        """The table of that name (NotFoundError if none): also those a restore created."""
        handle = ctypes.c_void_p()
        check(self._call(_lib.table_get, _name_bytes(name), ctypes.byref(handle)),
              "embstore_table_get")
        return self._table(name, handle.value)

    def __getitem__(self, name):
        return self.table(name)

    def _table(self, name, handle):
        t = self._tables.get(name)
        if t is None or t._handle != handle:
            t = Table(self, name, handle)
            self._tables[name] = t
        return t

    # -- steps and checkpoints --
    def step(self, global_step):
        """A step boundary (embstore_step): raises once the failure of a policy checkpoint."""
        check(self._call(_lib.step, _int_arg(global_step, "global_step", minimum=0)),
              "embstore_step")

    def checkpoint(self, dir, kind="full", *, wait=False):
        """Captures every table and writes the checkpoint in the background; returns its
        version. kind: "full" or "incremental". wait=True: also waits for it to commit."""
        v = ctypes.c_uint64()
        check(self._call(_lib.checkpoint, _path_bytes(dir, "dir"), _choice(_KINDS, kind, "kind"),
                              ctypes.byref(v)), "embstore_checkpoint")
        if wait:
            self.wait(v.value)
        return v.value

    def wait(self, version):
        """Blocks until that checkpoint commits (returns) or fails (raises)."""
        check(self._call(_lib.checkpoint_wait, _int_arg(version, "version", minimum=0)),
              "embstore_checkpoint_wait")

    def attach(self, name, data):
        """Saves bytes (bytes, bytearray, memoryview, numpy array) with the next checkpoint as
        the attachment `name`; attaching a name again replaces it."""
        if isinstance(data, bytes):
            buf, n = data, len(data)
        else:
            mv = memoryview(data)
            if not mv.c_contiguous:
                raise InvalidArgumentError(1, f"attachment {name!r}: contiguous bytes expected")
            mv = mv.cast("B")
            n = len(mv)
            # The library copies the bytes: a read-only buffer is copied here first only
            # because ctypes takes no pointer into one.
            buf = bytes(mv) if mv.readonly else (ctypes.c_char * n).from_buffer(mv)
        check(self._call(_lib.checkpoint_attach, _name_bytes(name), buf if n else None, n),
              "embstore_checkpoint_attach")

    def set_policy(self, dir=None, *, full_every_steps=0, incremental_every_steps=0,
                   full_every_seconds=0.0, incremental_every_seconds=0.0, keep_full=0,
                   max_chain_length=32, rebaseline_fraction=0.5, serving_deltas=False,
                   serving_dir=None):
        """Replaces the checkpoint policy (embstore_checkpoint_set_policy); set_policy() with no
        dir and nothing scheduled turns it off. serving_deltas: every delta also gets values-only
        files, in each table's serving_codec, that followers read instead. serving_dir: a
        serving-only directory that every checkpoint of dir is published to, values only, for
        followers (docs/serving.md, "A serving-only directory")."""
        p = _lib.CheckpointPolicy()
        _lib.checkpoint_policy_init(ctypes.byref(p))
        p.dir = _path_bytes(dir, "dir") if dir is not None else None  # copied by the library
        p.full_every_steps = _int_arg(full_every_steps, "full_every_steps", minimum=0)
        p.incremental_every_steps = _int_arg(incremental_every_steps, "incremental_every_steps",
                                             minimum=0)
        p.full_every_seconds = float(full_every_seconds)
        p.incremental_every_seconds = float(incremental_every_seconds)
        p.keep_full = _int_arg(keep_full, "keep_full", minimum=0, maximum=2**32 - 1)
        p.max_chain_length = _int_arg(max_chain_length, "max_chain_length", minimum=0,
                                      maximum=2**32 - 1)
        p.rebaseline_fraction = float(rebaseline_fraction)
        p.serving_deltas = 1 if serving_deltas else 0
        p.serving_dir = _path_bytes(serving_dir, "serving_dir") if serving_dir is not None else None
        check(self._call(_lib.checkpoint_set_policy, ctypes.byref(p)),
              "embstore_checkpoint_set_policy")

    def checkpoint_stats(self):
        """The store's checkpoint counters (embstore_checkpoint_stats), as a
        CheckpointStats."""
        s = _lib.CheckpointStats(struct_size=ctypes.sizeof(_lib.CheckpointStats))
        check(self._call(_lib.checkpoint_stats, ctypes.byref(s)), "embstore_checkpoint_stats")
        return CheckpointStats(**_struct_dict(s))

    def checkpoint_info(self, version):
        """What was written for that version and what training paid for it (does not wait)."""
        s = _lib.CheckpointInfo(struct_size=ctypes.sizeof(_lib.CheckpointInfo))
        check(self._call(_lib.checkpoint_info, _int_arg(version, "version", minimum=0),
                                   ctypes.byref(s)), "embstore_checkpoint_info")
        d = _struct_dict(s)
        from .errors import status_name
        d["status"] = status_name(s.status)
        d["kind"] = _KIND_NAMES.get(s.kind, str(s.kind))
        d["in_flight"] = bool(s.in_flight)
        d["from_policy"] = bool(s.from_policy)
        return CheckpointInfo(**d)

    def restore(self, dir, version=LATEST):
        """Loads that version (LATEST: the newest committed) and its chain; returns the version
        restored. On any error the store is left as it was."""
        v = ctypes.c_uint64()
        check(self._call(_lib.restore, _path_bytes(dir, "dir"),
                           _int_arg(version, "version", minimum=0), ctypes.byref(v)),
              "embstore_restore")
        return v.value

    def restore_attachment(self, name):
        """The bytes of the attachment `name` of the last restored checkpoint."""
        name_b = _name_bytes(name)
        size = ctypes.c_size_t()
        check(self._call(_lib.restore_attachment, name_b, None, 0, ctypes.byref(size)),
              "embstore_restore_attachment")
        buf = ctypes.create_string_buffer(max(size.value, 1))
        check(self._call(_lib.restore_attachment, name_b, buf, size.value, ctypes.byref(size)),
              "embstore_restore_attachment")
        return buf.raw[:size.value]

    def warm_start(self, sources):
        """Loads chosen tables of other checkpoints (embstore_warm_start); sources: a list of
        WarmStartSource (a later one overrides an earlier one, table by table)."""
        sources = list(sources)
        if not sources:
            raise InvalidArgumentError(1, "warm_start: no sources")
        arr = (_lib.WarmStartSource * len(sources))()
        keep = []
        for i, src in enumerate(sources):
            _lib.warm_start_source_init(ctypes.byref(arr[i]))
            d = _path_bytes(src.dir, "dir")
            r = _name_bytes(src.tables, "tables")
            keep += [d, r]
            arr[i].dir = d
            arr[i].tables_regex = r
            arr[i].version = _int_arg(src.version, "version", minimum=0)
            arr[i].flags = 1 if src.values_only else 0
        check(self._call(_lib.warm_start, arr, len(sources)), "embstore_warm_start")


class Table:
    """A table of a store (embstore_table_t). Arrays in and out: numpy arrays, or torch tensors
    (CPU on the host backend, CUDA on the CUDA backend, with torch's current stream)."""

    def __init__(self, store, name, handle):
        self.store = store
        self.name = name
        self._handle = handle
        with store._handle.use():  # a dim, not a status: not through _call's checks
            self.dim = _lib.table_dim(handle)

    def _call(self, fn, *args):
        """fn(table handle, *args) while the store cannot be closed under it."""
        with self.store._handle.use():  # a closed store's tables are gone
            return self.store._checked(fn(self._handle, *args), fn)

    def __repr__(self):
        return f"embstore.Table({self.name!r}, dim={self.dim}, backend={self.store.backend!r})"

    def _check_memory(self, buffers):
        cuda = self.store.backend == "cuda"
        for b in buffers:
            if cuda and b.cuda_device is None and b.size > 0:
                raise InvalidArgumentError(
                    1, f"table {self.name!r} is on the CUDA backend: pass CUDA tensors")
            if not cuda and b.cuda_device is not None:
                raise InvalidArgumentError(
                    1, f"table {self.name!r} is on the host backend: pass host memory "
                    "(numpy arrays or CPU tensors), not CUDA tensors")
            if cuda and b.cuda_device is not None and b.cuda_device != self.store.device:
                raise InvalidArgumentError(
                    1, f"a tensor on cuda:{b.cuda_device} for a store on cuda:{self.store.device}")

    def lookup(self, keys, *, insert=False, out=None, stream=None):
        """The rows of keys, shaped keys.shape + (dim,). insert=True (training): keys without a
        row get one from the initializer; else they read as zeros and nothing is stored. On a
        sharded store, only keys this rank owns (see sharded_lookup)."""
        return self._lookup(_lib.lookup, keys, insert, out, stream)

    def prefetch(self, keys, *, stream=None):
        """Brings the rows of keys up to the table's first tier ahead of a lookup or update of
        them (embstore_prefetch): returns once the read is handed to a thread of the table's,
        and the first call that needs one of the rows waits for it. Call it with the next
        batch's keys right after this batch's lookup. Keys without a row are ignored; an
        untiered table does nothing."""
        k = _arrays.keys_buffer(keys)
        self._check_memory((k,))
        handle = _arrays.stream_handle(stream, (k,))
        check(self._call(_lib.prefetch, k.ptr, k.size, handle), "embstore_prefetch")

    def sharded_lookup(self, keys, *, insert=False, out=None, stream=None):
        """Collective lookup on a sharded store (embstore_sharded_lookup): every rank passes
        its own batch of any keys; each key's row comes from the rank that owns it. The ranks
        read, insert and count exactly what one process would for their batches concatenated
        in rank order. On a store of one rank, lookup."""
        return self._lookup(_lib.sharded_lookup, keys, insert, out, stream)

    def _lookup(self, fn, keys, insert, out, stream):
        def prepare():
            k = _arrays.keys_buffer(keys)
            o = _arrays.output_buffer(k, k.shape + (self.dim,), out)
            self._check_memory((k, o))
            return k, o, _arrays.stream_handle(stream, (k, o))
        k, o, handle = self._prepared(fn, prepare)
        check(self._call(fn, k.ptr, k.size, o.ptr, LOOKUP_INSERT if insert else 0, handle),
              fn.__name__)
        return o.owner

    def _prepared(self, fn, prepare):
        """prepare()'s result. When it raises before a collective call of a store of several
        ranks, this rank still enters the call (_refuse), then the error is raised here."""
        try:
            return prepare()
        except Exception:
            self._refuse(fn)
            raise

    def _refuse(self, fn):
        """On a store of several ranks, makes the collective call fn (sharded_lookup or
        sharded_apply_gradients; other calls: nothing) with NULL keys for n = 1, which the
        library refuses on every rank: the other ranks then fail with INVALID_ARGUMENT naming
        this one instead of waiting for it in the communicator (for a rank whose own arguments
        failed Python's checks)."""
        refused = _REFUSED_ARGS.get(fn.__name__)
        if refused is not None and self.store.world_size > 1:
            self._call(fn, *refused)

    def apply_gradients(self, keys, grads, *, stream=None):
        """Gradients of the rows of keys (shaped keys.shape + (dim,), or (n, dim)): duplicates
        summed, then one fused optimizer update per row. On a sharded store, only keys this rank
        owns (see sharded_apply_gradients)."""
        self._apply(_lib.apply_gradients, keys, grads, stream)

    def sharded_apply_gradients(self, keys, grads, *, stream=None):
        """Collective apply_gradients on a sharded store (embstore_sharded_apply_gradients):
        each gradient goes to its key's owner, which sums what it receives in rank order, then
        batch order, so that the shards end bit-identical to one process's table after the
        ranks' batches concatenated in rank order. On a store of one rank, apply_gradients."""
        self._apply(_lib.sharded_apply_gradients, keys, grads, stream)

    def _apply(self, fn, keys, grads, stream):
        def prepare():
            k = _arrays.keys_buffer(keys)
            g = _arrays.floats_buffer(grads, "grads")
            if g.shape not in (k.shape + (self.dim,), (k.size, self.dim)):
                raise InvalidArgumentError(
                    1, f"grads: shape {g.shape} for keys of shape {k.shape} and dim {self.dim} "
                    f"(expected {k.shape + (self.dim,)} or {(k.size, self.dim)})")
            self._check_memory((k, g))
            return k, g, _arrays.stream_handle(stream, (k, g))
        k, g, handle = self._prepared(fn, prepare)
        check(self._call(fn, k.ptr, g.ptr, k.size, handle), fn.__name__)

    def stats(self):
        """The table's counters (embstore_table_stats), as a TableStats. On CUDA it waits for
        the table's earlier work."""
        s = _lib.TableStats(struct_size=ctypes.sizeof(_lib.TableStats))
        check(self._call(_lib.table_stats, ctypes.byref(s)), "embstore_table_stats")
        return TableStats(**_struct_dict(s))

    def __len__(self):
        return self.stats().rows

    def evict(self):
        """Runs the table's idle rules now; returns the rows evicted."""
        n = ctypes.c_uint64()
        check(self._call(_lib.table_evict, ctypes.byref(n)), "embstore_table_evict")
        return n.value


def _int_arg(value, what, minimum=None, maximum=None):
    import operator
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: an integer is expected, got {type(value).__name__}") from None
    lo = -(2**31) if minimum is None else minimum
    hi = (2**31 - 1 if minimum is None else 2**64 - 1) if maximum is None else maximum
    if not lo <= v <= hi:
        raise InvalidArgumentError(1, f"{what} = {v} is out of range [{lo}, {hi}]")
    return v


# Arguments of the collective calls that the library refuses on every rank: NULL keys, n = 1.
# (By name: ctypes functions are not hashable.)
_REFUSED_ARGS = {"embstore_sharded_lookup": (None, 1, None, 0, None),
                 "embstore_sharded_apply_gradients": (None, None, 1, None)}


def _checkpoint_in_flight(handle):
    """Whether a store (a raw handle) has a checkpoint in flight: destroying a sharded one then
    is collective."""
    s = _lib.CheckpointStats(struct_size=ctypes.sizeof(_lib.CheckpointStats))
    return _lib.checkpoint_stats(handle, ctypes.byref(s)) != 0 or s.in_flight > 0


def _check_communicator(comm):
    """TypeError unless comm has what a Communicator has."""
    missing = [m for m in ("all_gather", "all_to_all", "rank", "world_size")
               if not hasattr(comm, m)]
    if missing:
        raise TypeError(f"comm: a Communicator is expected ({type(comm).__name__} has no "
                        f"{', '.join(missing)})")
    if not all(callable(getattr(comm, m)) for m in ("all_gather", "all_to_all")):
        raise TypeError("comm: all_gather and all_to_all must be methods")


def shard_of(keys, world_size):
    """The rank that owns each key among world_size ranks (embstore_shard_of): an int for an
    int, else a numpy array of uint32."""
    import numpy as np
    w = _int_arg(world_size, "world_size", minimum=0, maximum=2**32 - 1)
    if isinstance(keys, int) or hasattr(keys, "__index__") and not hasattr(keys, "shape"):
        return _lib.shard_of(_int_arg(keys, "key", minimum=-(2**63), maximum=2**63 - 1), w)
    k = _arrays.keys_buffer(keys).owner
    k = k.cpu().numpy() if _arrays.is_torch(k) else k
    return np.fromiter((_lib.shard_of(int(x), w) for x in k.reshape(-1)), dtype=np.uint32,
                       count=k.size).reshape(k.shape)
