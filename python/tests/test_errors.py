"""Bad input raises a typed exception before any work, and nothing is written; the collective
keeps working afterwards."""

import numpy as np
import pytest

import detcoll
from conftest import close_all, on_ranks
from reference import assert_bits_equal, tree

SENTINEL = np.float32(-7.25)


@pytest.fixture(scope="module")
def pair():
    comms = detcoll.thread_group(2, capacity=4096)
    yield comms
    close_all(comms)


def untouched(out):
    assert_bits_equal(out, np.full(out.shape, SENTINEL, out.dtype), "output after a refused call")


class FakeCudaArray:
    """A CUDA array interface (CuPy's shape) without CuPy: detcoll must refuse it on the CPU."""

    def __init__(self, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (0x7F0000000000, False),
                                         "version": 3, "strides": None, "stream": None}


def cases():
    x = np.ones(16, np.float32)
    buf = np.zeros(64, np.float32)
    raw = bytearray(16 * 4 + 4)
    return {
        "out too short": (detcoll.LengthMismatch, "all_reduce", x, np.full(15, SENTINEL, np.float32)),
        "out dtype": (detcoll.DtypeMismatch, "all_reduce", x, np.full(16, SENTINEL, np.float16)),
        "integer reduction": (detcoll.UnsupportedDtype, "all_reduce", np.ones(16, np.int32), np.full(16, SENTINEL, np.float32).view(np.int32)),
        "f64 reduction": (detcoll.UnsupportedDtype, "reduce_scatter", np.ones(16, np.float64), np.full(8, SENTINEL, np.float64)),
        "strided input": (detcoll.NotContiguous, "all_reduce", np.ones(32, np.float32)[::2], np.full(16, SENTINEL, np.float32)),
        "strided out": (detcoll.NotContiguous, "all_gather", x, np.full(64, SENTINEL, np.float32)[::2]),
        "misaligned input": (detcoll.Misaligned, "all_reduce", np.frombuffer(raw, np.float32, 16, offset=1), np.full(16, SENTINEL, np.float32)),
        "gather out size": (detcoll.LengthMismatch, "all_gather", x, np.full(31, SENTINEL, np.float32)),
        "scatter not divisible": (detcoll.NotDivisible, "reduce_scatter", np.ones(15, np.float32), np.full(7, SENTINEL, np.float32)),
        "scatter out size": (detcoll.LengthMismatch, "reduce_scatter", x, np.full(9, SENTINEL, np.float32)),
        "overlap": (detcoll.Overlap, "all_reduce", buf[0:16], buf[8:24]),
        "cuda array on cpu": (detcoll.WrongDevice, "all_reduce", FakeCudaArray(16), np.full(16, SENTINEL, np.float32)),
        "read-only out": (detcoll.InvalidArgument, "all_reduce", x, np.full(16, SENTINEL, np.float32)),
        "not a tensor": (detcoll.InvalidArgument, "all_reduce", [1.0, 2.0], np.full(2, SENTINEL, np.float32)),
    }


@pytest.mark.parametrize("name", list(cases()))
def test_refused_before_any_work(pair, name):
    exc, op, x, out = cases()[name]
    if name == "read-only out":
        out.setflags(write=False)
    if name == "overlap":
        out[:] = SENTINEL
    before = out.copy()
    # One rank alone: a refused call never waits for its peer, so this cannot hang.
    with pytest.raises(exc) as info:
        getattr(pair[0], op)(x, out=out)
    assert isinstance(info.value, detcoll.InvalidArgument)
    assert isinstance(info.value, detcoll.DetcollError)
    assert_bits_equal(out, before, name)
    # The collective is not poisoned: a good call on both ranks still gives the tree.
    pair[0].check()
    xs = [np.full(8, r + 0.5, np.float32) for r in range(2)]
    for g in on_ranks(pair, lambda c: c.all_reduce(xs[c.rank].copy())):
        assert_bits_equal(g, tree(xs))


def test_reductions_of_bools_are_refused_naming_bool(pair):
    # bool arrays travel as their bytes (all_gather), but nothing adds bools: every reduction
    # refuses them before any work, naming bool (the message said u8, the bytes' name).
    x = np.ones(16, np.bool_)
    out = np.zeros(16, np.bool_)
    for call in (lambda: pair[0].all_reduce(x, out=out), lambda: pair[0].all_reduce(x),
                 lambda: pair[0].reduce_scatter(x, out=out[:8]),
                 lambda: pair[0].reduce_scatter_many([x], outs=[out[:8]])):
        with pytest.raises(detcoll.UnsupportedDtype, match="does not reduce bool"):
            call()
        assert not out.any() and x.all()
    with pytest.raises(detcoll.UnsupportedDtype, match="all_reduce_residual_rmsnorm does not reduce bool"):
        pair[0].all_reduce_residual_rmsnorm(x.reshape(2, 8), np.zeros((2, 8), np.bool_), np.ones(8, np.bool_), out=out.reshape(2, 8))
    assert not out.any()
    # A bool array still gathers, byte for byte.
    xs = [np.array([r == 0, True, False, r == 1]) for r in range(2)]
    for g in on_ranks(pair, lambda c: c.all_gather(xs[c.rank])):
        assert_bits_equal(g, np.concatenate(xs))


