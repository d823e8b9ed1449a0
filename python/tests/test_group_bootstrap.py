"""The bootstrap through a caller's group (what a torch.distributed group does through
``all_gather_object``): the handles travel through a Python callable the Rust side calls back
with the GIL re-taken. Ranks are threads here, with a barrier-based exchange as the group."""

import threading

import pytest

import detcoll
from detcoll import _detcoll
from conftest import close_all, on_ranks
from reference import assert_bits_equal, contribution, tree


class ThreadGroup:
    """An in-process group: ``gather(rank)(bytes) -> list[bytes]`` in rank order."""

    def __init__(self, world):
        self.world = world
        self.slots = [None] * world
        self.calls = 0
        self.barrier = threading.Barrier(world)

    def gather(self, rank):
        def exchange(mine):
            assert isinstance(mine, bytes)
            self.slots[rank] = mine
            self.barrier.wait(30)
            out = list(self.slots)
            self.barrier.wait(30)
            if rank == 0:
                self.calls += 1
            return out

        return exchange


@pytest.mark.parametrize("world", [1, 2, 4])
def test_from_group_callback(world):
    group = ThreadGroup(world)
    comms = [None] * world

    def build(r):
        raw = _detcoll.from_group(r, world, r, world, group.gather(r), 4096, "cpu", None)
        comms[r] = detcoll.Collective(raw)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(c is not None for c in comms), "construction through the callback did not finish"
    assert group.calls >= 1, "the Rust side never called the group's exchange"
    xs = [contribution("f16", r, 8 * 300) for r in range(world)]
    for r, g in enumerate(on_ranks(comms, lambda c: c.all_reduce(xs[c.rank].copy()))):
        assert (comms[r].rank, comms[r].world_size) == (r, world)
        assert_bits_equal(g, tree(xs), f"rank {r}")
    close_all(comms)


def test_a_failing_callback_is_a_bootstrap_error():
    def broken(mine):
        raise ConnectionError("the group is gone")

    with pytest.raises(detcoll.DetcollError, match="the group is gone"):
        _detcoll.from_group(0, 1, 0, 1, broken, 4096, "cpu", None)


def test_a_wrong_answer_is_a_bootstrap_error():
    with pytest.raises(detcoll.BootstrapError, match="entries"):
        _detcoll.from_group(0, 1, 0, 1, lambda mine: [mine, mine], 4096, "cpu", None)
    with pytest.raises(detcoll.BootstrapError, match="list of bytes"):
        _detcoll.from_group(0, 1, 0, 1, lambda mine: "not bytes", 4096, "cpu", None)


def test_bad_layout_is_refused():
    with pytest.raises(detcoll.InvalidConfig):
        _detcoll.from_group(2, 2, 0, 1, lambda mine: [mine], 4096, "cpu", None)
    with pytest.raises(detcoll.InvalidConfig):
        _detcoll.from_group(0, 2, 1, 1, lambda mine: [mine], 4096, "cpu", None)
