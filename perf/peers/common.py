"""Helpers shared by the driver and its children: durability, the page cache, memory, files."""

import ctypes
import ctypes.util
import os
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def now():
    return time.perf_counter()


# ----------------------------------------------------------------------------- durability --

def _fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path):
    """fsyncs every regular file under path (or path itself when it is a file), every directory
    under it, path and path's parent directory: the data and the names that reach it durable."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            for f in files:
                p = os.path.join(root, f)
                if os.path.isfile(p) and not os.path.islink(p):
                    _fsync_path(p)
            _fsync_path(root, directory=True)
    else:
        _fsync_path(path)
    _fsync_path(os.path.dirname(path), directory=True)


def files_under(path):
    out = []
    if os.path.isfile(path):
        return [path]
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append(p)
    return sorted(out)


def bytes_under(path):
    return sum(os.path.getsize(p) for p in files_under(path))


# ------------------------------------------------------------------------------ page cache --

def drop_cache(path):
    """fsync, then posix_fadvise(POSIX_FADV_DONTNEED) every file under path: a cold page cache
    for those files (clean pages are dropped; fsync first so that all of them are clean)."""
    fsync_tree(path)
    for p in files_under(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = None


def _lib():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_long]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return _libc


def resident_bytes(path):
    """(bytes of the files under path in the page cache, their total bytes), by mincore(2); the
    resident figure is None where mincore is unavailable."""
    total = 0
    resident = 0
    try:
        libc = _lib()
    except OSError:
        return None, bytes_under(path)
    for p in files_under(path):
        size = os.path.getsize(p)
        total += size
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return None, bytes_under(path)
            try:
                pages = (size + PAGE - 1) // PAGE
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(addr, size, vec) != 0:
                    return None, bytes_under(path)
                resident += sum(1 for b in bytes(vec) if b & 1) * PAGE
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return min(resident, total), total


# ---------------------------------------------------------------------------------- memory --

def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def rss():
    return _status("VmRSS")


def meminfo(field):
    """A field of /proc/meminfo (MemTotal, MemAvailable, ...) in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_page_reporting():
    """Whether this machine is a VM whose balloon device reports free pages to the host
    (virtio device 5, feature bit 5, VIRTIO_BALLOON_F_REPORTING): memory a process frees is then
    handed back to the host from 2 s later (the kernel's Documentation/mm/
    free_page_reporting.rst), and the next first touch of it costs a host fault besides the
    guest's page zeroing. -> True, False, or None where it cannot be told."""
    base = "/sys/bus/virtio/devices"
    try:
        devices = os.listdir(base)
    except OSError:
        return None if os.path.exists("/sys/bus/virtio") else False
    unreadable = False
    for d in devices:
        try:
            with open(os.path.join(base, d, "device")) as f:
                if int(f.read().strip(), 16) != 5:
                    continue
        except (OSError, ValueError):
            unreadable = True  # perhaps the balloon: no answer unless another device gives one
            continue
        try:
            with open(os.path.join(base, d, "features")) as f:
                bits = f.read().strip()  # the negotiated features, bit 0 first
        except OSError:
            return None
        return len(bits) > 5 and bits[5] == "1"
    return None if unreadable else False


def back_memory(nbytes):
    """Writes one byte into every page of nbytes of fresh anonymous memory, then unmaps it: the
    pages a load takes next are then ones the host already backs (see free_page_reporting), as
    on a machine that is not a VM; the guest still zeroes them on the load's first touch.
    -> seconds taken."""
    import mmap
    import numpy as np
    t0 = now()
    if nbytes <= 0:
        return 0.0
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        try:
            m.madvise(mmap.MADV_HUGEPAGE)  # fewer faults; the kernel may refuse
        except (AttributeError, OSError):
            pass
        a = np.frombuffer(m, dtype=np.uint8)
        try:
            a[::PAGE] = 1
        finally:
            del a  # the mapping cannot close while an array exports its buffer
    finally:
        m.close()
    return now() - t0


class PeakMeter:
    """The peak resident memory of this process above its RSS at start(): VmHWM after resetting
    it (echo 5 > /proc/self/clear_refs, Linux 4.0+), else ru_maxrss, which then also counts
    peaks before start() (reported as such)."""

    def start(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "VmHWM after clear_refs 5, minus VmRSS at start"
        except OSError:
            self.method = "ru_maxrss minus VmRSS at start (peak not reset: an upper bound)"
        self.base = rss()

    def extra(self):
        hwm = _status("VmHWM")
        if hwm is None or not self.method.startswith("VmHWM"):
            import resource
            hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, hwm - self.base)


# ----------------------------------------------------------------------------- the disk --

def disk_baseline(directory, nbytes, chunk=64 << 20):
    """The file system's own speed for the state's size: one file of nbytes (random bytes)
    written and fsynced, then read back from a cold page cache; -> dict of seconds and GB/s."""
    path = os.path.join(directory, "disk-baseline.bin")
    buf = os.urandom(min(chunk, nbytes))
    t0 = now()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            n = f.write(memoryview(buf)[:min(left, len(buf))])
            left -= n
        os.fsync(f.fileno())
    fsync_tree(path)
    write_s = now() - t0
    drop_cache(path)
    rbuf = bytearray(len(buf))
    t0 = now()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(rbuf):
            pass
    read_s = now() - t0
    os.unlink(path)
    return {"bytes": nbytes, "write_fsync_s": write_s, "write_GBps": nbytes / write_s / 1e9,
            "read_cold_s": read_s, "read_GBps": nbytes / read_s / 1e9,
            "method": "one file written in 64 MiB write()s and fsynced, then read back with "
                      "64 MiB readinto()s after posix_fadvise(DONTNEED)"}