def test_in_place_read_only_is_refused(pair):
    x = np.full(16, SENTINEL, np.float32)
    x.setflags(write=False)
    with pytest.raises(detcoll.InvalidArgument, match="read-only"):
        pair[0].all_reduce(x)
    untouched(x)


def test_reduce_scatter_many_in_place_read_only_is_refused(pair, tmp_path):
    # An in-place lane (outs[i] is xs[i]) writes its input: a read-only array was written
    # (and a read-only memmap crashed the process) because only outs that were not the input
    # were checked. Now InvalidArgument before any work, whichever lane it is.
    ok = np.full(16, SENTINEL, np.float32)
    ro = np.full(16, SENTINEL, np.float32)
    ro.setflags(write=False)
    with pytest.raises(detcoll.InvalidArgument, match=r"outs\[1\] \(in place, xs\[1\]\): the array is read-only"):
        pair[0].reduce_scatter_many([ok, ro], outs=[ok, ro])
    untouched(ok)
    untouched(ro)
    path = tmp_path / "lane.bin"
    np.full(16, SENTINEL, np.float32).tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r", shape=(16,))
    with pytest.raises(detcoll.InvalidArgument, match="read-only"):
        pair[0].reduce_scatter_many([mapped], outs=[mapped])
    untouched(np.array(mapped))


def test_all_gather_x_at_outs_start_on_another_rank_is_refused(pair):
    # x = out[:n] is rank 0's in-place form, but on rank 1 it is an input overlapping out: the
    # raw call read equal addresses as in place, so both ranks returned out with rank 0's x
    # twice and no error. Now rank 1 alone raises Overlap before any work.
    n = 4
    out = np.full(2 * n, SENTINEL, np.float32)
    out[:n] = 101.0
    before = out.copy()
    with pytest.raises(detcoll.Overlap, match="shard 1"):
        pair[1].all_gather(out[:n], out=out)
    assert_bits_equal(out, before, "out after the refused all_gather")
    # The in-place form on both ranks still gathers.
    outs = [np.full(2 * n, SENTINEL, np.float32) for _ in range(2)]
    for r in range(2):
        outs[r][r * n:(r + 1) * n] = 100.0 + r

    def gather(c):
        o = outs[c.rank]
        return c.all_gather(o[c.rank * n:(c.rank + 1) * n], out=o)

    want = np.concatenate([np.full(n, 100.0, np.float32), np.full(n, 101.0, np.float32)])
    for g in on_ranks(pair, gather):
        assert_bits_equal(g, want, "in-place all_gather")


def test_lanes_must_share_a_dtype(pair):
    outs = [np.full(4, SENTINEL, np.float32), np.full(4, SENTINEL, np.float16)]
    with pytest.raises(detcoll.DtypeMismatch):
        pair[0].reduce_scatter_many([np.ones(8, np.float32), np.ones(8, np.float16)], outs=outs)
    untouched(outs[0])
    with pytest.raises(detcoll.LengthMismatch):
        pair[0].reduce_scatter_many([np.ones(8, np.float32)], outs=[])


def test_bad_construction():
    # Every world from 1 to 4096 takes the canonical tree; above it the group is refused
    # before any rank is started.
    with pytest.raises(detcoll.UnsupportedWorldSize):
        detcoll.thread_group(4097, capacity=4096)
    with pytest.raises(detcoll.InvalidConfig):
        detcoll.thread_group(0)
    with pytest.raises(detcoll.InvalidConfig):
        detcoll.thread_group(2, capacity=0)
    with pytest.raises(detcoll.InvalidConfig):
        detcoll.create_deterministic_collective(device="tpu")
    with pytest.raises(detcoll.InvalidConfig):
        detcoll.create_deterministic_collective(device="cuda:x")


def test_peer_errors_share_a_base_and_every_error_has_peer():
    # One `except detcoll.PeerError` catches every way a peer can fail to take part.
    for cls in (detcoll.PeerTimeout, detcoll.PeerDied, detcoll.PeerFailed, detcoll.PeerClosed):
        assert issubclass(cls, detcoll.PeerError), cls
    assert issubclass(detcoll.PeerError, detcoll.DetcollError)
    for cls in (detcoll.Poisoned, detcoll.SignatureMismatch, detcoll.InvalidArgument, detcoll.Closed):
        assert not issubclass(cls, detcoll.PeerError), cls
    # An error that blames no rank still has the attribute.
    with pytest.raises(detcoll.InvalidConfig) as info:
        detcoll.thread_group(0)
    assert info.value.peer is None


