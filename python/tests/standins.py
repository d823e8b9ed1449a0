"""Objects that offer one tensor interface and nothing else, over a numpy array or a torch
tensor: what CuPy, Numba, JAX and the like hand over, without them. Standard library only (the
device checks import this where numpy may be missing); the results are read from ``.base``.

* ``ArrayInterfaceOnly``: ``__array_interface__`` (host memory).
* ``CudaArrayInterfaceOnly``: ``__cuda_array_interface__`` v3, as CuPy exports it, with a
  ``stream`` entry when one is given (``ABSENT``: no entry, as torch's own v2 export).
* ``DLPackOnly``: ``__dlpack__`` and ``__dlpack_device__``; ``DLPackNoDevice``: ``__dlpack__``
  alone. Both record the keyword arguments of every ``__dlpack__`` call (``.calls``).

``offset`` (bytes) moves the data pointer (array interfaces) or the capsule's ``byte_offset``
(DLPack) past the start of ``base``: a misaligned tensor of the same shape, reaching ``offset``
bytes past ``base``'s end (give it a base with room to spare).
"""

import ctypes

ABSENT = object()  # no "stream" entry in the array interface

# torch dtype names -> array-interface typestr (little-endian hosts; torch's own mapping,
# bf16 included: "<V2", as ml_dtypes)
_TORCH_TYPESTR = {
    "float32": "<f4", "float16": "<f2", "bfloat16": "<V2", "float64": "<f8", "uint8": "|u1",
    "int8": "|i1", "int16": "<i2", "uint16": "<u2", "int32": "<i4", "uint32": "<u4",
    "int64": "<i8", "uint64": "<u8", "bool": "|b1",
}


def describe(a):
    """(address, shape, strides in bytes or None when C-contiguous, typestr) of a torch tensor
    or a numpy array."""
    if hasattr(a, "data_ptr"):  # torch
        item = a.element_size()
        strides = None if a.is_contiguous() else tuple(s * item for s in a.stride())
        return a.data_ptr(), tuple(a.shape), strides, _TORCH_TYPESTR[str(a.dtype).split(".")[-1]]
    strides = None if a.flags.c_contiguous else tuple(a.strides)
    return a.ctypes.data, tuple(a.shape), strides, a.dtype.str


class _Interface:
    def __init__(self, base, offset=0, stream=ABSENT, readonly=False):
        self.base = base  # keeps the memory alive; results are read from it
        addr, shape, strides, typestr = describe(base)
        self._dict = {"shape": shape, "typestr": typestr, "data": (addr + offset, readonly),
                      "strides": strides, "version": 3}
        if stream is not ABSENT:
            self._dict["stream"] = stream

    def __repr__(self):
        return f"{type(self).__name__}({self._dict})"


class ArrayInterfaceOnly(_Interface):
    @property
    def __array_interface__(self):
        return dict(self._dict)


class CudaArrayInterfaceOnly(_Interface):
    @property
    def __cuda_array_interface__(self):
        return dict(self._dict)


class _DLTensor(ctypes.Structure):  # DLPack's DLTensor, written out here (not detcoll's)
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def dltensor(capsule):
    """The DLTensor inside a "dltensor" or "dltensor_versioned" capsule (writable in place)."""
    name = _name(capsule)
    ptr = _pointer(capsule, name)
    return _DLTensor.from_address(ptr if name == b"dltensor" else ptr + 32)


class DLPackNoDevice:
    """``__dlpack__`` only (producers older than ``__dlpack_device__``)."""

    def __init__(self, base, offset=0, device_type=None):
        self.base, self.offset, self.device_type = base, offset, device_type
        self.calls = []  # the keyword arguments of every __dlpack__ call

    def __dlpack__(self, **kwargs):
        self.calls.append(dict(kwargs))
        if self.device_type is not None:  # host memory posing as a device: the host producer
            kwargs.pop("stream", None)  # (numpy) takes no stream
        capsule = self.base.__dlpack__(**kwargs)
        if self.offset or self.device_type is not None:
            t = dltensor(capsule)
            t.byte_offset += self.offset
            if self.device_type is not None:  # CPU tests: host memory that claims another device
                t.device_type = self.device_type
        return capsule

    def __repr__(self):
        return f"{type(self).__name__}(offset={self.offset})"


class DLPackOnly(DLPackNoDevice):
    """``__dlpack__`` and ``__dlpack_device__`` (JAX, CuPy's DLPack side, ...)."""

    def __dlpack_device__(self):
        kind, index = self.base.__dlpack_device__()
        return (int(kind) if self.device_type is None else self.device_type), int(index)
