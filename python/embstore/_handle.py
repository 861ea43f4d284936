"""The owner of one C handle (a store or a follower): calls enter and leave it, and close()
waits for the calls in flight before freeing it, so that no call reaches freed memory, whatever
the threads do (ctypes releases the GIL during each call)."""

import contextlib
import threading
import warnings
import weakref

from .errors import InvalidArgumentError, check


class Handle:
    def __init__(self, value, destroy, what, keep=None, collective=None, cancel=None):
        self._value = value
        self._destroy = destroy
        self._what = what
        # cancel(value): makes the calls in flight return soon (a follower's paced poll), so
        # that close() does not wait them out.
        self._cancel = cancel
        self._cond = threading.Condition()
        self._calls = 0
        self._closing = False
        # Freed at garbage collection or exit when never closed (its outcome then unreported).
        # keep: what the handle's C object calls into (a sharded store's communicator
        # callbacks), alive until it is freed. collective(value): whether freeing it now would be
        # a collective call (a sharded store with a checkpoint in flight), which garbage
        # collection must not make: it runs at a different point on every rank, maybe inside
        # another collective. Such a handle is left unfreed (leaked), with a warning.
        self._keep = keep
        self._finalizer = weakref.finalize(self, Handle._free, destroy, value, what, keep,
                                           collective)

    @staticmethod
    def _free(destroy, value, what, keep, collective):
        if collective is not None:
            if collective(value):
                # Shown by default (a ResourceWarning is not): that checkpoint never commits.
                warnings.warn(f"embstore: a sharded {what} was not closed (garbage collected, or "
                              "the interpreter exits) while a checkpoint was in flight: it is "
                              "left unfreed and that checkpoint does not commit. Close sharded "
                              "stores explicitly, on every rank", RuntimeWarning)
                return
            warnings.warn(f"embstore: a sharded {what} was not closed (garbage collected, or the "
                          "interpreter exits): freed here. Close sharded stores explicitly, on "
                          "every rank", ResourceWarning)
        destroy(value)

    @contextlib.contextmanager
    def use(self):
        """The handle, for one call; raises once the owner is closed or closing."""
        with self._cond:
            if self._closing:
                raise InvalidArgumentError(1, f"the {self._what} is closed")
            self._calls += 1
        try:
            yield self._value
        finally:
            with self._cond:
                self._calls -= 1
                if self._calls == 0:
                    self._cond.notify_all()

    @property
    def closed(self):
        return self._closing

    def close(self, call):
        """Refuses new calls, cancels those in flight where the handle can (a follower's
        polls), waits for them, then frees the handle once."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            busy = self._calls > 0
        if busy and self._cancel is not None:
            self._cancel(self._value)
        with self._cond:
            while self._calls:
                self._cond.wait()
            self._finalizer.detach()
        check(self._destroy(self._value), call)


class Owner:
    """What Store and Follower share: a Handle in self._handle, closed by close(), a with
    block, or garbage collection; calls through _call; no copies."""

    _destroy_call = None  # the C function's name, for errors

    def close(self):
        """Refuses new calls, waits for calls in flight on other threads, then frees the handle
        (raising what the library's destroy reports). Idempotent."""
        self._handle.close(self._destroy_call)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __reduce__(self):
        raise TypeError(f"an embstore.{type(self).__name__} cannot be pickled or copied")

    @property
    def closed(self):
        """True once close() has begun (or garbage collection freed it): later calls raise
        InvalidArgumentError."""
        return self._handle.closed

    def _call(self, fn, *args):
        """fn(handle, *args) while the handle cannot be freed under it."""
        with self._handle.use() as h:
            return fn(h, *args)