def test_closed():
    comms = detcoll.thread_group(2, capacity=4096)
    close_all(comms)
    out = np.full(4, SENTINEL, np.float32)
    with pytest.raises(detcoll.Closed):
        comms[0].all_reduce(np.ones(4, np.float32), out=out)
    untouched(out)
    with pytest.raises(detcoll.DetcollError):
        comms[1].check()


def test_world_of_one_without_a_launcher(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    with detcoll.create_deterministic_collective(device="cpu", capacity=4096) as c:
        assert (c.rank, c.world_size, c.platform) == (0, 1, "cpu")
        x = np.arange(10, dtype=np.float16)
        assert_bits_equal(c.all_reduce(x.copy()), x)
        assert_bits_equal(c.all_gather(x), x)
        assert_bits_equal(c.reduce_scatter(x), x)


def test_a_peer_that_gave_up_is_peer_failed_not_peer_died(monkeypatch):
    # Rank 1 arrives after rank 0's bound: rank 0 times out and stops (alive). Rank 1's first
    # call may still complete (rank 0's input was intact); its next call names rank 0 as
    # stopped after a failure of its own, not as a dead process.
    import time

    monkeypatch.setenv("DETCOLL_TIMEOUT_MS", "500")
    comms = detcoll.thread_group(2)

    def calls(c):
        x = np.full(64, c.rank + 1, np.float32)
        if c.rank == 1:
            time.sleep(1.5)
        got = []
        for _ in range(2):
            try:
                c.all_reduce(x)
                got.append("ok")
            except detcoll.DetcollError as e:
                # The rank it blames, as an attribute (None where it blames none).
                got.append((type(e).__name__, e.peer, str(e), isinstance(e, detcoll.PeerError)))
        return got

    r0, r1 = on_ranks(comms, calls)
    assert r0[0][:2] == ("PeerTimeout", 1) and r0[0][3], r0
    assert r0[1][0] == "Poisoned" and not r0[1][3], r0
    if r1[0] == "ok":
        name, peer, msg, peer_error = r1[1]
        assert (name, peer, peer_error) == ("PeerFailed", 0, True), r1
        assert "rank 0 stopped after a failure of its own" in msg and "timed out" in msg, msg
    close_all(comms)


def test_abort_fails_a_waiting_peer_at_once_and_poisons_the_aborted_rank(monkeypatch):
    # As ncclCommAbort: rank 1 aborts (its other group failed, say) while rank 0 waits in an
    # all_reduce for it; rank 0 raises PeerFailed naming rank 1 long before its 30 s bound, and
    # rank 1's later calls raise Poisoned with the reason. Nothing returns as a success.
    import time

    monkeypatch.setenv("DETCOLL_TIMEOUT_MS", "30000")
    comms = detcoll.thread_group(2)

    def calls(c):
        x = np.full(64, c.rank + 1, np.float32)
        got = []
        if c.rank == 1:
            time.sleep(0.3)
            c.abort("the data-parallel group failed")
        for _ in range(2 if c.rank == 0 else 1):
            t = time.monotonic()
            try:
                c.all_reduce(x)
                got.append(("ok", None, "", time.monotonic() - t))
            except detcoll.DetcollError as e:
                got.append((type(e).__name__, e.peer, str(e), time.monotonic() - t))
        return got

    r0, r1 = on_ranks(comms, calls)
    name, peer, msg, took = r0[0]
    assert (name, peer) == ("PeerFailed", 1), r0
    assert "stopped taking part" in msg and took < 10, r0
    assert r0[1][0] == "Poisoned", r0
    assert r1[0][0] == "Poisoned" and "data-parallel group failed" in r1[0][2], r1
    close_all(comms)


def test_abort_from_a_watchdog_thread_ends_a_waiting_call(monkeypatch):
    # As torch's NCCL watchdog calls abort: rank 0's call waits for rank 1, which never calls;
    # another thread aborts rank 0, and the waiting call raises Poisoned at once (never returns
    # as a success), long before the 30 s bound.
    import threading
    import time

    monkeypatch.setenv("DETCOLL_TIMEOUT_MS", "30000")
    comms = detcoll.thread_group(2)
    out = np.full(64, SENTINEL, np.float32)
    watchdog = threading.Timer(0.3, comms[0].abort, args=("watchdog: the step took too long",))
    watchdog.start()
    t = time.monotonic()
    with pytest.raises(detcoll.Poisoned):
        comms[0].all_reduce(np.ones(64, np.float32), out=out)
    assert time.monotonic() - t < 10
    watchdog.join()
    close_all(comms)
