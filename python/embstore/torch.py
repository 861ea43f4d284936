"""embstore.torch: torch embedding modules whose rows live in embstore tables.

The forward pass looks rows up (inserting new keys in training mode); the backward pass hands
the rows' gradient to the table's fused optimizer (embstore_apply_gradients), so the update
happens during loss.backward(), as in TorchRec's fused embedding bags: the table's rows never
pass through a torch optimizer, and the modules have no parameters. Give the torch optimizer
the dense parameters only (model.parameters() holds no embstore rows).

    store = embstore.Store("host")
    bag = embstore.torch.EmbeddingBag(store, "items", 64, mode="sum", optimizer="adagrad",
                                      learning_rate=0.05)
    pooled = bag(ids, offsets)            # (bags, 64)
    loss.backward()                        # Adagrad on the rows the batch read
    store.step(step)
    embstore.torch.checkpoint(store, "/ckpt", "incremental", model=mlp, optimizer=opt)

Host stores take CPU tensors, CUDA stores CUDA tensors on the store's device (torch's current
stream is passed as the stream).

On a sharded store (Store("host", comm=ProcessGroup()) in every process of a torch.distributed
gloo group) the modules look up and update through the collective calls (sharded_lookup,
sharded_apply_gradients): every rank runs forward and backward of each module in the same
order, with its own batch, and the ranks train as one process on their batches concatenated in
rank order.

Each forward's backward runs the optimizer once, on that forward's rows. So a table used twice
in one step (a shared table, or gradient accumulation over micro-batches) is updated twice,
not once on the summed gradient as a torch optimizer would: look all of a step's ids up in one
call instead (concatenate them). A second backward through the same graph would apply the
gradient again.

A module binds the store's table of its name when one exists (created by an earlier module or
by a restore); that table keeps its own configuration, and the module's table options apply
only when the module creates the table.
"""

import io

import torch
import torch.nn.functional as F
from torch import nn

from . import _lib
from .comm import Communicator
from .errors import InvalidArgumentError, NotFoundError
from .store import LATEST


class _TableLookup(torch.autograd.Function):
    """rows = lookup(keys); backward: apply_gradients(keys, d rows). The modules always make the
    sharded calls: on a store of one rank the library makes them the plain ones."""

    @staticmethod
    def forward(ctx, anchor, keys, table):
        ctx.table = table
        ctx.save_for_backward(keys)
        return table.sharded_lookup(keys, insert=True)

    @staticmethod
    def backward(ctx, grad_rows):
        (keys,) = ctx.saved_tensors
        ctx.table.sharded_apply_gradients(keys, grad_rows)
        return None, None, None


def _bind_table(store, name, dim, table_options):
    """The store's table `name` when it exists (created by an earlier module or a restore):
    its dim must match, and it keeps its own configuration; else a new table."""
    try:
        table = store.table(name)
    except NotFoundError:
        return store.create_table(name, dim, **table_options)
    if table.dim != dim:
        raise InvalidArgumentError(1, f"table {name!r} exists with dim {table.dim}, not {dim}")
    return table


class _TableModule(nn.Module):
    def __init__(self, store, name, dim, table_options):
        super().__init__()
        self.store = store
        self.table = _bind_table(store, name, dim, table_options)
        self.embedding_dim = dim
        # The autograd graph needs an input that requires grad to call backward; this one is
        # neither a parameter nor a buffer, so no optimizer and no state_dict sees it.
        self._anchor = torch.zeros((), requires_grad=True)

    def _rows(self, keys):
        """The rows of keys (flat int64): through autograd when training with grad enabled."""
        if self.training and torch.is_grad_enabled():
            return _TableLookup.apply(self._anchor, keys, self.table)
        return self.table.sharded_lookup(keys, insert=self.training)

    def _checked_input(self, check):
        """check()'s result (the input, checked). When it raises on a sharded store, this rank
        still makes the forward's collective lookup, with arguments the library refuses, so
        that the other ranks fail at once instead of waiting for it in the communicator."""
        try:
            return check()
        except Exception:
            self.table._refuse(_lib.sharded_lookup)
            raise

    def extra_repr(self):
        """The table's name and dim, for the module's repr."""
        return f"table={self.table.name!r}, dim={self.embedding_dim}"


