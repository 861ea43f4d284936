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
    pass


class NotFoundError(Error, LookupError):
    pass


class AlreadyExistsError(Error):
    pass


class OutOfMemoryError(Error, MemoryError):
    pass


class CapacityExceededError(Error):
    pass


class StorageIOError(Error):
    """EMBSTORE_IO_ERROR: a read, write, fsync or rename failed (the errno text is in message)."""


class CorruptError(Error):
    pass


class UnsupportedError(Error):
    pass


class BusyError(Error):
    pass


class DeviceError(Error):
    pass


class InternalError(Error):
    pass


class CommError(Error):
    pass


# By status number: embstore_status_t is never renumbered.
_BY_STATUS = {1: InvalidArgumentError, 2: NotFoundError, 3: AlreadyExistsError,
              4: OutOfMemoryError, 5: CapacityExceededError, 6: StorageIOError, 7: CorruptError,
              8: UnsupportedError, 9: BusyError, 10: DeviceError, 11: InternalError,
              12: CommError}


def status_name(status):
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
