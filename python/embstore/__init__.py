"""embstore: embedding tables with fused optimizers and asynchronous, incremental checkpoints.

    import embstore
    with embstore.Store(backend="host") as store:
        table = store.create_table("items", dim=64, optimizer="adagrad")
        rows = table.lookup(keys, insert=True)       # numpy in, numpy out (or torch tensors)
        table.apply_gradients(keys, grads)
        store.step(1)
        store.checkpoint("/ckpt", "incremental", wait=True)

Every failed call raises an embstore.Error subclass carrying the status and the library's
message. embstore.torch has the torch modules (import it explicitly: it needs torch).
"""

from . import _lib
from .comm import Communicator
from .errors import (AlreadyExistsError, BusyError, CapacityExceededError, CommError,
                     CorruptError, DeviceError, Error, InternalError, InvalidArgumentError,
                     NotFoundError, OutOfMemoryError, StorageIOError, UnsupportedError,
                     last_error, status_name)
from .follower import Follower, FollowerStats
from .store import (LATEST, CheckpointInfo, CheckpointStats, Store, Table, TableStats,
                    WarmStartSource, shard_of)

__version__ = "{}.{}.{}".format(_lib.version() // 10000, _lib.version() // 100 % 100,
                                _lib.version() % 100)


def library_version():
    """The loaded libembstore's version code (major * 10000 + minor * 100 + patch)."""
    return _lib.version()


__all__ = ["AlreadyExistsError", "BusyError", "CapacityExceededError", "CheckpointInfo",
           "CheckpointStats", "CommError", "Communicator", "CorruptError", "DeviceError", "Error",
           "Follower", "FollowerStats", "InternalError", "InvalidArgumentError", "LATEST",
           "NotFoundError", "OutOfMemoryError", "StorageIOError", "Store", "Table", "TableStats",
           "UnsupportedError", "WarmStartSource", "last_error", "library_version", "shard_of",
           "status_name"]
