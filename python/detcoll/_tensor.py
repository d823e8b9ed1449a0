"""What a call needs from a tensor: address, element count, dtype, device, stream.

Read from the tensor's own interface, in this order: a torch tensor (``data_ptr``, torch's
current stream), ``__cuda_array_interface__`` (CuPy, Numba: its ``stream``),
``__array_interface__`` (numpy), ``__dlpack__`` (anything else). Nothing is copied: a
non-contiguous or read-only tensor is refused (``detcoll.NotContiguous``,
``detcoll.InvalidArgument``) instead of silently staged.

The stream of a CUDA call: torch's current stream of the device for a torch tensor; the
``stream`` of a ``__cuda_array_interface__`` when it names one; otherwise (no ``stream`` or
``None``, and every DLPack tensor) :func:`default_stream`, the stream ``synchronize()`` waits on
by default. A DLPack producer is asked for that stream (``__dlpack__(stream=...)``), so it
orders its pending work before the call, as the DLPack protocol has it.
"""

import ctypes
import operator
import sys
from typing import Any, Optional, Tuple

from . import _detcoll

# torch / numpy dtype names -> detcoll's (collective_core::DType names).
_NAMES = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
    "uint8": "u8", "int8": "i8", "uint16": "u16", "int16": "i16",
    "uint32": "u32", "int32": "i32", "uint64": "u64", "int64": "i64", "bool": "bool",
}
# Array-interface typestr (kind, size) -> detcoll dtype.
_TYPESTR = {
    ("f", 4): "f32", ("f", 2): "f16", ("f", 8): "f64",
    ("u", 1): "u8", ("i", 1): "i8", ("u", 2): "u16", ("i", 2): "i16",
    ("u", 4): "u32", ("i", 4): "i32", ("u", 8): "u64", ("i", 8): "i64", ("b", 1): "bool",
}
_SIZES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "u8": 1, "i8": 1, "u16": 2, "i16": 2,
          "u32": 4, "i32": 4, "u64": 8, "i64": 8, "bool": 1}
# Names the extension does not have: bool travels as its bytes (u8) where nothing is added
# (`ext_dtype`), and a reduction of bools is refused naming bool, not u8.
_AS_BYTES = {"bool": "u8"}


class View:
    """One tensor as the extension sees it (slots: built on every call, so kept cheap)."""

    __slots__ = ("addr", "count", "dtype", "shape", "device", "stream", "writable", "keep", "tensor")

    def __init__(self, addr: int, count: int, dtype: str, shape: Tuple[int, ...],
                 device: Tuple[str, Optional[int]], stream: Optional[int], writable: bool, keep: Any = None,
                 tensor: Any = None):
        self.addr, self.count, self.dtype, self.shape = addr, count, dtype, shape
        self.device = device  # ("cpu", None) or ("cuda", ordinal or None if unknown)
        # CUstream to enqueue on (0: the legacy default stream; CPU: 0); None: the tensor named
        # none, the collective puts the default_stream() of its device here
        self.stream = stream
        self.writable = writable
        self.keep = keep  # keeps a DLPack capsule alive for the call
        self.tensor = tensor  # the torch tensor read (None otherwise): autograd's checks and version

    @property
    def nbytes(self) -> int:
        return self.count * _SIZES[self.dtype]


def ext_dtype(v: View, op: Optional[str] = None) -> str:
    """The extension's name of ``v``'s dtype. ``op`` given (a reduction: all_reduce,
    reduce_scatter, ...): a dtype with no arithmetic there (bool) is refused here, by its own
    name, before any work; otherwise bool travels as u8, byte for byte."""
    det = _AS_BYTES.get(v.dtype)
    if det is None:
        return v.dtype
    if op is not None:
        raise _detcoll.UnsupportedDtype(f"{op} does not reduce {v.dtype}: expected f32, f16 or bf16")
    return det


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _c_contiguous(shape, strides, itemsize) -> bool:
    """Whether ``strides`` (in bytes; None = C order) describe a dense C-order layout."""
    if strides is None or 0 in shape:  # an empty array has no layout to get wrong
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _dtype_error(name: str, what: str) -> Exception:
    return _detcoll.UnsupportedDtype(f"{what}: dtype {name} has no detcoll equivalent")


