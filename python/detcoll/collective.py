"""The communicator users hold: the seeds' call shape over one rank of the Rust collective.

Calls are asynchronous on CUDA, as in NCCL: a call returns once enqueued on the tensor's
current stream, and a failure the device detects later is raised by ``check()`` /
``synchronize()`` and by every later call. On the CPU twin a call is done when it returns.
"""

import functools
import operator
import sys
import threading
from typing import List, Optional, Sequence

from . import _detcoll
from ._tensor import View, default_stream, ext_dtype, new_empty, torch_write_check, view, written


# Per thread: whether the collective call in progress reached the extension's raw call.
_reached = threading.local()


def _counted(method):
    """A collective call whose refusal here, before the raw call (a tensor on another device,
    a read-only output, a shape the wrapper refuses), counts as a call all the same
    (``Communicator.count_refused_call``): the Rust collective numbers every call a rank makes
    or refuses and signs its launches with that number, so peers that made a call this rank
    refused fail with ``SignatureMismatch`` instead of pairing their next call with this rank's
    next one (which returned another call's sums as success). Ranks that all refuse the same
    call stay in step. Refusals past the raw call are counted there."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        _reached.flag = False
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            if not _reached.flag:
                try:
                    self._raw.count_refused_call()
                except Exception:  # a closed or forked handle: its next call fails anyway
                    pass
            raise

    return call


# What ``Collective.route`` answers for.
_ROUTED_OPS = ("all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_many", "all_reduce_residual_rmsnorm")


class Collective:
    """One rank of a deterministic collective: every reduction is the fixed balanced rank tree
    ``((r0 + r1) + (r2 + r3)) + ...`` in the tensor's dtype, the same bits on every rank, run,
    route and message size."""

    def __init__(self, raw: "_detcoll.Communicator", device_index: Optional[int] = None):
        self._raw = raw
        self._platform = raw.platform
        self._device_index = device_index

    # -- properties ------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self._raw.world_size

    @property
    def rank(self) -> int:
        return self._raw.rank

    @property
    def platform(self) -> str:
        """``"cpu"`` (the CPU twin: host tensors) or ``"cuda"`` (device tensors)."""
        return self._platform

    @property
    def capabilities(self) -> dict:
        return self._raw.capabilities()

    @property
    def supports_async_overlap(self) -> bool:
        return bool(self._raw.capabilities()["supports_async_overlap"])

    @property
    def supports_compute_communication_fusion(self) -> bool:
        return bool(self._raw.capabilities()["supports_compute_communication_fusion"])

    @property
    def raw(self) -> "_detcoll.Communicator":
        """The extension's communicator (raw addresses; for tools and tests)."""
        return self._raw

    def __repr__(self) -> str:
        return f"detcoll.Collective(rank={self.rank}, world_size={self.world_size}, platform={self._platform!r})"

    # -- tensors ---------------------------------------------------------------------------
    def _view(self, x, what: str, write: bool = False) -> View:
        v = view(x, what)
        kind, index = v.device
        if kind != self._platform:
            raise _detcoll.WrongDevice(
                f"{what}: a {kind} tensor, but this collective runs on {self._platform}"
                + (" (create it with device='cuda')" if kind == "cuda" else " (create it with device='cpu')")
            )
        if kind == "cuda" and index is not None and self._device_index is not None and index != self._device_index:
            raise _detcoll.WrongDevice(f"{what}: on cuda:{index}, but this collective runs on cuda:{self._device_index}")
        if write:
            self._check_write(v, x, what)
        if v.stream is None:  # an array interface without a stream: the one synchronize() waits on
            v.stream = default_stream(index if index is not None else self._device_index)
        return v

    @staticmethod
    def _check_write(v: View, x, what: str) -> None:
        """Refuses to write ``x`` (its view ``v``): read-only memory, and a torch tensor torch's
        own in-place ops refuse to write (``torch_write_check``)."""
        if not v.writable:
            np = sys.modules.get("numpy")
            if np is not None and isinstance(x, np.generic):
                raise _detcoll.InvalidArgument(
                    f"{what}: a numpy scalar is immutable (read-only); pass a 0-d array (numpy.array(x)) to write into")
            raise _detcoll.InvalidArgument(f"{what}: the array is read-only")
        if v.tensor is not None:
            torch_write_check(v.tensor, what)

    def _call(self, op: str, vin: View, vout: View, in_addr: Optional[int] = None, *also_written: View) -> None:
        reduces = op if op != "all_gather" else None
        args = (op, vin.addr if in_addr is None else in_addr, vin.count, ext_dtype(vin, reduces),
                vout.addr, vout.count, ext_dtype(vout), vin.stream)
        _reached.flag = True
        self._raw.call(*args)
        written(vout, *also_written)

    @_counted
    def all_reduce(self, x, out=None):
        """The fixed tree over every rank's ``x``; into ``x`` (in place) when ``out`` is None,
        else into ``out`` (same size and dtype). Returns the tensor written."""
        if out is None or out is x:
            v = self._view(x, "x", write=True)
            self._call("all_reduce", v, v)
            return x
        self._call("all_reduce", self._view(x, "x"), self._view(out, "out", write=True))
        return out

    @_counted
    def all_gather(self, x, out=None):
        """Every rank's ``x`` concatenated in rank order along dim 0 (``out``: ``world_size``
        times ``x``'s elements; allocated when None). ``x`` may be ``out``'s shard ``rank``
        (NCCL's in-place form). Any plain dtype."""
        vin = self._view(x, "x")
        if out is None:
            shape = vin.shape or (1,)
            out = new_empty(x, (self.world_size * shape[0],) + tuple(shape[1:]))
        vout = self._view(out, "out", write=True)
        in_addr = None
        if vin.count and vin.addr == vout.addr + self.rank * vin.nbytes and vout.count == self.world_size * vin.count:
            in_addr = vout.addr  # in place: this rank's contribution already sits at its shard
        elif vin.count and vin.addr == vout.addr:
            # ``x`` starts ``out`` but is not its shard ``rank``: not the in-place form. The raw
            # call reads equal addresses as in place (the contribution taken from shard
            # ``rank``), which would return every rank a wrong ``out`` without an error.
            raise _detcoll.Overlap(
                f"all_gather: x overlaps out at out's start but is not out's shard {self.rank} "
                f"(the in-place form is x = out's shard rank); use a separate x"
            )
        self._call("all_gather", vin, vout, in_addr)
        return out

    @_counted
    def reduce_scatter(self, x, out=None):
        """Shard ``rank`` (along dim 0) of the fixed tree over every rank's ``x``, into
        ``out`` (allocated when None). NCCL's in-place form: ``out`` is ``x``'s shard ``rank``
        (``x.chunk(world_size)[rank]``, as ``reduce_scatter_tensor`` is called in place), or
        ``out is x``; the shard lands there, and ``x``'s other shards are unspecified
        afterwards."""
        vin = self._view(x, "x", write=out is x)
        if out is x:
            self._call("reduce_scatter", vin, vin)
            return x
        if out is None:
            out = new_empty(x, self._shard_shape(vin))
        vout = self._view(out, "out", write=True)
        shard = vout.nbytes
        if vout.count and vin.addr <= vout.addr < vin.addr + vin.nbytes:
            if vin.count != self.world_size * vout.count or vout.addr != vin.addr + self.rank * shard:
                # Inside x but not its shard ``rank``: the call would read x while writing it.
                raise _detcoll.Overlap(
                    f"reduce_scatter: out lies inside x but is not x's shard {self.rank} of "
                    f"{self.world_size} (the in-place form is out = x's shard rank); use a separate out"
                )
            if vout.dtype != vin.dtype:  # as the out-of-place form's check (the extension's)
                raise _detcoll.DtypeMismatch(
                    f"reduce_scatter: `out` is {vout.dtype} but `input` is {vin.dtype}; they must match "
                    "(in place: out is x's shard)")
            self._check_write(vin, x, "x (in place: out is its shard)")
            # in place: the result lands at shard ``rank``
            self._call("reduce_scatter", vin, vin, None, vout)
            return out
        self._call("reduce_scatter", vin, vout)
        return out

    @_counted
    def reduce_scatter_many(self, xs: Sequence, outs: Optional[Sequence] = None) -> List:
        """Independent reduce_scatters under one synchronisation, one tree per lane (never
        mixed): lane ``i`` reduces ``xs[i]`` into ``outs[i]`` (allocated when None). One dtype
        for every lane. A lane runs in place, as ``reduce_scatter``, when ``outs[i]`` is
        ``xs[i]`` or ``xs[i]``'s shard ``rank`` (NCCL's in-place form); ``xs[i]``'s other shards
        are unspecified afterwards."""
        xs = list(xs)
        if outs is not None and len(outs) != len(xs):
            raise _detcoll.LengthMismatch(f"reduce_scatter_many: {len(xs)} inputs but {len(outs)} outputs")
        vins = [self._view(x, f"xs[{i}]") for i, x in enumerate(xs)]
        if outs is None:
            outs = [new_empty(x, self._shard_shape(v, "reduce_scatter_many")) for x, v in zip(xs, vins)]
        outs = list(outs)
        lanes, writes = [], []
        for i, (vin, out) in enumerate(zip(vins, outs)):
            if out is xs[i]:
                # In place: the input is the output, so it must be writable too.
                self._check_write(vin, xs[i], f"outs[{i}] (in place, xs[{i}])")
                vout = vin
            else:
                vout = self._view(out, f"outs[{i}]", write=True)
                if vout.count and vin.addr <= vout.addr < vin.addr + vin.nbytes:
                    # Inside xs[i]: NCCL's in-place form when it is xs[i]'s shard ``rank`` (as
                    # reduce_scatter takes it): the lane runs in place, its result landing there.
                    if vin.count != self.world_size * vout.count or vout.addr != vin.addr + self.rank * vout.nbytes:
                        raise _detcoll.Overlap(
                            f"reduce_scatter_many: outs[{i}] lies inside xs[{i}] but is not its shard {self.rank} "
                            f"of {self.world_size} (the in-place form is outs[i] = xs[i]'s shard rank); use a "
                            "separate output")
                    if vout.dtype != vin.dtype:
                        raise _detcoll.DtypeMismatch(
                            f"reduce_scatter_many: `outs[{i}]` is {vout.dtype} but `xs[{i}]` is {vin.dtype}; "
                            "they must match (in place: outs[i] is xs[i]'s shard)")
                    self._check_write(vin, xs[i], f"xs[{i}] (in place: outs[{i}] is its shard)")
                    writes.append(vout)
                    vout = vin
            writes.append(vout)
            lanes.append((vin.addr, vin.count, ext_dtype(vin, "reduce_scatter_many"), vout.addr, vout.count, ext_dtype(vout)))
        stream = vins[0].stream if vins else 0
        _reached.flag = True
        self._raw.call_many(lanes, stream)
        written(*writes)
        return outs

    @_counted
    def all_reduce_residual_rmsnorm(self, x, residual, weight, eps: float = 1e-6, out=None):
        """The end of a tensor-parallel decoder layer in one call: ``s`` = the fixed tree over
        every rank's ``x``, ``residual`` becomes ``h = residual + s`` (in the dtype, in place: the
        next layer's residual), and ``y = rmsnorm(h) * weight`` is written into ``out`` (``x``
        itself when None, as vLLM's ``fused_add_rms_norm`` overwrites its input). Rows are
        ``x``'s last dimension (``hidden``); ``residual`` and ``out`` have ``x``'s shape and
        dtype, ``weight`` ``hidden`` elements of it; f32, f16 or bf16.

        The norm is evaluated in a fixed order that depends only on ``hidden``
        (``fixed_tree::residual_rmsnorm``: f32 sum of squares over 256 lanes, then a halving
        tree), so ``h`` and ``y`` have the same bits on every rank, run, route, batch size and
        TP size. On CUDA the all_reduce and the norm are one kernel on the IPC routes for up to
        64 rows (and no more rows than a launch has blocks), at any row count on one-shot for
        f16/bf16 rows of 4096 (each row normalised in registers after its reduce) and from 512
        rows on RS+AG in one launch; otherwise the norm is a second launch on the same stream.
        Returns ``(y, residual)``."""
        if not (hasattr(type(eps), "__float__") or hasattr(type(eps), "__index__")):
            # float("1e-6") would parse a string: a number is asked for, as the README says
            raise TypeError(f"all_reduce_residual_rmsnorm: eps must be a number, not {type(eps).__name__}")
        vx = self._view(x, "x", write=out is None or out is x)
        vy = vx if out is None or out is x else self._view(out, "out", write=True)
        vr = self._view(residual, "residual", write=True)
        vw = self._view(weight, "weight")
        for name, v in (("residual", vr), ("out", vy)):
            # (a count that differs is the extension's LengthMismatch)
            if v is not vx and v.count == vx.count and tuple(v.shape) != tuple(vx.shape):
                raise _detcoll.InvalidArgument(
                    f"all_reduce_residual_rmsnorm: {name} has shape {tuple(v.shape)}, expected x's shape "
                    f"{tuple(vx.shape)} (its rows of {vx.shape[-1] if vx.shape else vx.count})")
        hidden = vx.shape[-1] if vx.shape else vx.count
        args = (
            (vx.addr, vx.count, ext_dtype(vx, "all_reduce_residual_rmsnorm")), (vy.addr, vy.count, ext_dtype(vy)),
            (vr.addr, vr.count, ext_dtype(vr)), (vw.addr, vw.count, ext_dtype(vw)),
            hidden, float(eps), vx.stream,
        )
        _reached.flag = True
        self._raw.all_reduce_residual_rmsnorm(*args)
        written(vy, vr)
        return (x if out is None else out), residual

    def _shard_shape(self, v: View, op: str = "reduce_scatter"):
        shape = v.shape or (1,)
        if shape[0] % self.world_size:
            if not v.shape:
                raise _detcoll.NotDivisible(
                    f"{op}: the input is 0-d (a scalar): it cannot be split into {self.world_size} shards "
                    f"(pass a tensor whose dim 0 splits into {self.world_size})"
                )
            raise _detcoll.NotDivisible(
                f"{op}: dim 0 of the input is {shape[0]}, which does not split into "
                f"{self.world_size} equal shards (pass out= for a flat split)"
            )
        return (shape[0] // self.world_size,) + tuple(shape[1:])

    # -- state -----------------------------------------------------------------------------
    def route(self, op: str, nbytes: int) -> str:
        """The route a call of ``op`` moving ``nbytes`` per rank takes (the same on every rank).
        ``op`` is ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``reduce_scatter_many`` or
        ``all_reduce_residual_rmsnorm`` (the fused call's all_reduce: the routing table's rules
        for it, else the all_reduce's)."""
        if op not in _ROUTED_OPS:
            raise _detcoll.InvalidArgument(f"route: unknown operation {op!r}; expected one of {', '.join(_ROUTED_OPS)}")
        n = operator.index(nbytes)  # a TypeError for a non-integer, as before
        if not 0 <= n < 1 << 64:
            raise _detcoll.InvalidArgument(f"route: nbytes is {n}; expected a byte count from 0 to 2**64 - 1")
        return self._raw.route(op, n)

    def check(self) -> None:
        """Raises the first failure any call recorded (never blocks)."""
        self._raw.check()

    def synchronize(self, stream=None) -> None:
        """Waits until ``stream`` (default: torch's current stream of this device when torch is
        imported, else the legacy default stream; a ``torch.cuda.Stream``, CuPy stream or raw
        ``CUstream`` int) has run every call enqueued on it, then ``check()``. Read results
        after it returns."""
        self._raw.synchronize(self._stream_handle(stream))

    def _stream_handle(self, stream) -> int:
        if self._platform != "cuda":
            return 0
        if stream is None:  # the stream of calls whose tensor names none (_tensor.default_stream)
            return default_stream(self._device_index)
        for attr in ("cuda_stream", "ptr"):  # torch, CuPy
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        return int(stream)

    def close(self) -> None:
        """Collective close (every rank calls it); later calls raise ``detcoll.Closed``."""
        self._raw.close()

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Stops this rank for good, as ``ncclCommAbort`` / ``ProcessGroupNCCL.abort()`` do
        (no peer needs to call it; e.g. when another group of this rank failed): later calls
        raise ``detcoll.Poisoned`` naming ``reason``, and a peer waiting for this rank raises
        ``detcoll.PeerFailed`` at once instead of waiting for its timeout. ``close()`` still
        frees the handle afterwards."""
        self._raw.abort(str(reason))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
