"""Shared helpers: ranks as threads of this process, and skips that say why. Imports nothing
beyond the standard library (the device checks run under it where numpy may be missing)."""

import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def need_dtype(name):
    from reference import BF16  # here, not at import: device/ runs under this conftest without numpy

    if name == "bf16" and BF16 is None:
        pytest.skip("bf16 numpy arrays need ml_dtypes (pip install ml_dtypes), which is not installed")


def in_step(comms):
    """The calls one rank alone refused (the tests refuse on one rank: such a call cannot
    wait for a peer, so cannot hang), refused on every other rank too, as a program making the
    same bad call on every rank does. Every rank numbers the calls it makes or refuses and
    signs its next call with that number, so a call refused on one rank only fails the ranks'
    next call with SignatureMismatch instead of pairing it with another call
    (test_refused_on_one_rank.py); ``count_refused_call`` is what a wrapper calls for a call
    it refused itself."""
    counts = [c.raw.calls_begun for c in comms]
    for c, n in zip(comms, counts):
        for _ in range(max(counts) - n):
            c.raw.count_refused_call()


def on_ranks(comms, fn, *args):
    """``fn(comm, *args)`` on every communicator, one thread each (a collective call returns
    only when every rank has made it), after ``in_step``; the results in rank order, the first
    exception raised."""
    in_step(comms)
    results, errors = [None] * len(comms), [None] * len(comms)

    def run(i):
        try:
            results[i] = fn(comms[i], *args)
        except BaseException as e:  # re-raised below on the test's thread
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a rank thread did not finish within 120 s"
    for e in errors:
        if e is not None:
            raise e
    return results


def close_all(comms):
    on_ranks(comms, lambda c: c.close())
