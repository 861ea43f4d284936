"""The C API of libembstore.so through ctypes: the library, its structs and its signatures.

One declaration per C declaration of include/embstore/embstore.h, in its order. The structs'
layouts are checked against the library at import: each config struct's _init() writes its
struct_size, which must equal ctypes' size of the same struct, so bindings that drifted from
the header fail at import instead of corrupting memory.
"""

import ctypes
import os
from ctypes import (POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_uint32,
                    c_uint64, c_void_p)

_HERE = os.path.dirname(os.path.abspath(__file__))


def _library_path():
    # EMBSTORE_LIBRARY: a libembstore.so of a build tree, to test it without reinstalling.
    override = os.environ.get("EMBSTORE_LIBRARY")
    if override:
        return override
    return os.path.join(_HERE, "libembstore.so")


_path = _library_path()
try:
    lib = ctypes.CDLL(_path)
except OSError as e:  # pragma: no cover - depends on the installation
    raise ImportError(f"embstore: cannot load {_path}: {e}") from e

c_status = c_int
c_enum = c_int


# embstore_comm_callbacks_t's two functions: (context, send, bytes, recv) and
# (context, send, send_bytes[world], recv, recv_bytes[world]); 0 or nonzero.
ALL_GATHER = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p)
ALL_TO_ALL = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, POINTER(c_size_t), c_void_p,
                              POINTER(c_size_t))


class CommCallbacks(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("context", c_void_p), ("all_gather", ALL_GATHER),
                ("all_to_all", ALL_TO_ALL)]


class StoreConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("backend", c_enum), ("device", c_int),
                ("rank", c_int), ("world_size", c_int), ("nccl_comm", c_void_p),
                ("staging_bytes", c_size_t), ("io_queue_depth", c_int), ("host_threads", c_int),
                ("restore_spill", c_enum), ("spill_dir", c_char_p), ("mpi_comm", c_void_p),
                ("comm_callbacks", c_void_p), ("tier_dir", c_char_p)]


class TableConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("dim", c_uint32),
                ("initial_capacity", c_uint64), ("max_capacity", c_uint64),
                ("optimizer", c_enum), ("learning_rate", c_float), ("epsilon", c_float),
                ("beta1", c_float), ("beta2", c_float), ("weight_decay", c_float),
                ("initial_accumulator", c_float), ("init", c_enum), ("init_a", c_float),
                ("init_b", c_float), ("seed", c_uint64), ("admit_after", c_uint32),
                ("evict_idle_steps", c_uint64), ("evict_idle_seconds", c_double),
                ("evict_when_full", c_uint32), ("admit_bloom_bytes", c_uint64),
                ("device_rows", c_uint64), ("memory_rows", c_uint64),
                ("value_codec", c_enum), ("state_codec", c_enum), ("serving_codec", c_enum)]


class TableStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("rows", c_uint64), ("capacity", c_uint64),
                ("dirty_rows", c_uint64), ("inserted", c_uint64), ("evicted", c_uint64),
                ("pending_admission", c_uint64), ("skipped_keys", c_uint64),
                ("admitted", c_uint64), ("rows_in_device", c_uint64),
                ("rows_in_memory", c_uint64), ("rows_on_disk", c_uint64),
                ("rows_moved_up", c_uint64), ("rows_moved_down", c_uint64),
                ("tier_bytes_read", c_uint64), ("tier_bytes_written", c_uint64)]


class CheckpointPolicy(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("dir", c_char_p), ("full_every_steps", c_uint64),
                ("incremental_every_steps", c_uint64), ("full_every_seconds", c_double),
                ("incremental_every_seconds", c_double), ("keep_full", c_uint32),
                ("max_chain_length", c_uint32), ("rebaseline_fraction", c_double),
                ("serving_deltas", c_uint32), ("serving_dir", c_char_p)]


class CheckpointStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("committed", c_uint64), ("failed", c_uint64),
                ("last_version", c_uint64), ("in_flight", c_uint64), ("rows_written", c_uint64),
                ("bytes_written", c_uint64), ("copy_on_write_rows", c_uint64),
                ("stall_seconds_total", c_double), ("stall_seconds_max", c_double),
                ("capture_seconds_last", c_double), ("deltas_committed", c_uint64),
                ("deferred", c_uint64), ("serving_published", c_uint64),
                ("serving_skipped", c_uint64)]


class CheckpointInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("status", c_status), ("in_flight", c_uint32),
                ("kind", c_enum), ("from_policy", c_uint32), ("version", c_uint64),
                ("parent", c_uint64), ("rows_captured", c_uint64), ("rows_written", c_uint64),
                ("bytes_written", c_uint64), ("capture_seconds", c_double),
                ("write_seconds", c_double), ("stall_seconds", c_double),
                ("copy_on_write_rows", c_uint64)]


class WarmStartSource(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("dir", c_char_p), ("version", c_uint64),
                ("tables_regex", c_char_p), ("flags", c_uint32)]


class FollowerConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("dir", c_char_p), ("backend", c_enum),
                ("tables_regex", c_char_p), ("rank", c_int), ("world_size", c_int),
                ("flags", c_uint32), ("poll_interval_ms", c_uint32), ("lease_seconds", c_uint32),
                ("apply_bytes_per_second", c_uint64), ("device", c_int)]


class FollowerStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("version", c_uint64),
                ("versions_applied", c_uint64), ("full_loads", c_uint64), ("lookups", c_uint64),
                ("last_apply_seconds", c_double), ("polls", c_uint64), ("chain_lost", c_uint64),
                ("last_poll_status", c_status), ("last_lag_seconds", c_double),
                ("lag_p50_seconds", c_double), ("lag_p99_seconds", c_double),
                ("delta_bytes_read", c_uint64), ("serving_files_read", c_uint64),
                ("serving_fallbacks", c_uint64)]


