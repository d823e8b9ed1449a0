"""Forms of the tensor interfaces and call arguments that an outside probe found mishandled
(2026-12-05): an ``__array_interface__`` whose ``data`` is a buffer object (crashed the process:
its first two items were read as an address and a flag) or None (a raw TypeError), NCCL's
in-place ``reduce_scatter`` written as ``out = x``'s shard ``rank`` (refused, with a misleading
error on rank 0), a read-only DLPack tensor (refused: the producer was never asked for a
versioned capsule), an empty strided interface (refused as not contiguous) and a string ``eps``
(accepted)."""

import numpy as np
import pytest

import detcoll
from conftest import close_all, on_ranks
from reference import assert_bits_equal, contribution, tree

SENTINEL = -7.0


@pytest.fixture(scope="module")
def pair():
    comms = detcoll.thread_group(2, capacity=4096)
    yield comms
    close_all(comms)


@pytest.fixture(scope="module")
def one():
    comms = detcoll.thread_group(1, capacity=4096)
    yield comms[0]
    close_all(comms)


class BufferInterface:
    """An array interface whose ``data`` is a buffer object (or None: the object's own buffer),
    with an ``offset`` into it, as the numpy interface protocol allows."""

    def __init__(self, buf, shape, typestr, offset=0, own=False, strides=None):
        self._buf, self._own = buf, own
        self.__array_interface__ = {
            "version": 3, "shape": shape, "typestr": typestr, "strides": strides,
            "data": None if own else buf, "offset": offset,
        }

    def __buffer__(self, flags):  # Python >= 3.12: the object's own buffer
        return memoryview(self._buf)


def test_buffer_object_data_is_read_from_the_buffer(one):
    # The probe's case: a 2-byte bytearray read as (address 0x40, read-only 0) crashed.
    src = bytearray(b"\x40\x00")
    out = np.zeros(2, np.uint8)
    one.all_gather(BufferInterface(src, (2,), "|u1"), out=out)
    assert out.tolist() == [0x40, 0x00]


def test_buffer_object_data_with_offset_in_and_out(pair):
    xs = [contribution("f32", r, 24) for r in range(2)]
    bufs = [bytearray(8) + bytearray(x.tobytes()) for x in xs]
    outs = [bytearray(4) + bytearray(24 * 4) for _ in range(2)]

    def call(c):
        x = BufferInterface(bufs[c.rank], (24,), "<f4", offset=8)
        c.all_reduce(x, out=BufferInterface(outs[c.rank], (24,), "<f4", offset=4))
        return np.frombuffer(bytes(outs[c.rank][4:]), np.float32)

    for g in on_ranks(pair, call):
        assert_bits_equal(g, tree(xs))


def test_buffer_object_data_shorter_than_the_array_is_refused(one):
    out = np.full(4, 5, np.uint8)
    with pytest.raises(detcoll.InvalidArgument, match="bytes"):
        one.all_gather(BufferInterface(bytearray(3), (4,), "|u1"), out=out)
    with pytest.raises(detcoll.InvalidArgument, match="bytes"):
        one.all_gather(BufferInterface(bytearray(4), (4,), "|u1", offset=1), out=out)
    assert out.tolist() == [5, 5, 5, 5]


def test_read_only_buffer_is_read_but_not_written(one):
    src = bytes(range(4))
    out = np.zeros(4, np.uint8)
    one.all_gather(BufferInterface(src, (4,), "|u1"), out=out)
    assert out.tolist() == [0, 1, 2, 3]
    with pytest.raises(detcoll.InvalidArgument, match="read-only"):
        one.all_gather(np.arange(4, dtype=np.uint8), out=BufferInterface(bytes(4), (4,), "|u1"))


def test_data_none_reads_the_objects_own_buffer(one):
    if not hasattr(memoryview, "__buffer__") and not _own_buffer_supported():
        pytest.skip("an object's own buffer (data None) needs Python 3.12's __buffer__ protocol")
    src = bytearray(b"\x01\x02\x03")
    out = np.zeros(3, np.uint8)
    one.all_gather(BufferInterface(src, (3,), "|u1", own=True), out=out)
    assert out.tolist() == [1, 2, 3]