def _keys(input):
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: a tensor of ids is expected, got {type(input).__name__}")
    if input.is_floating_point() or input.is_complex() or input.dtype == torch.bool:
        raise TypeError(f"input: integer ids are expected, got {input.dtype}")
    return input.reshape(-1).to(torch.int64)


class Embedding(_TableModule):
    """Like nn.Embedding: (*) ids -> (*, dim) rows. Table options (optimizer, learning_rate,
    epsilon, init, seed, max_capacity ...) are those of Store.create_table."""

    def __init__(self, store, name, embedding_dim, **table_options):
        super().__init__(store, name, embedding_dim, table_options)

    def forward(self, input):
        """The rows of input's ids (any integer dtype), shaped input.shape + (embedding_dim,).
        In training mode, new ids get rows and the backward pass updates the rows read."""
        rows = self._rows(self._checked_input(lambda: _keys(input)))
        return rows.view(*input.shape, self.embedding_dim)


class EmbeddingBag(_TableModule):
    """Like nn.EmbeddingBag: pools the rows of each bag by "sum" or "mean". input is 2-D
    (bags of equal length, no offsets) or 1-D with offsets (each bag's start;
    include_last_offset as in torch). per_sample_weights with mode "sum" only."""

    def __init__(self, store, name, embedding_dim, mode="mean", include_last_offset=False,
                 **table_options):
        if mode not in ("sum", "mean"):
            raise InvalidArgumentError(1, f"mode {mode!r}: 'sum' or 'mean'")
        super().__init__(store, name, embedding_dim, table_options)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input, offsets=None, per_sample_weights=None):
        """The pooled rows of each bag, shaped (bags, embedding_dim): input 2-D (one bag per
        row) or 1-D with offsets; per_sample_weights (mode "sum") scale the rows. In training
        mode, new ids get rows and the backward pass updates the rows read."""
        keys, offsets, weights = self._checked_input(
            lambda: self._check(input, offsets, per_sample_weights))
        rows = self._rows(keys)
        if input.dim() == 2:
            bags, length = input.shape
            rows = rows.view(bags, length, self.embedding_dim)
            if weights is not None:
                rows = rows * weights.reshape(bags, length, 1).to(rows.dtype)
            if length == 0:
                return rows.new_zeros(bags, self.embedding_dim)
            return rows.sum(1) if self.mode == "sum" else rows.mean(1)
        if weights is not None:
            weights = weights.to(rows.dtype)
        # Each looked-up row is used once: embedding_bag over the rows themselves pools them
        # and gives each its gradient.
        index = torch.arange(keys.numel(), device=rows.device)
        return F.embedding_bag(index, rows, offsets, mode=self.mode,
                               per_sample_weights=weights,
                               include_last_offset=self.include_last_offset)

    def _check(self, input, offsets, per_sample_weights):
        """(keys, offsets as int64 or None, per_sample_weights), or raises for bad input."""
        keys = _keys(input)
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise InvalidArgumentError(1, "per_sample_weights needs mode 'sum'")
            if per_sample_weights.numel() != keys.numel():
                raise InvalidArgumentError(
                    1, f"per_sample_weights: {per_sample_weights.numel()} weights for "
                    f"{keys.numel()} ids")
        if input.dim() == 2:
            if offsets is not None:
                raise InvalidArgumentError(1, "offsets must be None for a 2-D input")
            return keys, None, per_sample_weights
        if input.dim() != 1 or offsets is None:
            raise InvalidArgumentError(1, "input: 2-D, or 1-D with offsets")
        offsets = offsets.reshape(-1).to(torch.int64)
        if offsets.numel() == 0:
            if keys.numel():
                raise InvalidArgumentError(1, "offsets: empty for a non-empty input")
        elif (offsets[0] != 0 or bool((offsets[1:] < offsets[:-1]).any()) or
              offsets[-1] > keys.numel()):
            raise InvalidArgumentError(1, "offsets: nondecreasing from 0, within the input")
        return keys, offsets, per_sample_weights


