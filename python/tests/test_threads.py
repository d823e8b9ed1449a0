"""Every op, dtype, world and form on the CPU twin with ranks as threads of this process,
compared bit for bit with the tree written in reference.py."""

import numpy as np
import pytest

import detcoll
from conftest import close_all, need_dtype, on_ranks
from reference import GATHER_DTYPES, REDUCE_DTYPES, assert_bits_equal, contribution, tree

# 3 and 6: worlds that are not a power of two take the canonical tree (docs/contract.md); 12:
# above 8 ranks on one host, nodes of 4 (hierarchical), the same bits.
WORLDS = (1, 2, 3, 4, 6, 8, 12)
# 104 elements: a few vector widths plus a tail; 24008 f32 (94 KiB) runs in chunks of the
# 64 KiB staging capacity.
SIZES = (104, 24008)
CAPACITY = 64 << 10


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"w{w}")
def group(request):
    comms = detcoll.thread_group(request.param, capacity=CAPACITY)
    yield comms
    close_all(comms)


def inputs(dtype, world, n, seed=1):
    return [contribution(dtype, r, n, seed) for r in range(world)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "out"])
def test_all_reduce(group, dtype, n, in_place):
    need_dtype(dtype)
    xs = inputs(dtype, len(group), n)
    want = tree(xs)

    def call(c, x):
        x = x.copy()
        if in_place:
            assert c.all_reduce(x) is x
            return x
        out = np.empty_like(x)
        assert c.all_reduce(x, out=out) is out
        return out

    got = on_ranks(group, lambda c: call(c, xs[c.rank]))
    for r, g in enumerate(got):
        assert_bits_equal(g, want, f"rank {r}")


@pytest.mark.parametrize("dtype", REDUCE_DTYPES + GATHER_DTYPES)
@pytest.mark.parametrize("form", ["alloc", "out", "in_place"])
def test_all_gather(group, dtype, form):
    need_dtype(dtype)
    world, n = len(group), 37
    xs = inputs(dtype, world, n)
    want = np.concatenate(xs)

    def call(c):
        x = xs[c.rank]
        if form == "alloc":
            return c.all_gather(x)
        out = np.zeros(world * n, x.dtype)
        if form == "in_place":
            out[c.rank * n:(c.rank + 1) * n] = x
            x = out[c.rank * n:(c.rank + 1) * n]  # a view of out's shard `rank`
        assert c.all_gather(x, out=out) is out
        return out

    for r, g in enumerate(on_ranks(group, call)):
        assert_bits_equal(g, want, f"rank {r}")


def test_all_gather_keeps_trailing_dims(group):
    world = len(group)
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * r for r in range(world)]
    got = on_ranks(group, lambda c: c.all_gather(xs[c.rank]))
    for g in got:
        assert g.shape == (2 * world, 3)
        assert_bits_equal(g, np.concatenate(xs))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
@pytest.mark.parametrize("form", ["alloc", "out", "in_place"])
def test_reduce_scatter(group, dtype, n, form):
    need_dtype(dtype)
    world = len(group)
    n = n * world  # divisible
    xs = inputs(dtype, world, n)
    want = tree(xs)
    shard = n // world

    def call(c):
        x = xs[c.rank].copy()
        if form == "alloc":
            return c.reduce_scatter(x)
        if form == "in_place":
            assert c.reduce_scatter(x, out=x) is x
            return x[c.rank * shard:(c.rank + 1) * shard]  # NCCL's in-place form: the shard at `rank`
        out = np.empty(shard, x.dtype)
        assert c.reduce_scatter(x, out=out) is out
        return out

    for r, g in enumerate(on_ranks(group, call)):
        assert_bits_equal(g, want[r * shard:(r + 1) * shard], f"rank {r}")


@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
@pytest.mark.parametrize("given", [False, True], ids=["alloc", "outs"])
def test_reduce_scatter_many(group, dtype, given):
    need_dtype(dtype)
    world = len(group)
    sizes = (16 * world, 40 * world, 8 * world)
    lanes = [inputs(dtype, world, n, seed=10 + i) for i, n in enumerate(sizes)]
    wants = [tree(lane) for lane in lanes]

    def call(c):
        xs = [lane[c.rank] for lane in lanes]
        if not given:
            return c.reduce_scatter_many(xs)
        outs = [np.empty(n // world, xs[0].dtype) for n in sizes]
        got = c.reduce_scatter_many(xs, outs=outs)
        assert all(g is o for g, o in zip(got, outs))
        return got

    for r, outs in enumerate(on_ranks(group, call)):
        for i, (g, w, n) in enumerate(zip(outs, wants, sizes)):
            s = n // world
            assert_bits_equal(g, w[r * s:(r + 1) * s], f"rank {r} lane {i}")


def test_repeat_is_bitwise(group):
    xs = inputs("f16", len(group), 4096)
    first = on_ranks(group, lambda c: c.all_reduce(xs[c.rank].copy()))
    second = on_ranks(group, lambda c: c.all_reduce(xs[c.rank].copy()))
    for a, b in zip(first, second):
        assert_bits_equal(a, b)
        assert_bits_equal(a, first[0])


def test_properties(group):
    world = len(group)
    for r, c in enumerate(group):
        assert (c.rank, c.world_size, c.platform) == (r, world, "cpu")
        assert c.supports_async_overlap is False
        assert c.supports_compute_communication_fusion is False
        assert c.capabilities["strict_fixed_order"] is True
        assert c.capabilities["capacity_bytes"] == CAPACITY
        for op in ("all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_many"):
            assert c.route(op, 4096) == group[0].route(op, 4096)
            assert c.route(op, 4096).startswith(("ipc", "local", "transport", "copy", "hier")), c.route(op, 4096)
        c.check()
        c.synchronize()
    with pytest.raises(detcoll.InvalidArgument, match="unknown operation 'broadcast'"):
        group[0].route("broadcast", 64)
    # The fused call's all_reduce: the CPU table has no rules of its own for it.
    for n in (0, 4096, 1 << 20):
        assert group[0].route("all_reduce_residual_rmsnorm", n) == group[0].route("all_reduce", n)


def test_a_table_routes_the_fused_call_on_its_own(monkeypatch, tmp_path):
    rule = lambda op, route: {"op": op, "min_bytes": 0, "max_bytes": None, "route": route}
    table = {
        "platform": "cpu",
        "source": "test: the fused call on its own route",
        "rules": [rule("all_reduce", "ipc_push_ll"), rule("all_gather", "ipc_one_shot"),
                  rule("reduce_scatter", "ipc_one_shot"), rule("reduce_scatter_many", "ipc_one_shot"),
                  rule("all_reduce_residual_rmsnorm", "ipc_rs_ag")],
    }
    path = tmp_path / "table.json"
    path.write_text(__import__("json").dumps(table))
    monkeypatch.setenv("DETCOLL_ROUTING_TABLE", str(path))
    comms = detcoll.thread_group(2, capacity=CAPACITY)
    try:
        for c in comms:
            assert c.route("all_reduce", 4096) == "ipc_push_ll"
            assert c.route("all_reduce_residual_rmsnorm", 4096) == "ipc_rs_ag"
    finally:
        close_all(comms)


@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_oracle_sees_the_order(dtype):
    """The comparison can fail: a left-to-right sum of the same inputs differs from the tree in
    some bits (so a backend adding in another order would fail the tests above)."""
    need_dtype(dtype)
    xs = inputs(dtype, 4, 4096)
    with np.errstate(over="ignore", invalid="ignore"):
        linear = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    with pytest.raises(AssertionError, match="elements differ"):
        assert_bits_equal(linear, tree(xs))