def _own_buffer_supported():
    try:
        memoryview(BufferInterface(bytearray(1), (1,), "|u1", own=True))
        return True
    except TypeError:
        return False


def test_data_that_is_neither_address_nor_buffer_is_a_typed_error(one):
    class Bad:
        __array_interface__ = {"version": 3, "shape": (2,), "typestr": "|u1", "data": 3.5}

    class NoBuffer:
        __array_interface__ = {"version": 3, "shape": (2,), "typestr": "|u1", "data": None}

    out = np.full(2, 9, np.uint8)
    for bad in (Bad(), NoBuffer()):
        with pytest.raises(detcoll.InvalidArgument, match="data"):
            one.all_gather(bad, out=out)
    assert out.tolist() == [9, 9]


def test_empty_strided_interface_is_contiguous(one):
    x = BufferInterface(bytearray(0), (0, 3), "<f4", strides=(24, 8))
    out = np.zeros((0, 3), np.float32)
    one.all_reduce(x, out=out)  # nothing to do, and not a NotContiguous


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_reduce_scatter_into_the_inputs_own_shard_is_in_place(pair, dtype):
    # torch.distributed.reduce_scatter_tensor(x.chunk(W)[rank], x): NCCL's in-place form.
    n = 4 * 2
    xs = [contribution(dtype, r, n) for r in range(2)]
    want = tree(xs)

    def call(c):
        x = xs[c.rank].copy()
        shard = x[c.rank * 4:(c.rank + 1) * 4]
        got = c.reduce_scatter(x, out=shard)
        assert got is shard
        return shard.copy()

    for r, g in enumerate(on_ranks(pair, call)):
        assert_bits_equal(g, want[r * 4:(r + 1) * 4])


def test_reduce_scatter_into_another_shard_of_the_input_is_refused(pair):
    # Rank 0 writing into shard 1 of its own input (and rank 1 into shard 0) is not the in-place
    # form: refused on both ranks alike, the input untouched.
    xs = [np.full(8, float(r + 1), np.float32) for r in range(2)]

    def call(c):
        other = 1 - c.rank
        with pytest.raises(detcoll.Overlap, match="shard"):
            c.reduce_scatter(xs[c.rank], out=xs[c.rank][other * 4:(other + 1) * 4])
        return xs[c.rank].copy()

    for r, g in enumerate(on_ranks(pair, call)):
        assert (g == r + 1).all()


def test_reduce_scatter_in_place_shard_of_a_read_only_input_is_refused(one):
    x = np.ones(4, np.float32)
    x.flags.writeable = False
    with pytest.raises(detcoll.InvalidArgument, match="read-only"):
        one.reduce_scatter(x, out=x[0:4])


class ReadOnlyDLPack:
    """A DLPack producer of a read-only numpy array (numpy exports one only as a versioned
    capsule, when the consumer passes ``max_version``)."""

    def __init__(self, a):
        a = a.copy()
        a.flags.writeable = False
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_read_only_dlpack_input_is_read(pair):
    xs = [contribution("f32", r, 16) for r in range(2)]
    outs = [np.full(16, SENTINEL, np.float32) for _ in range(2)]
    for g in on_ranks(pair, lambda c: c.all_reduce(ReadOnlyDLPack(xs[c.rank]), out=outs[c.rank])):
        assert_bits_equal(g, tree(xs))


def test_read_only_dlpack_output_is_refused(one):
    with pytest.raises(detcoll.InvalidArgument, match="read-only"):
        one.all_reduce(np.ones(4, np.float32), out=ReadOnlyDLPack(np.zeros(4, np.float32)))


@pytest.mark.parametrize("eps", ["1e-6", b"1e-6"])
def test_string_eps_is_a_type_error(one, eps):
    x = np.ones((1, 8), np.float32)
    r = np.zeros((1, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="eps"):
        one.all_reduce_residual_rmsnorm(x, r, w, eps=eps)
    assert (x == 1).all() and (r == 0).all()


def test_numpy_scalar_eps_is_taken(one):
    x = np.ones((1, 8), np.float32)
    r = np.zeros((1, 8), np.float32)
    one.all_reduce_residual_rmsnorm(x, r, np.ones(8, np.float32), eps=np.float32(1e-6))
    assert (r == 1).all()