# ---------------------------------------------------------------------- process groups --

class ProcessGroup(Communicator):
    """A torch.distributed process group as a sharded store's communicator:

        dist.init_process_group("gloo", ...)
        store = embstore.Store("host", comm=embstore.torch.ProcessGroup())

    group: a group of torch.distributed (None: the default group) whose backend runs
    collectives on CPU tensors (gloo; NCCL's take CUDA tensors). The store's exchanges are
    all_gather and all_to_all_single on it, made on the thread of the embstore call: every rank
    must make the store's collective calls in the same order, among its own collectives."""

    def __init__(self, group=None):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise InvalidArgumentError(1, "ProcessGroup: torch.distributed is not initialized "
                                       "(call torch.distributed.init_process_group first)")
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if self.rank < 0:
            raise InvalidArgumentError(1, "ProcessGroup: this process is not in the group")

    def all_gather(self, send, recv):
        """Communicator.all_gather through torch.distributed.all_gather on the group."""
        out = torch.from_numpy(recv)
        parts = list(out.chunk(self.world_size)) if out.numel() else [out] * self.world_size
        self._dist.all_gather(parts, _read_only_tensor(send), group=self.group)

    def all_to_all(self, send, send_counts, recv, recv_counts):
        """Communicator.all_to_all through torch.distributed.all_to_all_single on the
        group."""
        self._dist.all_to_all_single(torch.from_numpy(recv), _read_only_tensor(send),
                                     output_split_sizes=recv_counts,
                                     input_split_sizes=send_counts, group=self.group)


def _read_only_tensor(a):
    """A tensor over the library's send buffer (a read-only view of writable memory), without a
    copy: the collectives only read it. A writable view of the same memory, since torch warns
    about read-only arrays (and catching the warning would reset the warnings registry at
    every exchange)."""
    v = a.view()
    if v.size:
        v.flags.writeable = True  # allowed: the view's base, the ctypes array, is writable
    return torch.from_numpy(v)


# ------------------------------------------------------------------------ trainer state --

def _state_of(objects):
    return {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in objects.items()}


def attach_state(store, name="trainer", **objects):
    """Saves with the store's next checkpoint, as the attachment `name`, the state of each
    keyword argument: state_dict() of modules and optimizers (dense parameters, the torch
    optimizer's state), other values as they are (step counters, RNG states: tensors, numbers,
    strings, lists and dicts of them)."""
    buf = io.BytesIO()
    torch.save(_state_of(objects), buf)
    store.attach(name, buf.getbuffer())


def load_state(store, name="trainer", **objects):
    """Loads the attachment `name` of the store's last restore (see attach_state) into the
    modules and optimizers given as keyword arguments (load_state_dict); returns the whole saved
    dict (the other values in it). The bytes come from disk: they are unpickled with
    weights_only=True (tensors, numbers, strings and containers only)."""
    return load_state_bytes(store.restore_attachment(name), name, **objects)


def load_state_bytes(raw, name="trainer", **objects):
    """load_state from the attachment's bytes, read elsewhere (by another rank, say: a trainer
    whose ranks hold replicas can send rank 0's to all). `name` is for errors only."""
    state = torch.load(io.BytesIO(raw), weights_only=True)
    if not isinstance(state, dict):
        raise InvalidArgumentError(1, f"attachment {name!r} does not hold a trainer state")
    for key, obj in objects.items():
        if key not in state:
            raise NotFoundError(2, f"attachment {name!r} holds no state for {key!r}")
        obj.load_state_dict(state[key])
    return state


def checkpoint(store, dir, kind="incremental", *, wait=False, name="trainer", **objects):
    """attach_state(store, name, **objects), then store.checkpoint(dir, kind, wait=wait):
    one checkpoint of the tables and the rest of the trainer; returns its version."""
    attach_state(store, name, **objects)
    return store.checkpoint(dir, kind, wait=wait)


def restore(store, dir, version=LATEST, *, name="trainer", **objects):
    """store.restore(dir, version), then load_state(store, name, **objects); returns
    (version, state)."""
    v = store.restore(dir, version)
    return v, load_state(store, name, **objects)
