"""A call one rank refuses (its own bad argument) while its peer makes it.

Before 2026-12-06 the refusing rank did not take part, so its peer's call paired with its
*next* call of the same size and both returned another call's sums as success (an outside
probe with torch: rank 0's inputs 100, 1, 5 against rank 1's refused call, then 1, 5: rank 0
got 101 and 6). Every call a rank makes or refuses is now numbered and signed with its number:
the peer's call and the refusing rank's next one raise ``SignatureMismatch`` (then
``Poisoned``), none returns a mixed sum. Refusals in the wrapper (a strided array), in the
extension (an output of another dtype) and in the collective (an output of the wrong size)
all count. Ranks that all refuse the same call stay in step (``conftest.in_step`` does that for
the other tests, whose refusals are made on one rank).
"""

import threading

import numpy as np
import pytest

import detcoll
from conftest import close_all


def both(fns):
    """fns[r]() on rank r's thread; the results (or exceptions) in rank order."""
    out = [None, None]

    def run(r):
        try:
            out[r] = ("ok", fns[r]())
        except detcoll.DetcollError as e:
            out[r] = ("err", e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a rank did not return within 60 s"
    return out


def refusals():
    f32 = lambda v: np.full(16, v, np.float32)
    return {
        # the wrapper's own check
        "strided input": lambda c: c.all_reduce(np.full(32, 7, np.float32)[::2], out=f32(0)),
        # the extension's check (out of another dtype)
        "out dtype": lambda c: c.all_reduce(f32(7), out=np.zeros(16, np.float16)),
        # the collective's check (out of another size)
        "out size": lambda c: c.all_reduce(f32(7), out=np.zeros(15, np.float32)),
        "gather out size": lambda c: c.all_gather(f32(7), out=np.zeros(31, np.float32)),
        "fused weight": lambda c: c.all_reduce_residual_rmsnorm(
            np.ones((2, 8), np.float32), np.zeros((2, 8), np.float32), np.ones(7, np.float32)),
        "many lanes": lambda c: c.reduce_scatter_many([f32(7), np.ones(16, np.float16)]),
    }


@pytest.mark.parametrize("name", list(refusals()))
def test_a_call_one_rank_refused_fails_on_both_ranks(name):
    comms = detcoll.thread_group(2)
    try:
        refuse = refusals()[name]
        x = lambda v: np.full(16, v, np.float32)

        def rank0():
            return comms[0].all_reduce(x(100.0))  # the call rank 1 refused

        def rank1():
            with pytest.raises(detcoll.InvalidArgument):
                refuse(comms[1])
            return comms[1].all_reduce(x(1.0))  # rank 0's next call is another one

        (s0, r0), (s1, r1) = both([rank0, rank1])
        # Before: both "ok" with 101.0, a sum of two different calls.
        assert s0 == "err", f"{name}: rank 0's call returned {r0[:1]}"
        assert s1 == "err", f"{name}: rank 1's next call returned {r1[:1]}"
        for e in (r0, r1):
            assert isinstance(e, (detcoll.SignatureMismatch, detcoll.Poisoned)), f"{name}: {e!r}"
    finally:
        close_all(comms)


@pytest.mark.parametrize("name", list(refusals()))
def test_a_call_every_rank_refused_leaves_them_in_step(name):
    comms = detcoll.thread_group(2)
    try:
        refuse = refusals()[name]

        def rank(r):
            def go():
                with pytest.raises(detcoll.InvalidArgument):
                    refuse(comms[r])
                return comms[r].all_reduce(np.full(16, 1.0 + r, np.float32))
            return go

        for status, got in both([rank(0), rank(1)]):
            assert status == "ok", f"{name}: {got!r}"
            assert (got.view(np.uint32) == np.float32(3.0).view(np.uint32)).all()
    finally:
        close_all(comms)