def _declare(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_P = c_void_p  # opaque handles: embstore_store_t*, embstore_table_t*, embstore_follower_t*

version = _declare("embstore_version", c_int)
status_name = _declare("embstore_status_name", c_char_p, c_status)
last_error = _declare("embstore_last_error", c_char_p)
comm_callbacks_init = _declare("embstore_comm_callbacks_init", None, POINTER(CommCallbacks))
store_config_init = _declare("embstore_store_config_init", None, POINTER(StoreConfig))
shard_of = _declare("embstore_shard_of", c_uint32, c_int64, c_uint32)
store_create = _declare("embstore_store_create", c_status, POINTER(StoreConfig), POINTER(_P))
store_destroy = _declare("embstore_store_destroy", c_status, _P)
store_backend = _declare("embstore_store_backend", c_enum, _P)
table_config_init = _declare("embstore_table_config_init", None, POINTER(TableConfig))
table_create = _declare("embstore_table_create", c_status, _P, POINTER(TableConfig), POINTER(_P))
table_get = _declare("embstore_table_get", c_status, _P, c_char_p, POINTER(_P))
table_dim = _declare("embstore_table_dim", c_uint32, _P)
lookup = _declare("embstore_lookup", c_status, _P, c_void_p, c_size_t, c_void_p, c_uint32,
                  c_void_p)
apply_gradients = _declare("embstore_apply_gradients", c_status, _P, c_void_p, c_void_p,
                           c_size_t, c_void_p)
sharded_lookup = _declare("embstore_sharded_lookup", c_status, _P, c_void_p, c_size_t, c_void_p,
                          c_uint32, c_void_p)
sharded_apply_gradients = _declare("embstore_sharded_apply_gradients", c_status, _P, c_void_p,
                                   c_void_p, c_size_t, c_void_p)
prefetch = _declare("embstore_prefetch", c_status, _P, c_void_p, c_size_t, c_void_p)
step = _declare("embstore_step", c_status, _P, c_uint64)
table_stats = _declare("embstore_table_stats", c_status, _P, POINTER(TableStats))
table_evict = _declare("embstore_table_evict", c_status, _P, POINTER(c_uint64))
checkpoint = _declare("embstore_checkpoint", c_status, _P, c_char_p, c_enum, POINTER(c_uint64))
checkpoint_wait = _declare("embstore_checkpoint_wait", c_status, _P, c_uint64)
checkpoint_attach = _declare("embstore_checkpoint_attach", c_status, _P, c_char_p, c_void_p,
                             c_size_t)
checkpoint_policy_init = _declare("embstore_checkpoint_policy_init", None,
                                  POINTER(CheckpointPolicy))
checkpoint_set_policy = _declare("embstore_checkpoint_set_policy", c_status, _P,
                                 POINTER(CheckpointPolicy))
checkpoint_stats = _declare("embstore_checkpoint_stats", c_status, _P, POINTER(CheckpointStats))
checkpoint_info = _declare("embstore_checkpoint_info", c_status, _P, c_uint64,
                           POINTER(CheckpointInfo))
restore = _declare("embstore_restore", c_status, _P, c_char_p, c_uint64, POINTER(c_uint64))
restore_attachment = _declare("embstore_restore_attachment", c_status, _P, c_char_p, c_void_p,
                              c_size_t, POINTER(c_size_t))
warm_start_source_init = _declare("embstore_warm_start_source_init", None,
                                  POINTER(WarmStartSource))
warm_start = _declare("embstore_warm_start", c_status, _P, POINTER(WarmStartSource), c_size_t)
follower_config_init = _declare("embstore_follower_config_init", None, POINTER(FollowerConfig))
follower_create = _declare("embstore_follower_create", c_status, POINTER(FollowerConfig),
                           POINTER(_P))
follower_lookup = _declare("embstore_follower_lookup", c_status, _P, c_char_p, c_void_p,
                           c_size_t, c_void_p, c_void_p)
follower_poll = _declare("embstore_follower_poll", c_status, _P, POINTER(c_uint64))
follower_version = _declare("embstore_follower_version", c_status, _P, POINTER(c_uint64))
follower_table_dim = _declare("embstore_follower_table_dim", c_status, _P, c_char_p,
                              POINTER(c_uint32))
follower_stats = _declare("embstore_follower_stats", c_status, _P, POINTER(FollowerStats))
follower_destroy = _declare("embstore_follower_destroy", c_status, _P)
follower_cancel = _declare("embstore_follower_cancel", c_status, _P)


CONFIG_STRUCTS = ((CommCallbacks, comm_callbacks_init), (StoreConfig, store_config_init),
                  (TableConfig, table_config_init),
                  (CheckpointPolicy, checkpoint_policy_init),
                  (WarmStartSource, warm_start_source_init),
                  (FollowerConfig, follower_config_init))


def _check_layouts(structs=CONFIG_STRUCTS):
    for struct, init in structs:
        # Room for the library's struct whatever its size: init writes all of it.
        room = ctypes.create_string_buffer(max(ctypes.sizeof(struct), 4096))
        init(ctypes.cast(room, init.argtypes[0]))
        probe = struct.from_buffer(room)
        if probe.struct_size != ctypes.sizeof(struct):
            raise ImportError(
                f"embstore: {struct.__name__} is {ctypes.sizeof(struct)} bytes in the Python "
                f"bindings but {probe.struct_size} in {_path}: the package and the library "
                "are of different versions")


_check_layouts()
