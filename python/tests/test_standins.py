"""Objects that offer one interface only (tests/standins.py: ``__array_interface__`` alone,
``__dlpack__``/``__dlpack_device__`` alone, ``__dlpack__`` alone), over numpy arrays on the CPU
twin: every op bit for bit against the same calls on plain numpy arrays, strided and misaligned
ones refused with the typed exception and nothing written, and the stream a CUDA call goes on
(``__cuda_array_interface__``'s ``stream``, else the default stream; what a DLPack producer is
asked for), checked against a stand-in of the extension that records its calls. The GPU side of
the same: tests/device/test_gpu.py (``test_standins_*``)."""

import sys
import types

import numpy as np
import pytest

import detcoll
from conftest import close_all, need_dtype, on_ranks
from detcoll import _tensor
from detcoll.collective import Collective
from reference import assert_bits_equal, contribution, np_dtype, tree
from standins import ABSENT, ArrayInterfaceOnly, CudaArrayInterfaceOnly, DLPackNoDevice, DLPackOnly

SENTINEL = -7.25
KINDS = {"array_interface": ArrayInterfaceOnly, "dlpack": DLPackOnly, "dlpack_no_device": DLPackNoDevice}


@pytest.fixture(scope="module")
def pair():
    comms = detcoll.thread_group(2, capacity=4096)  # 4 KiB of staging: the larger calls chunk
    yield comms
    close_all(comms)


