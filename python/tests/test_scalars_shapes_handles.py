"""What an outside probe of the package found (2026-12-06), each checked as a user meets it:
numpy scalars (``np.float32(...)``, ``x.sum()``) as inputs were read from a temporary array the
call did not keep alive (wrong results, returned as success) and as outputs took an in-place
call's result into that temporary (the scalar unchanged, no error); the fused call took a
``residual`` or ``out`` of another shape with the same element count; ``route()`` answered on a
closed handle and in a forked child; a ``reduce_scatter_many`` of mixed dtypes named its lane
``lanes[i]``."""

import gc
import os
import weakref

import numpy as np
import pytest

import detcoll
from conftest import close_all, on_ranks
from detcoll.reference import residual_rmsnorm


@pytest.fixture(scope="module")
def pair():
    comms = detcoll.thread_group(2, capacity=4096)
    yield comms
    close_all(comms)


def churn():
    """Allocations of a scalar's size between calls: memory a freed temporary held is reused."""
    junk = [np.empty(1, np.float32) + k for k in range(64)]
    del junk
    gc.collect(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
def test_numpy_scalar_inputs_are_read_as_given(pair, dtype):
    values = [dtype(10), dtype(20)]
    reduces = dtype in (np.float32, np.float16)  # all_gather moves any plain dtype

    def call(c):
        got = []
        for _ in range(200):
            churn()
            mine = dtype(10 * (c.rank + 1))  # a fresh scalar each time, like x.sum()'s result
            gathered = c.all_gather(mine)
            out = np.zeros((), dtype)
            if reduces:
                c.all_reduce(mine, out=out)
            got.append((gathered.tolist(), out.tolist()))
        return got

    expected_sum = 30 if reduces else 0
    for rank_results in on_ranks(pair, call):
        for gathered, total in rank_results:
            assert gathered == [v.item() for v in values]
            assert total == expected_sum


class TemporaryInterface:
    """An array interface over a temporary array only its dict references (``__ref``), as a
    numpy scalar's is: the memory lives as long as that dict."""

    def __init__(self, n):
        self.n, self.alive = n, None

    @property
    def __array_interface__(self):
        tmp = np.full(self.n, 2.5, np.float32)
        self.alive = weakref.ref(tmp)
        ai = dict(tmp.__array_interface__)
        ai["__ref"] = tmp
        return ai


def test_an_interfaces_temporary_memory_lives_as_long_as_the_view():
    from detcoll import _tensor

    obj = TemporaryInterface(4)
    v = _tensor.view(obj, "x")
    gc.collect()
    assert obj.alive() is not None, "the memory of the view was freed while the view lives"
    assert np.ctypeslib.as_array((np.ctypeslib.ctypes.c_float * 4).from_address(v.addr)).tolist() == [2.5] * 4
    del v
    gc.collect()
    assert obj.alive() is None  # and nothing else holds it


def test_a_numpy_scalars_view_owns_its_memory_and_is_read_only():
    from detcoll import _tensor

    v = _tensor.view(np.float32(1.5), "x")
    gc.collect()
    assert not v.writable
    assert isinstance(v.keep, np.ndarray) and v.keep.ctypes.data == v.addr and v.keep.tolist() == 1.5


def test_a_numpy_scalar_is_not_an_output(pair):
    """A numpy scalar is immutable: an in-place call on one (or one as ``out=``) is refused,
    with nothing written, instead of writing into a temporary copy."""
    def call(c):
        x = np.float32(1.5 + c.rank)
        with pytest.raises(detcoll.InvalidArgument, match="read-only|immutable"):
            c.all_reduce(x)
        with pytest.raises(detcoll.InvalidArgument, match="read-only|immutable"):
            c.all_reduce(np.ones((), np.float32), out=np.float32(0))
        return float(x)

    assert on_ranks(pair, call) == [1.5, 2.5]


def rmsnorm_inputs(rows, hidden, rank):
    rng = np.random.default_rng(rank * 7 + rows)
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    residual = np.ascontiguousarray(rng.standard_normal((rows, hidden)).astype(np.float32))
    weight = rng.standard_normal(hidden).astype(np.float32)
    return x, residual, weight


@pytest.mark.parametrize("which", ["residual", "out"])
def test_fused_call_refuses_a_tensor_of_another_shape(pair, which):
    rows, hidden = 4, 16

    def call(c):
        x, residual, weight = rmsnorm_inputs(rows, hidden, c.rank)
        out = np.full((rows, hidden), -7.0, np.float32)
        if which == "residual":
            residual = residual.reshape(hidden, rows)
        else:
            out = out.reshape(hidden, rows)
        before = (x.copy(), residual.copy(), out.copy())
        with pytest.raises(detcoll.InvalidArgument, match=f"{which}.*shape"):
            c.all_reduce_residual_rmsnorm(x, residual, weight, 1e-6, out=out)
        for a, b in zip((x, residual, out), before):
            assert a.tobytes() == b.tobytes(), "a refused call wrote"

    on_ranks(pair, call)


def test_fused_call_with_matching_shapes_still_gives_the_reference(pair):
    rows, hidden = 3, 24
    ins = [rmsnorm_inputs(rows, hidden, r) for r in range(2)]
    ref_h, ref_y = residual_rmsnorm([i[0] for i in ins], ins[0][1], ins[0][2], 1e-6)

    def call(c):
        x, residual, weight = (a.copy() for a in ins[c.rank])
        residual = ins[0][1].copy()
        y, h = c.all_reduce_residual_rmsnorm(x, residual, ins[0][2], 1e-6, out=np.empty_like(x))
        return y, h

    for y, h in on_ranks(pair, call):
        assert y.tobytes() == np.asarray(ref_y, np.float32).reshape(rows, hidden).tobytes()
        assert h.tobytes() == np.asarray(ref_h, np.float32).reshape(rows, hidden).tobytes()


def test_route_on_a_closed_handle_raises_closed():
    comms = detcoll.thread_group(2, capacity=4096)
    assert on_ranks(comms, lambda c: c.route("all_reduce", 1024)) == [comms[0].route("all_reduce", 1024)] * 2
    close_all(comms)
    for c in comms:
        with pytest.raises(detcoll.Closed):
            c.route("all_reduce", 1024)
        with pytest.raises(detcoll.Closed):
            c.capabilities  # noqa: B018 (a property: reading it is the query)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_route_in_a_forked_child_raises_forked_handle():
    comms = detcoll.thread_group(1, capacity=4096)
    c = comms[0]
    c.route("all_reduce", 1024)
    pid = os.fork()
    if pid == 0:  # the child: every use of the parent's handle is ForkedHandle
        code = 3
        try:
            code = 0
            for use in (lambda: c.route("all_reduce", 1024), lambda: c.capabilities,
                        lambda: c.all_reduce(np.ones(4, np.float32))):
                try:
                    use()
                    code = 1
                except detcoll.ForkedHandle:
                    pass
                except BaseException:
                    code = 2
        finally:
            os._exit(code)  # never back into the test runner
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"
    assert c.route("all_reduce", 1024)  # the parent's handle still answers
    close_all(comms)


def test_reduce_scatter_many_names_the_lane_of_another_dtype(pair):
    def call(c):
        lanes = [np.ones(4, np.float32), np.ones(4, np.float32), np.ones(4, np.float16)]
        with pytest.raises(detcoll.DtypeMismatch) as e:
            c.reduce_scatter_many(lanes)
        assert "lanes[2]" in str(e.value) and "lanes[i]" not in str(e.value), str(e.value)

    on_ranks(pair, call)
