"""Exceptions: one class per embstore_status_t, each carrying the status and the library's
message (embstore_last_error of the failed call)."""

from . import _lib


class Error(Exception):
    """A failed embstore call. `status` is the embstore_status_t number, `status_name` its
    name ("EMBSTORE_CORRUPT"), `message` the library's text (file and offset, errno text ...)."""

    def __init__(self, status, message, call=None):
        self.status = int(status)
        self.status_name = status_name(status)
        self.message = message
        self.call = call
        # The library's messages mostly name the call already.
        where = f"{call}: " if call and not (message or "").startswith(call) else ""
        super().__init__(f"{where}{self.status_name}: {message}" if message else
                         f"{where}{self.status_name}")


class InvalidArgumentError(Error, ValueError):
    """EMBSTORE_INVALID_ARGUMENT: a null pointer, bad size, bad name, mismatched dim ... (also
    a ValueError)."""


class NotFoundError(Error, LookupError):
    """EMBSTORE_NOT_FOUND: no such table, checkpoint directory, version or attachment (also a
    LookupError)."""


class AlreadyExistsError(Error):
    """EMBSTORE_ALREADY_EXISTS: a table of that name exists."""


class OutOfMemoryError(Error, MemoryError):
    """EMBSTORE_OUT_OF_MEMORY: a host or device allocation failed (also a MemoryError)."""


class CapacityExceededError(Error):
    """EMBSTORE_CAPACITY_EXCEEDED: max_capacity reached and nothing can be evicted."""


class StorageIOError(Error):
    """EMBSTORE_IO_ERROR: a read, write, fsync or rename failed (the errno text is in message)."""


class CorruptError(Error):
    """EMBSTORE_CORRUPT: a checksum or format mismatch (file and offset in message)."""


class UnsupportedError(Error):
    """EMBSTORE_UNSUPPORTED: not built, no device, or not implemented in this version."""


class BusyError(Error):
    """EMBSTORE_BUSY: another writer holds the checkpoint directory, a restore met calls on the
    store's tables, or a cancelled follower's poll."""


class DeviceError(Error):
    """EMBSTORE_DEVICE_ERROR: a CUDA or NCCL failure."""


class InternalError(Error):
    """EMBSTORE_INTERNAL: a bug in embstore (please report it with the message)."""


class CommError(Error):
    """EMBSTORE_COMM_ERROR: an exchange through the store's communicator failed (the ranks'
    tables may differ: restore every rank from the last checkpoint)."""


# By status number: embstore_status_t is never renumbered.
_BY_STATUS = {1: InvalidArgumentError, 2: NotFoundError, 3: AlreadyExistsError,
              4: OutOfMemoryError, 5: CapacityExceededError, 6: StorageIOError, 7: CorruptError,
              8: UnsupportedError, 9: BusyError, 10: DeviceError, 11: InternalError,
              12: CommError}


def status_name(status):
    """The name of a status number ("EMBSTORE_CORRUPT"; "EMBSTORE_UNKNOWN_STATUS" for a number
    that is not a status)."""
    return _lib.status_name(int(status)).decode()


def last_error():
    """This thread's message for its last failed call ("" if none has failed)."""
    return _lib.last_error().decode(errors="replace")


def error_for(status, call=None):
    """The exception for a status that is not OK, with this thread's last error message."""
    return _BY_STATUS.get(int(status), Error)(status, last_error(), call)


def check(status, call=None):
    """Raises the exception of a failed call; returns None for EMBSTORE_OK."""
    if status != 0:
        raise error_for(status, call)