def ops(c, wrap, name, n):
    """Every op and form once, inputs and outputs through ``wrap``; the numpy arrays written."""
    r, w = c.rank, c.world_size
    x = contribution(name, r, n)
    res = {}
    y = x.copy()
    c.all_reduce(wrap(y))
    res["all_reduce in place"] = y
    res["all_reduce"] = np.zeros_like(x)
    c.all_reduce(wrap(x), out=wrap(res["all_reduce"]))
    res["all_gather"] = np.zeros(w * n, x.dtype)
    c.all_gather(wrap(x), out=wrap(res["all_gather"]))
    g = np.zeros(w * n, x.dtype)
    g[r * n:(r + 1) * n] = x
    c.all_gather(wrap(g[r * n:(r + 1) * n]), out=wrap(g))  # NCCL's in-place form
    res["all_gather in place"] = g
    res["reduce_scatter"] = np.zeros(n // w, x.dtype)
    c.reduce_scatter(wrap(x), out=wrap(res["reduce_scatter"]))
    s = x.copy()
    ws = wrap(s)
    c.reduce_scatter(ws, out=ws)
    res["reduce_scatter in place"] = s
    lanes = [contribution(name, r, 16 * w, seed=5), contribution(name, r, 64 * w, seed=6)]
    outs = [np.zeros(16, x.dtype), np.zeros(64, x.dtype)]
    c.reduce_scatter_many([wrap(a) for a in lanes], outs=[wrap(o) for o in outs])
    res["reduce_scatter_many lane 0"], res["reduce_scatter_many lane 1"] = outs
    return res


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("n", [8 * 25, 8 * 1000], ids=["small", "chunked"])
def test_every_op_bitwise_against_plain_arrays(pair, kind, dtype, n):
    need_dtype(dtype)
    if dtype == "bf16" and kind != "array_interface":
        pytest.skip("numpy does not export bf16 (ml_dtypes) through DLPack; the GPU checks run it with torch")
    plain = on_ranks(pair, ops, lambda a: a, dtype, n)
    through = on_ranks(pair, ops, KINDS[kind], dtype, n)
    for r in range(2):
        assert set(through[r]) == set(plain[r])
        for key, want in plain[r].items():
            assert_bits_equal(through[r][key], want, f"rank {r} {kind} {key}")


def bad(kind, defect, name, n):
    """A ``kind`` stand-in of ``n`` elements that is strided or misaligned, and its base."""
    dt = np_dtype(name)
    if defect == "strided":
        base = np.full(2 * n, SENTINEL, dt)
        return KINDS[kind](base[::2]), base
    base = np.full(n + 1, SENTINEL, dt)
    return KINDS[kind](base[:n], offset=np.dtype(dt).itemsize // 2), base  # one byte (f16), two (f32)


def refusal_cases():
    for kind in KINDS:
        for defect in ("strided", "misaligned"):
            for name in ("f32", "f16"):
                for role in ("all_reduce x", "all_reduce out", "all_reduce in place", "all_gather x", "all_gather out",
                             "reduce_scatter x", "reduce_scatter out", "reduce_scatter_many xs[1]",
                             "reduce_scatter_many outs[1]"):
                    yield kind, defect, name, role


@pytest.mark.parametrize("kind,defect,name,role", list(refusal_cases()))
def test_strided_or_misaligned_is_refused_and_writes_nothing(pair, kind, defect, name, role):
    c, n, dt = pair[0], 32, np_dtype(name)
    op, arg = role.rsplit(" ", 1) if not role.endswith("in place") else ("all_reduce", "in place")
    out_n = {"all_reduce": n, "all_gather": 2 * n, "reduce_scatter": n // 2, "reduce_scatter_many": n // 2}[op]
    b, base = bad(kind, defect, name, n if arg != "out" and arg != "outs[1]" else out_n)
    x = KINDS[kind](np.ones(n, dt))
    outs = [np.full(out_n, SENTINEL, dt), np.full(out_n, SENTINEL, dt)]
    written = [base] + outs  # every array a call could write: untouched after a refusal
    expected = detcoll.NotContiguous if defect == "strided" else detcoll.Misaligned
    with pytest.raises(expected) as info:
        if op == "reduce_scatter_many":
            xs = [x, b if arg == "xs[1]" else KINDS[kind](np.ones(n, dt))]
            os_ = [KINDS[kind](outs[0]), b if arg == "outs[1]" else KINDS[kind](outs[1])]
            c.reduce_scatter_many(xs, outs=os_)
        elif arg == "in place":
            c.all_reduce(b)
        elif arg == "x":
            getattr(c, op)(b, out=KINDS[kind](outs[0]))
        else:
            getattr(c, op)(x, out=b)
    assert isinstance(info.value, detcoll.InvalidArgument)
    for i, a in enumerate(written):
        assert_bits_equal(a, np.full(a.shape, SENTINEL, dt), f"array {i} after a refused {role}")
    c.check()  # not poisoned
    xs = [np.full(8, r + 0.5, np.float32) for r in range(2)]
    for g in on_ranks(pair, lambda c: c.all_reduce(KINDS[kind](xs[c.rank].copy())).base):
        assert_bits_equal(g, xs[0] + xs[1])


# -- which stream a CUDA call goes on (the extension replaced by a recorder) -----------------


class RecordingRaw:
    """The extension's communicator on "cuda", recording the raw calls instead of making them."""

    platform, world_size, rank = "cuda", 1, 0

    def __init__(self):
        self.calls, self.synchronized = [], []

    def call(self, op, in_addr, in_count, in_dtype, out_addr, out_count, out_dtype, stream):
        self.calls.append((op, stream))

    def call_many(self, lanes, stream):
        self.calls.append(("reduce_scatter_many", stream))

    def synchronize(self, stream=0):
        self.synchronized.append(stream)


@pytest.fixture(params=["no torch", "torch"])
def torch_streams(request, monkeypatch):
    """``None`` (torch not imported: the default stream is the legacy one, 0), or a stand-in
    torch whose current raw stream of device ``i`` is ``0x5000 + i`` (current device 3)."""
    monkeypatch.setattr(_tensor, "_READERS", {})
    if request.param == "no torch":
        monkeypatch.delitem(sys.modules, "torch", raising=False)
        return None
    torch = types.ModuleType("torch")
    torch.Tensor = type("Tensor", (), {})
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda i: 0x5000 + i)
    torch.cuda = types.SimpleNamespace(current_device=lambda: 3)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return lambda i: 0x5000 + i


def test_default_stream(torch_streams):
    want = (lambda i: 0) if torch_streams is None else torch_streams
    assert _tensor.default_stream(1) == want(1)
    assert _tensor.default_stream(None) == want(3)  # torch's current device


@pytest.mark.parametrize("device_index", [None, 2])
def test_cuda_array_interface_stream_is_honoured(torch_streams, device_index):
    default = 0 if torch_streams is None else torch_streams(3 if device_index is None else device_index)
    raw = RecordingRaw()
    c = Collective(raw, device_index)
    x = np.ones(8, np.float32)
    for entry, want in ((ABSENT, default), (None, default), (1, 1), (2, 2), (0x7F00AB, 0x7F00AB)):
        c.all_reduce(CudaArrayInterfaceOnly(x, stream=entry))
        c.all_gather(CudaArrayInterfaceOnly(x, stream=entry), out=CudaArrayInterfaceOnly(np.ones(8, np.float32)))
        c.reduce_scatter_many([CudaArrayInterfaceOnly(x, stream=entry)], outs=[CudaArrayInterfaceOnly(x.copy())])
        assert raw.calls == [("all_reduce", want), ("all_gather", want), ("reduce_scatter_many", want)], entry
        raw.calls.clear()
    c.synchronize()
    assert raw.synchronized == [default]  # synchronize() waits on the same default stream


def test_dlpack_producer_is_asked_for_the_call_stream(torch_streams):
    default = 0 if torch_streams is None else torch_streams(0)
    raw = RecordingRaw()
    c = Collective(raw, 0)
    x, out = DLPackOnly(np.ones(8, np.float32), device_type=2), DLPackOnly(np.ones(8, np.float32), device_type=2)
    c.all_reduce(x, out=out)
    assert raw.calls == [("all_reduce", default)]
    # DLPack names the legacy default stream 1 (0 is not allowed); a torch stream by its handle;
    # a versioned capsule asked for (it can say read-only)
    assert x.calls == out.calls == [{"stream": default or 1, "max_version": (1, 0)}]
    # Without __dlpack_device__ the producer is not asked for a stream (the device is in the
    # capsule); the call still goes on the default stream.
    nd = DLPackNoDevice(np.ones(8, np.float32), device_type=13)  # kDLCUDAManaged
    v = _tensor.view(nd, "x")
    assert (v.device, v.stream, nd.calls) == (("cuda", 0), default, [{"max_version": (1, 0)}])


class OldDLPack(DLPackOnly):
    """A producer older than DLPack 1.0's ``max_version`` (and, with ``stream=False``, than
    the ``stream`` argument): a TypeError for either."""

    def __init__(self, base, stream=True, **kw):
        super().__init__(base, **kw)
        self.takes_stream = stream

    def __dlpack__(self, **kwargs):
        if "max_version" in kwargs or ("stream" in kwargs and not self.takes_stream):
            self.calls.append(dict(kwargs))
            raise TypeError("unexpected keyword argument")
        return super().__dlpack__(**kwargs)


@pytest.mark.parametrize("takes_stream", [True, False])
def test_dlpack_producer_older_than_max_version_is_asked_again(torch_streams, takes_stream):
    default = 0 if torch_streams is None else torch_streams(0)
    x = OldDLPack(np.ones(8, np.float32), stream=takes_stream, device_type=2)
    v = _tensor.view(x, "x")
    if takes_stream:
        assert x.calls == [{"stream": default or 1, "max_version": (1, 0)}, {"stream": default or 1}]
        assert v.stream == default
    else:  # exported as it stands: the call goes on the default stream
        want = [{"stream": default or 1, "max_version": (1, 0)}, {"stream": default or 1}, {}]
        assert (x.calls, v.stream) == (want, default)
    h = OldDLPack(np.ones(8, np.float32))  # host memory: no stream asked for
    assert _tensor.view(h, "x").device == ("cpu", None) and h.calls == [{"max_version": (1, 0)}, {}]


def test_dlpack_producer_without_a_stream_argument(torch_streams):
    class Old:
        def __init__(self, a):
            self.a, self.calls = a, 0

        def __dlpack__(self):
            self.calls += 1
            return DLPackNoDevice(self.a, device_type=2).__dlpack__()

        def __dlpack_device__(self):
            return (2, 0)

    o = Old(np.ones(8, np.float32))
    v = _tensor.view(o, "x")
    assert (v.device, v.stream) == (("cuda", 0), 0 if torch_streams is None else torch_streams(0))
    assert o.calls == 1  # asked with the stream first: a TypeError before its body ran


# -- what else an interface-only object can say -----------------------------------------------


def test_dlpack_export_failures_are_typed(pair):
    class Refusing(DLPackOnly):  # a tensor its producer will not export (BufferError)
        def __dlpack__(self, **kw):
            raise BufferError("cannot export this one")

    with pytest.raises(detcoll.InvalidArgument, match="__dlpack__ refused: BufferError"):
        pair[0].all_reduce(Refusing(np.ones(8, np.float32)), out=np.zeros(8, np.float32))

    class NotACapsule:
        def __dlpack__(self, **kw):
            return "capsule"

    with pytest.raises(detcoll.InvalidArgument, match="not a DLPack capsule"):
        pair[0].all_reduce(NotACapsule())


def test_versioned_dlpack_capsule_and_its_read_only_flag(pair):
    class Versioned(DLPackOnly):
        def __dlpack__(self, **kw):
            return self.base.__dlpack__(max_version=(1, 0))

    xs = [contribution("f32", r, 64) for r in range(2)]
    ro = np.full(64, SENTINEL, np.float32)
    ro.setflags(write=False)
    with pytest.raises(detcoll.InvalidArgument, match="read-only"):
        pair[0].all_reduce(Versioned(xs[0]), out=Versioned(ro))
    outs = [np.zeros(64, np.float32) for _ in range(2)]
    on_ranks(pair, lambda c: c.all_reduce(Versioned(xs[c.rank]), out=Versioned(outs[c.rank])))
    assert_bits_equal(outs[0], outs[1])
    assert_bits_equal(outs[0], tree(xs))


@pytest.mark.parametrize("typestr,descr", [(">f4", None), (">f2", None), ("|V2", [("a", "|u1"), ("b", "|u1")]),
                                           ("<M8[ns]", None), ("<c8", None), ("<f3", None)])
def test_array_interface_dtypes_that_are_refused(typestr, descr):
    a = ArrayInterfaceOnly(np.ones(4, np.float32))
    a._dict["typestr"] = typestr
    if descr is not None:
        a._dict["descr"] = descr
    with pytest.raises(detcoll.UnsupportedDtype):
        _tensor.view(a, "x")


def test_array_interface_bf16_typestr():
    a = ArrayInterfaceOnly(np.ones(4, np.float32))
    for typestr, descr in (("<V2", None), ("<V2", [("", "<V2")])):
        a._dict["typestr"], a._dict["descr"] = typestr, descr
        assert _tensor.view(a, "x").dtype == "bf16"


def test_numpy_byte_order_is_checked():
    with pytest.raises(detcoll.UnsupportedDtype, match="byte order"):
        _tensor.view(np.ones(4, ">f4"), "x")
    with pytest.raises(detcoll.UnsupportedDtype, match="byte order"):
        _tensor.view(ArrayInterfaceOnly(np.ones(4, ">f2")), "x")
    assert _tensor.view(np.ones(4, "|u1"), "x").dtype == "u8"


def test_masked_array_interface_is_refused():
    a = ArrayInterfaceOnly(np.ones(4, np.float32))
    a._dict["mask"] = object()
    with pytest.raises(detcoll.InvalidArgument, match="mask"):
        _tensor.view(a, "x")


def test_numpy_masked_arrays_are_refused_with_nothing_written(pair):
    # A numpy masked array is an ndarray whose interface has no mask: it was reduced with the
    # mask ignored. Refused now, as the masked array interface is, before any work.
    import numpy.ma as ma

    x = ma.masked_array(np.ones(8, np.float32), mask=[0, 1] * 4)
    out = np.full(8, 7.0, np.float32)
    with pytest.raises(detcoll.InvalidArgument, match="masked"):
        _tensor.view(x, "x")
    with pytest.raises(detcoll.InvalidArgument, match="masked"):
        pair[0].all_reduce(x, out=out)
    assert (out == 7.0).all() and (x.data == 1.0).all()
    y = np.full(8, 7.0, np.float32)
    with pytest.raises(detcoll.InvalidArgument, match="masked"):
        pair[0].all_reduce(y, out=ma.masked_array(np.zeros(8, np.float32)))