_CPU = ("cpu", None)
_TORCH_DTYPES = {}  # torch dtype object -> detcoll name, filled on the first torch tensor


def _torch_raw_stream(torch, index: int) -> int:
    """torch's current stream of device ``index`` as a CUstream value."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object: ~10x cheaper
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def default_stream(index: Optional[int]) -> int:
    """The stream of a CUDA call whose tensor names none (an array interface without ``stream``,
    every DLPack tensor), and the one ``Collective.synchronize()`` waits on by default: torch's
    current stream of CUDA device ``index`` (None: torch's current device) when torch is
    imported, else 0, the legacy default stream (CuPy's and Numba's default)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        if index is None:
            index = torch.cuda.current_device()
        return int(_torch_raw_stream(torch, index))
    except Exception:  # torch without CUDA (a CPU build, a stand-in): it has no stream to order on
        return 0


def _torch_view(x, what: str) -> View:
    import torch

    if not _TORCH_DTYPES:
        for name, det in _NAMES.items():
            if hasattr(torch, name):
                _TORCH_DTYPES[getattr(torch, name)] = det
    strided = getattr(torch, "strided", None)
    layout = getattr(x, "layout", strided)
    if layout is not strided or getattr(x, "is_nested", False):
        # sparse (no dense memory; is_contiguous raises for CSR) and nested tensors (their
        # memory is not one dense array of their shape)
        kind = "a nested tensor" if getattr(x, "is_nested", False) else "a tensor"
        raise _detcoll.InvalidArgument(
            f"{what}: {kind} of layout {layout}: detcoll takes dense (torch.strided) tensors "
            "(call .to_dense() or .contiguous() first)")
    dtype = _TORCH_DTYPES.get(x.dtype)
    if dtype is None:
        raise _dtype_error(str(x.dtype), what)
    # A lazy negation/conjugation view's memory holds the un-negated values: read or written as
    # they stand, every value would have the wrong sign.
    if getattr(x, "is_neg", _false)():
        raise _detcoll.InvalidArgument(
            f"{what}: a lazy negation view (is_neg()): its memory holds the values un-negated; "
            "call .resolve_neg() (or .clone()) first")
    if getattr(x, "is_conj", _false)():
        raise _detcoll.InvalidArgument(
            f"{what}: a lazy conjugate view (is_conj()): its memory holds the values unconjugated; "
            "call .resolve_conj() (or .clone()) first")
    try:
        contiguous = x.is_contiguous()
    except Exception as e:  # a layout or tensor subclass without strides
        raise _detcoll.InvalidArgument(f"{what}: the tensor has no dense layout ({type(e).__name__}: {e})") from None
    if not contiguous:
        raise _detcoll.NotContiguous(f"{what}: the tensor is not contiguous (call .contiguous())")
    if x.is_cuda:
        index = x.get_device()
        stream, device = _torch_raw_stream(torch, index), ("cuda", index)
    elif x.device.type == "cpu":
        stream, device = 0, _CPU
    else:
        raise _detcoll.WrongDevice(f"{what}: a tensor on {x.device}: detcoll takes CPU and CUDA tensors")
    try:
        addr = x.data_ptr()
    except Exception as e:  # no storage: vmap's batched tensors, functorch wrappers
        raise _detcoll.InvalidArgument(
            f"{what}: the tensor has no memory of its own to read ({type(e).__name__}: {e}); "
            "a vmap/functorch tensor cannot be passed to a collective") from None
    return View(addr, x.numel(), dtype, x.shape, device, stream, True, tensor=x)


def _false() -> bool:
    return False


def torch_write_check(x, what: str) -> None:
    """Refuses a write into torch tensor ``x`` where torch's own in-place ops refuse it: a leaf
    that requires grad (or a view of one) while grad mode is on, an inference tensor outside
    inference mode."""
    torch = sys.modules["torch"]
    is_inference = getattr(x, "is_inference", None)
    if is_inference is not None and is_inference() and not torch.is_inference_mode_enabled():
        raise _detcoll.InvalidArgument(
            f"{what}: an inference tensor (made under torch.inference_mode()) written outside inference mode, "
            "which torch refuses too; write it inside torch.inference_mode(), or write into a clone")
    if getattr(x, "requires_grad", False) and torch.is_grad_enabled():
        if x.is_leaf:
            raise _detcoll.InvalidArgument(
                f"{what}: a leaf tensor that requires grad is written in place, which torch refuses too "
                "(\"a leaf Variable that requires grad is being used in an in-place operation\"); "
                "write it under torch.no_grad(), or write into another tensor")
        base = x._base if x._is_view() else None
        if base is not None and base.is_leaf and base.requires_grad:
            raise _detcoll.InvalidArgument(
                f"{what}: a view of a leaf tensor that requires grad is written in place, which torch refuses "
                "too; write it under torch.no_grad(), or write into another tensor")


_bump = []  # [torch's increment_version, or None where it has none], found on the first write


def written(*views: View) -> None:
    """After a call wrote these views: bumps autograd's version counter of each torch tensor
    among them, as torch's own in-place ops do, so a backward that saved one before the write
    raises torch's "modified by an inplace operation" instead of using the new values."""
    for v in views:
        t = v.tensor
        if t is None:
            continue
        if not _bump:
            torch = sys.modules.get("torch")
            graph = getattr(getattr(torch, "autograd", None), "graph", None)
            _bump.append(getattr(graph, "increment_version", None))
        if _bump[0] is None:
            return
        try:
            _bump[0](t)
        except Exception:  # a stand-in or an older torch: nothing more to tell autograd
            pass


_NUMPY_DTYPES = {}  # numpy dtype object -> detcoll name (`dtype.name` costs more than the call)


def _numpy_view(x, what: str) -> View:
    """numpy arrays without building their interface dict."""
    dtype = _NUMPY_DTYPES.get(x.dtype)
    if dtype is None:
        dtype = _NAMES.get(x.dtype.name)
        if dtype is None:
            raise _dtype_error(x.dtype.name, what)
        if not x.dtype.isnative:
            raise _detcoll.UnsupportedDtype(f"{what}: dtype {x.dtype.str}: not the host's byte order")
        _NUMPY_DTYPES[x.dtype] = dtype
    flags = x.flags
    if not flags.c_contiguous:
        raise _detcoll.NotContiguous(f"{what}: the array is not C-contiguous (use ascontiguousarray)")
    return View(x.ctypes.data if x.size else 0, x.size, dtype, x.shape, _CPU, 0, flags.writeable)


def _numpy_scalar_view(x, what: str) -> View:
    """numpy scalars (``np.float32(1.5)``, ``a.sum()``): read from a 0-d array copy this view
    keeps for the call (their own interface is over a temporary array) and never written (a
    numpy scalar is immutable: as an output it is refused as read-only)."""
    a = x.__array__()
    v = _numpy_view(a, what)
    v.writable, v.keep = False, a
    return v


def _masked_view(x, what: str) -> View:
    """numpy masked arrays: refused, like a masked array interface. A collective reads and
    writes every element; the mask would be ignored (pass ``x.filled(value)`` or ``x.data``)."""
    raise _detcoll.InvalidArgument(
        f"{what}: a numpy masked array (a collective reads every element; pass x.filled(value) or x.data)"
    )


def _typestr_dtype(ai: dict, what: str) -> str:
    """detcoll's dtype of an array interface's ``typestr`` (``descr`` for ``V2``)."""
    typestr = str(ai["typestr"])
    order, kind, size = typestr[:1], typestr[1:2], typestr[2:]
    dtype = _TYPESTR.get((kind, int(size))) if size.isdigit() else None
    if kind == "V" and size == "2":
        # bf16: torch's and ml_dtypes' typestr (no standard one exists), unless ``descr`` says
        # it is a record of named fields
        descr = ai.get("descr")
        if not descr or all(not field[0] for field in descr):
            dtype = "bf16"
    if dtype is None:
        raise _dtype_error(typestr, what)
    if _SIZES[dtype] > 1 and order != ("<" if sys.byteorder == "little" else ">"):
        # another byte order (or "|" for a multi-byte type): the bits would be misread
        raise _detcoll.UnsupportedDtype(f"{what}: typestr {typestr}: not the host's byte order")
    return dtype


def _interface_view(x, ai: dict, device, what: str) -> View:
    dtype = _typestr_dtype(ai, what)
    if ai.get("mask") is not None:
        raise _detcoll.InvalidArgument(f"{what}: a masked array (the interface's mask is not None)")
    shape = tuple(int(s) for s in ai["shape"])
    if not _c_contiguous(shape, ai.get("strides"), _SIZES[dtype]):
        raise _detcoll.NotContiguous(f"{what}: the array is not C-contiguous (use ascontiguousarray)")
    addr, readonly, keep = _interface_data(x, ai, _prod(shape) * _SIZES[dtype], device, what)
    stream = 0
    if device[0] == "cuda":
        # CUDA array interface v3: an int names the stream (1 and 2 are the legacy and
        # per-thread default stream handles, CUstream values as they are); None or no entry
        # (v2, torch's own): the default stream, which the collective fills in.
        s = ai.get("stream")
        stream = None if s is None else int(s)
    return View(addr, _prod(shape), dtype, shape, device, stream, not readonly, keep)


def _interface_data(x, ai: dict, nbytes: int, device, what: str):
    """Where an array interface's ``nbytes`` bytes are: ``(address, read-only, what to keep
    alive for the call)``. ``data`` is an ``(address, read-only)`` pair, or (host memory only, as
    the numpy protocol allows) a buffer object — or None, the object's own buffer — read from
    ``offset``; a buffer is checked to hold the array. ``x``: the interface's object."""
    data = ai.get("data")
    if isinstance(data, tuple):
        try:
            if len(data) != 2:
                raise TypeError
            # The dict is kept for the call: it may be all that references the memory (a numpy
            # scalar's interface is over a temporary array held only by its "__ref").
            return int(operator.index(data[0] or 0)), bool(data[1]), ai
        except TypeError:
            raise _detcoll.InvalidArgument(
                f"{what}: the array interface's data is {data!r}, not an (address, read-only) pair") from None
    if device[0] != "cpu":
        raise _detcoll.InvalidArgument(
            f"{what}: the CUDA array interface's data is {type(data).__name__}, not an (address, read-only) pair")
    return _buffer_data(ai, x if data is None else data, data is None, nbytes, what)


class _PyBuffer(ctypes.Structure):  # CPython's Py_buffer (in the limited API since 3.11)
    _fields_ = [
        ("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)(
    ("PyObject_GetBuffer", ctypes.pythonapi))
_release_buffer = ctypes.PYFUNCTYPE(None, ctypes.POINTER(_PyBuffer))(("PyBuffer_Release", ctypes.pythonapi))


def _buffer_data(ai: dict, owner, own: bool, nbytes: int, what: str):
    """An array interface's buffer (``owner``: its ``data``, or with ``own`` the object itself) at
    ``offset``: its address, whether it is read-only, and the memoryview that keeps it exported
    (a bytearray cannot be resized, nor the object freed) for the call."""
    try:
        mv = memoryview(owner)
    except TypeError:
        source = "None and the object has no buffer" if own else f"a {type(owner).__name__}"
        raise _detcoll.InvalidArgument(
            f"{what}: the array interface's data is {source}: neither an (address, read-only) pair nor a "
            "buffer") from None
    if not mv.c_contiguous:
        raise _detcoll.NotContiguous(f"{what}: the array interface's data buffer is not contiguous")
    try:
        offset = int(operator.index(ai.get("offset") or 0))
    except TypeError:
        raise _detcoll.InvalidArgument(f"{what}: the array interface's offset {ai.get('offset')!r} is not an integer") from None
    if offset < 0 or offset + nbytes > mv.nbytes:
        raise _detcoll.InvalidArgument(
            f"{what}: the array interface's data buffer holds {mv.nbytes} bytes, not the array's {nbytes} "
            f"bytes at offset {offset}")
    if mv.nbytes == 0:
        return 0, mv.readonly, mv
    pb = _PyBuffer()
    _get_buffer(mv, ctypes.byref(pb), 0)  # PyBUF_SIMPLE; raises what the buffer raises
    try:
        base = pb.buf or 0
    finally:
        _release_buffer(ctypes.byref(pb))
    return base + offset, mv.readonly, mv


# DLPack: the C structs, read through ctypes. A "dltensor" capsule points at a DLManagedTensor,
# which starts with its DLTensor; a "dltensor_versioned" one (DLPack >= 1.0, which a producer
# returns only when asked, but reading it costs nothing) at a DLManagedTensorVersioned: version
# (2 x u32), manager_ctx, deleter, flags (u64, bit 0 read-only), then the DLTensor.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
    ]


_DL_KIND = {0: "i", 1: "u", 2: "f", 6: "b"}  # kDLInt, kDLUInt, kDLFloat, kDLBool; 4 is kDLBfloat
_DL_CPU = (1, 3)  # kDLCPU, kDLCUDAHost
_DL_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged
_VERSIONED_FLAGS, _VERSIONED_TENSOR = 24, 32  # byte offsets in DLManagedTensorVersioned

# Own prototypes of the C API calls (setting ctypes.pythonapi's argtypes would change them for
# every other user in the process).
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _dlpack_export(x, what: str):
    """``x``'s capsule, and the stream the call will go on if the producer was asked for one
    (else None: host memory, or exported as it stands). A CUDA tensor's producer is asked for
    that stream (``default_stream`` of its device; the legacy default stream is DLPack's 1,
    never 0) so it orders its pending work before the call; a producer without the ``stream``
    argument, or without ``__dlpack_device__`` (the device is then read from the capsule), is
    exported as it stands. A versioned capsule is asked for first (``max_version=(1, 0)``), so
    a read-only tensor can be exported as one (an input)."""
    try:
        device = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else None
        stream = None
        if device is not None and int(device[0]) in _DL_CUDA:
            stream = default_stream(int(device[1]))
        # Asked for a versioned capsule first (DLPack 1.0, `max_version`): only it can carry a
        # read-only tensor, which an input may be; a producer older than the argument (a
        # TypeError) is asked again without it, then without the stream.
        attempts = ([dict(stream=stream or 1, max_version=(1, 0)), dict(stream=stream or 1)] if stream is not None
                    else [dict(max_version=(1, 0))])
        for kwargs in attempts:
            try:
                return x.__dlpack__(**kwargs), stream
            except TypeError:
                pass
        capsule = x.__dlpack__()
    except _detcoll.DetcollError:
        raise
    except Exception as e:  # BufferError and the like: a tensor the producer will not export
        raise _detcoll.InvalidArgument(f"{what}: __dlpack__ refused: {type(e).__name__}: {e}") from e
    return capsule, None


def _dlpack_view(x, what: str) -> View:
    capsule, stream = _dlpack_export(x, what)
    try:
        name = _capsule_name(capsule)
        ptr = _capsule_pointer(capsule, name)
    except Exception as e:  # not a capsule
        raise _detcoll.InvalidArgument(
            f"{what}: __dlpack__ returned {type(capsule).__name__}, not a DLPack capsule") from e
    if name == b"dltensor":
        t, readonly = _DLTensor.from_address(ptr), False
    elif name == b"dltensor_versioned":
        t = _DLTensor.from_address(ptr + _VERSIONED_TENSOR)
        readonly = bool(ctypes.c_uint64.from_address(ptr + _VERSIONED_FLAGS).value & 1)
    else:  # "used_dltensor": consumed already
        raise _detcoll.InvalidArgument(f"{what}: __dlpack__ returned a capsule named {name!r}")
    code, bits = t.dtype.code, t.dtype.bits
    dtype = "bf16" if (code == 4 and bits == 16) else _TYPESTR.get((_DL_KIND.get(code, "?"), bits // 8))
    if dtype is None or t.dtype.lanes != 1 or bits % 8:
        raise _dtype_error(f"DLPack code {code} bits {bits} lanes {t.dtype.lanes}", what)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * _SIZES[dtype] for i in range(t.ndim))
    if not _c_contiguous(shape, strides, _SIZES[dtype]):
        raise _detcoll.NotContiguous(f"{what}: the tensor is not contiguous")
    kind = t.device.device_type
    if kind in _DL_CPU:
        device, stream = _CPU, 0
    elif kind in _DL_CUDA:
        device = ("cuda", t.device.device_id)
        if stream is None:  # exported without a stream: ours is the default one of its device
            stream = default_stream(t.device.device_id)
    else:
        raise _detcoll.WrongDevice(f"{what}: DLPack device type {kind}: detcoll takes CPU and CUDA memory")
    addr = (t.data or 0) + t.byte_offset
    return View(addr, _prod(shape), dtype, shape, device, stream, not readonly, keep=capsule)


_READERS = {}  # torch and numpy types -> reader: a call does one dict lookup to find it


def _reader(x):
    """How to read ``x``; also whether that holds for every object of its type (cacheable)."""
    t = type(x)
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(t, torch.Tensor):
        return _torch_view, True
    np = sys.modules.get("numpy")
    if np is not None and issubclass(t, np.ndarray):
        ma = sys.modules.get("numpy.ma")
        if ma is not None and issubclass(t, ma.MaskedArray):
            return _masked_view, True
        return _numpy_view, True
    if np is not None and issubclass(t, np.generic):
        return _numpy_scalar_view, True
    if hasattr(x, "__cuda_array_interface__"):
        return _cai_view, False
    if hasattr(x, "__array_interface__"):
        return _ai_view, False
    if hasattr(x, "__dlpack__"):
        return _dlpack_view, False
    return None, False


def _cai_view(x, what: str) -> View:
    dev = getattr(x, "device", None)
    return _interface_view(x, x.__cuda_array_interface__, ("cuda", getattr(dev, "id", None)), what)


def _ai_view(x, what: str) -> View:
    return _interface_view(x, x.__array_interface__, _CPU, what)


def view(x, what: str) -> View:
    """The view of ``x`` (``what`` names the argument in errors)."""
    read = _READERS.get(type(x))
    if read is None:
        read, per_type = _reader(x)
        if read is None:
            raise _detcoll.InvalidArgument(
                f"{what}: {type(x).__name__} is not a tensor (expected a torch tensor, an object with "
                "__cuda_array_interface__, __array_interface__ or __dlpack__)"
            )
        if per_type:
            _READERS[type(x)] = read
    v = read(x, what)
    if v.addr == 0 and v.count:
        # no memory behind the elements (a FakeTensor, a meta or storage-less wrapper-subclass
        # tensor, an interface at address 0): reading it would dereference null
        raise _detcoll.InvalidArgument(
            f"{what}: address 0 (null) for {v.count} elements: the tensor has no memory behind it "
            "(a FakeTensor, or a tensor subclass without storage?); pass a tensor with storage")
    return v


def new_empty(x, shape):
    """An uninitialised tensor of ``x``'s kind, dtype and device with ``shape`` (the output
    of ``all_gather``/``reduce_scatter`` when the caller gives none)."""
    if hasattr(x, "new_empty"):  # torch
        return x.new_empty(shape)
    mod = type(x).__module__.split(".")[0]
    if mod in ("numpy", "cupy"):
        lib = sys.modules[mod]
        return lib.empty(shape, dtype=x.dtype)
    raise _detcoll.InvalidArgument(
        f"cannot allocate an output like a {type(x).__name__}: pass out= (torch, numpy and CuPy allocate)"
    )
