"""Arrays in and out of the C calls without copies: numpy arrays and torch tensors (CPU, or CUDA
by pointer with the current CUDA stream). A copy is made only to convert an input that is not
already contiguous of the right dtype (int64 keys, float32 values); outputs are allocated once
and written by the library in place."""

import numpy as np


def is_torch(x):
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


class Buffer:
    """A pointer the library may read or write, with what keeps its memory alive."""

    __slots__ = ("ptr", "shape", "owner", "cuda_device")

    def __init__(self, ptr, shape, owner, cuda_device):
        self.ptr = ptr
        self.shape = tuple(shape)
        self.owner = owner
        self.cuda_device = cuda_device  # None: host memory

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


def _check_unsigned_keys(a, name):
    """Unsigned 64-bit keys of 2^63 and above have no int64 value: converting them would make
    2^64 - 1 the key -1."""
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size and int(a.max()) >= 2**63:
        raise ValueError(f"{name}: unsigned keys of 2^63 and above do not fit int64 keys "
                         f"(the largest is {int(a.max())})")


def _torch_buffer(t, torch_dtype, name):
    import torch  # the caller passed a tensor, so torch is imported

    t = t.detach()
    if getattr(torch, "uint64", None) is not None and t.dtype == torch.uint64:
        _check_unsigned_keys(t.cpu().numpy(), name)
    if t.dtype != torch_dtype:
        # An empty float tensor converts, as an empty numpy array does (torch.tensor([]) is
        # float: a rank's empty batch of ids may well be one).
        if t.is_complex() or t.dtype == torch.bool or (
                t.is_floating_point() and not torch_dtype.is_floating_point and t.numel() > 0):
            raise TypeError(f"{name}: a tensor of {t.dtype} where {torch_dtype} is expected")
        t = t.to(torch_dtype)
    t = t.contiguous()
    cuda_device = t.device.index if t.device.type == "cuda" else None
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: tensors on {t.device.type} are not supported (cpu or cuda)")
    return Buffer(t.data_ptr(), t.shape, t, cuda_device)


def _numpy_buffer(x, dtype, name):
    a = np.asarray(x)
    if a.dtype != dtype:
        # By kind, not numpy's type tree: timedelta64 is an integer there.
        integer_expected = np.dtype(dtype).kind == "i"
        if integer_expected and a.dtype.kind not in "iu":
            if a.size == 0 and a.dtype.kind in "iufb":
                a = a.astype(dtype)
            else:
                raise TypeError(f"{name}: integers expected, got an array of {a.dtype}")
        elif not integer_expected and a.dtype.kind not in "iuf":
            raise TypeError(f"{name}: numbers expected, got an array of {a.dtype}")
        if integer_expected:
            _check_unsigned_keys(a, name)
        a = a.astype(dtype)
    # C-contiguous and aligned for the C side (copies only an array that is not); keeps 0-d.
    a = np.require(a, dtype, ["C", "A"])
    return Buffer(a.ctypes.data, a.shape, a, None)


def keys_buffer(keys):
    if is_torch(keys):
        import torch
        return _torch_buffer(keys, torch.int64, "keys")
    return _numpy_buffer(keys, np.int64, "keys")


def floats_buffer(x, name):
    if is_torch(x):
        import torch
        return _torch_buffer(x, torch.float32, name)
    return _numpy_buffer(x, np.float32, name)


def output_buffer(like, shape, out):
    """The float32 output of a lookup: `out` when given (checked: contiguous, writable, of that
    shape and kind of memory), else a new array of the kind of `like` (a torch tensor for a
    tensor, on its device; numpy otherwise)."""
    if out is not None:
        if is_torch(out):
            import torch
            if out.dtype != torch.float32 or not out.is_contiguous():
                raise ValueError("out: a contiguous float32 tensor is expected")
            if out.device.type not in ("cpu", "cuda"):
                raise ValueError(f"out: tensors on {out.device.type} are not supported")
            if tuple(out.shape) != tuple(shape):
                raise ValueError(f"out: shape {tuple(out.shape)}, expected {tuple(shape)}")
            cuda_device = out.device.index if out.device.type == "cuda" else None
            return Buffer(out.data_ptr(), out.shape, out, cuda_device)
        if not isinstance(out, np.ndarray):
            raise TypeError("out: a numpy array or a torch tensor is expected")
        if (out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable or
                not out.flags.aligned):
            raise ValueError("out: a writable, aligned, C-contiguous float32 array is expected")
        if out.shape != tuple(shape):
            raise ValueError(f"out: shape {out.shape}, expected {tuple(shape)}")
        return Buffer(out.ctypes.data, out.shape, out, None)
    if like.cuda_device is not None or is_torch(like.owner):
        import torch
        device = like.owner.device
        t = torch.empty(tuple(shape), dtype=torch.float32, device=device)
        return Buffer(t.data_ptr(), t.shape, t, like.cuda_device)
    a = np.empty(tuple(shape), dtype=np.float32)
    return Buffer(a.ctypes.data, a.shape, a, None)


def stream_handle(stream, buffers):
    """The cudaStream_t to pass: `stream` when given (an int, or an object with .cuda_stream
    such as torch.cuda.Stream), else torch's current stream on the device of a CUDA tensor among
    buffers, else NULL."""
    if stream is not None:
        handle = int(getattr(stream, "cuda_stream", stream))
        # The tensors (temporaries among them) were allocated on torch's current stream; the
        # work goes on another: tell torch's caching allocator not to reuse their memory until
        # that stream's work is done.
        for b in buffers:
            if b.cuda_device is not None and is_torch(b.owner):
                import torch
                b.owner.record_stream(torch.cuda.ExternalStream(handle, device=b.owner.device))
        return handle
    for b in buffers:
        if b.cuda_device is not None and is_torch(b.owner):
            import torch
            return torch.cuda.current_stream(b.owner.device).cuda_stream
    return None
