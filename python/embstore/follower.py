"""Follower: a read-only replica of a training run's checkpoint directory for serving
(embstore_follower_t): the newest version, deltas applied live."""

import ctypes
import dataclasses

from . import _arrays, _lib
from ._handle import Handle, Owner
from .errors import InvalidArgumentError, check, status_name
from .store import _BACKENDS, _int_arg, _name_bytes, _path_bytes, _struct_dict

INITIAL_VALUES = 1  # EMBSTORE_FOLLOWER_INITIAL_VALUES
INTERVAL_ONLY = 2  # EMBSTORE_FOLLOWER_INTERVAL_ONLY


@dataclasses.dataclass(frozen=True)
class FollowerStats:
    """A follower's counters (Follower.stats; embstore_follower_stats_t, whose comments in
    embstore.h say what each field counts). last_poll_status is a status name,
    "EMBSTORE_OK" when the last poll succeeded; lags are in seconds."""

    version: int
    versions_applied: int
    full_loads: int
    lookups: int
    last_apply_seconds: float
    polls: int
    chain_lost: int
    last_poll_status: str
    last_lag_seconds: float
    lag_p50_seconds: float
    lag_p99_seconds: float
    delta_bytes_read: int
    serving_files_read: int
    serving_fallbacks: int


class Follower(Owner):
    """Follower(dir, tables=".*", backend="auto", rank=0, world_size=1, initial_values=False,
    interval_only=False, poll_interval_ms=0, lease_seconds=60, apply_bytes_per_second=0,
    device=0). tables: a regex (RE2 syntax: no backreferences or lookaround; at most 1024 bytes)
    that the names of the tables served match whole. Lookups from any number of threads; close()
    (or a with block) stops it."""

    def __init__(self, dir, *, tables=".*", backend="auto", rank=0, world_size=1,
                 initial_values=False, interval_only=False, poll_interval_ms=0, lease_seconds=60,
                 apply_bytes_per_second=0, device=0):
        cfg = _lib.FollowerConfig()
        _lib.follower_config_init(ctypes.byref(cfg))
        cfg.dir = _path_bytes(dir, "dir")  # both copied by the library at create
        cfg.tables_regex = _name_bytes(tables, "tables")
        try:
            cfg.backend = _BACKENDS[str(backend).lower()]
        except KeyError:
            raise InvalidArgumentError(1, f"unknown backend {backend!r}") from None
        cfg.rank = _int_arg(rank, "rank")
        cfg.world_size = _int_arg(world_size, "world_size")
        cfg.flags = (INITIAL_VALUES if initial_values else 0) | (
            INTERVAL_ONLY if interval_only else 0)
        cfg.poll_interval_ms = _int_arg(poll_interval_ms, "poll_interval_ms", minimum=0,
                                        maximum=2**32 - 1)
        cfg.lease_seconds = _int_arg(lease_seconds, "lease_seconds", minimum=0,
                                     maximum=2**32 - 1)
        cfg.apply_bytes_per_second = _int_arg(apply_bytes_per_second, "apply_bytes_per_second",
                                              minimum=0)
        cfg.device = _int_arg(device, "device")
        handle = ctypes.c_void_p()
        check(_lib.follower_create(ctypes.byref(cfg), ctypes.byref(handle)),
              "embstore_follower_create")
        # close() cancels a poll in flight on another thread (a paced one would otherwise keep
        # it waiting for as long as its pace takes); that poll raises BusyError.
        self._handle = Handle(handle.value, _lib.follower_destroy, "follower",
                              cancel=_lib.follower_cancel)
        self._cuda = cfg.backend == _BACKENDS["cuda"]
        self._device = device
        self._dims = {}

    # close() (from Owner) also stops background polling and removes the lease.
    _destroy_call = "embstore_follower_destroy"

    def table_dim(self, table):
        """The dim of a table the follower serves (NotFoundError if it serves none of that
        name)."""
        name = _name_bytes(table, "table")
        d = ctypes.c_uint32()
        check(self._call(_lib.follower_table_dim, name, ctypes.byref(d)),
              "embstore_follower_table_dim")
        return d.value

    def lookup(self, table, keys, *, out=None, stream=None):
        """The rows of keys in table, of one version, shaped keys.shape + (dim,)."""
        dim = self._dims.get(table)
        if dim is None:
            dim = self._dims[table] = self.table_dim(table)
        k = _arrays.keys_buffer(keys)
        o = _arrays.output_buffer(k, k.shape + (dim,), out)
        for b in (k, o):
            if self._cuda and b.cuda_device is None and b.size:
                raise InvalidArgumentError(1, "a CUDA follower takes CUDA tensors")
            if not self._cuda and b.cuda_device is not None:
                raise InvalidArgumentError(1, "a host follower takes host memory, not CUDA "
                                           "tensors")
            if self._cuda and b.cuda_device is not None and b.cuda_device != self._device:
                raise InvalidArgumentError(
                    1, f"a tensor on cuda:{b.cuda_device} for a follower on cuda:{self._device}")
        check(self._call(_lib.follower_lookup, _name_bytes(table, "table"), k.ptr, k.size, o.ptr,
                                   _arrays.stream_handle(stream, (k, o))),
              "embstore_follower_lookup")
        return o.owner

    def poll(self):
        """Moves to the newest committed version; returns the version served."""
        v = ctypes.c_uint64()
        check(self._call(_lib.follower_poll, ctypes.byref(v)), "embstore_follower_poll")
        return v.value

    @property
    def version(self):
        """The version served (embstore_follower_version: reads it, does not poll)."""
        v = ctypes.c_uint64()
        check(self._call(_lib.follower_version, ctypes.byref(v)), "embstore_follower_version")
        return v.value

    def stats(self):
        """The follower's counters (embstore_follower_stats), as a FollowerStats."""
        s = _lib.FollowerStats(struct_size=ctypes.sizeof(_lib.FollowerStats))
        check(self._call(_lib.follower_stats, ctypes.byref(s)), "embstore_follower_stats")
        d = _struct_dict(s)
        d["last_poll_status"] = status_name(s.last_poll_status)
        return FollowerStats(**d)
