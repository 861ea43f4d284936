"""Communicators of sharded stores: a trainer's own process group as the C API's callbacks
(embstore_comm_callbacks_t).

A sharded store (Store(comm=...)) holds one shard of every table on each of the group's ranks,
and its collective calls (Table.sharded_lookup, Table.sharded_apply_gradients, checkpoint, wait,
step, restore, warm_start, close) exchange bytes through the communicator's two methods, on the
thread that made the call. Subclass Communicator, or use embstore.torch.ProcessGroup (any
torch.distributed group that runs on CPU tensors: gloo).

    class MyComm(embstore.Communicator):
        rank, world_size = ...
        def all_gather(self, send, recv): ...
        def all_to_all(self, send, send_counts, recv, recv_counts): ...
"""

import ctypes
import threading
import traceback

import numpy as np

from . import _lib


class Communicator:
    """The collective operations a sharded store needs, on byte arrays (numpy uint8 views of the
    library's buffers: no copies; valid only during the call). Every rank calls them in the same
    order. An exception fails the embstore call on that rank with CommError (the exception is its
    __cause__); the group must then be torn down, as after any failed collective.

    rank, world_size: this process's rank and the group's size (attributes or properties; a
    subclass must set both: there are no defaults, so that a forgotten one is an error instead of
    a store of one rank on every process).
    """

    def all_gather(self, send, recv):
        """send: n bytes (the same n on every rank); recv: world_size * n bytes, rank q's at
        recv[q * n:(q + 1) * n]."""
        raise NotImplementedError

    def all_to_all(self, send, send_counts, recv, recv_counts):
        """send_counts[q] bytes of send (packed in rank order) go to rank q; recv_counts[q] bytes
        of recv (packed in rank order) come from rank q. Counts are lists of ints."""
        raise NotImplementedError


def _bytes_at(address, n, writable):
    """A uint8 view of n bytes at address (an empty array for n == 0, where the library may pass
    NULL)."""
    if n == 0:
        return np.empty(0, np.uint8)
    a = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(address))
    if not writable:
        a.flags.writeable = False
    return a


class _Callbacks:
    """The C callbacks over one Communicator, and per thread the first exception one of them
    raised during the current call (to be chained to the CommError of that call: the library
    calls the callbacks on the thread of the call). Kept alive as long as the store."""

    def __init__(self, comm, world_size):
        self.comm = comm
        self.world_size = world_size
        self._failures = threading.local()

        def all_gather(_context, send, n, recv):
            try:
                self.comm.all_gather(_bytes_at(send, n, False),
                                     _bytes_at(recv, n * self.world_size, True))
                return 0
            except BaseException as e:  # noqa: B036 - see _keep
                return self._keep(e)

        def all_to_all(_context, send, send_bytes, recv, recv_bytes):
            try:
                sc = [send_bytes[q] for q in range(self.world_size)]
                rc = [recv_bytes[q] for q in range(self.world_size)]
                self.comm.all_to_all(_bytes_at(send, sum(sc), False), sc,
                                     _bytes_at(recv, sum(rc), True), rc)
                return 0
            except BaseException as e:  # noqa: B036 - see _keep
                return self._keep(e)

        self._all_gather = _lib.ALL_GATHER(all_gather)
        self._all_to_all = _lib.ALL_TO_ALL(all_to_all)
        self.struct = _lib.CommCallbacks()
        _lib.comm_callbacks_init(ctypes.byref(self.struct))
        self.struct.all_gather = self._all_gather
        self.struct.all_to_all = self._all_to_all

    def _keep(self, e):
        """Keeps e (the first of the call) and returns the callback's failure (1). Every
        exception is caught, BaseException too: one escaping a ctypes callback is printed and the
        callback's return value is undefined (in practice 0, which the library would take for
        success). The traceback's frames are cleared of their locals: they hold numpy views of
        the library's buffers, which are freed when the call returns."""
        traceback.clear_frames(e.__traceback__)
        if getattr(self._failures, "e", None) is None:
            self._failures.e = e
        return 1

    def take_failure(self):
        """The exception that failed this thread's last call, once (None if none)."""
        e = getattr(self._failures, "e", None)
        self._failures.e = None
        return e
