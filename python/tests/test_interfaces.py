"""Tensors through each interface detcoll reads: DLPack (``__dlpack__`` only), the array
interface, and shapes that are not flat."""

import numpy as np
import pytest

import detcoll
from conftest import close_all, on_ranks
from reference import assert_bits_equal, contribution, tree


class DLPackOnly:
    """An object that offers nothing but DLPack (as JAX/others do), over a numpy array."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.fixture(scope="module")
def pair():
    comms = detcoll.thread_group(2, capacity=4096)
    yield comms
    close_all(comms)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_dlpack_in_and_out(pair, dtype):
    xs = [contribution(dtype, r, 8 * 50) for r in range(2)]
    outs = [np.zeros_like(xs[0]) for _ in range(2)]

    def call(c):
        c.all_reduce(DLPackOnly(xs[c.rank]), out=DLPackOnly(outs[c.rank]))
        return outs[c.rank]

    for g in on_ranks(pair, call):
        assert_bits_equal(g, tree(xs))


def test_dlpack_strided_is_refused(pair):
    with pytest.raises(detcoll.NotContiguous):
        pair[0].all_reduce(DLPackOnly(np.ones(16, np.float32)[::2]))


def test_multidimensional_all_reduce_keeps_shape(pair):
    xs = [contribution("f32", r, 64).reshape(4, 16) for r in range(2)]
    for g in on_ranks(pair, lambda c: c.all_reduce(xs[c.rank].copy())):
        assert g.shape == (4, 16)
        assert_bits_equal(g, tree(xs))


def test_fortran_order_is_refused(pair):
    with pytest.raises(detcoll.NotContiguous):
        pair[0].all_reduce(np.asfortranarray(np.ones((4, 4), np.float32)))


def test_reduce_scatter_dim0_must_split(pair):
    with pytest.raises(detcoll.NotDivisible):
        pair[0].reduce_scatter(np.ones((3, 4), np.float32))
