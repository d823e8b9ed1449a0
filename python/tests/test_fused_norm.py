"""``Collective.all_reduce_residual_rmsnorm`` on the CPU twin with ranks as threads: ``y`` and the
updated ``residual`` of every rank bit for bit equal to a numpy evaluation of the contract
written here (docs/contract.md, "Fused all_reduce + residual + RMSNorm"): the tree, the residual
add in the dtype, the f32 sum of squares over 256 lanes then a halving tree, one rounding per
step. Refused calls write nothing."""

import numpy as np
import pytest

import detcoll
from conftest import close_all, need_dtype, on_ranks
from reference import REDUCE_DTYPES, assert_bits_equal, np_dtype, rmsnorm, tree

CAPACITY = 64 << 10
EPS = 1e-6
# (rows, hidden): one row; a hidden that is not a multiple of 8; 5 x 4096 f32 (80 KiB) runs in
# chunks of the 64 KiB staging; 70 rows: above the one-kernel limit (a second launch); 80 x 2048
# (320 KiB in f16/bf16, above the CPU twin's RS+AG threshold): the RS+AG route in chunks of 4-8
# rows, then the second launch; 0 x 64: an empty batch (a rank with no tokens this step).
SHAPES = ((1, 8), (3, 2049), (5, 4096), (70, 24), (80, 2048), (0, 64))


def values(dtype, shape, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np_dtype(dtype))


@pytest.fixture(scope="module", params=(1, 2, 3, 4), ids=lambda w: f"w{w}")
def group(request):
    comms = detcoll.thread_group(request.param, capacity=CAPACITY)
    yield comms
    close_all(comms)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
@pytest.mark.parametrize("form", ["in_place", "out"])
def test_equals_the_contract(group, dtype, shape, form):
    need_dtype(dtype)
    world = len(group)
    xs = [values(dtype, shape, [7, r, shape[0]]) for r in range(world)]
    residual = values(dtype, shape, [8, shape[0]], 4.0)
    weight = values(dtype, (shape[1],), [9, shape[1]])
    with np.errstate(all="ignore"):
        h = residual + tree(xs)
    y = rmsnorm(h, weight, EPS)

    def call(c):
        x, res = xs[c.rank].copy(), residual.copy()
        if form == "in_place":
            got_y, got_res = c.all_reduce_residual_rmsnorm(x, res, weight, eps=EPS)
            assert got_y is x and got_res is res
        else:
            out = np.zeros_like(x)
            got_y, got_res = c.all_reduce_residual_rmsnorm(x, res, weight, eps=EPS, out=out)
            assert got_y is out and got_res is res
            assert_bits_equal(x, xs[c.rank], "x with out= given")
        return got_y, got_res

    for r, (gy, gres) in enumerate(on_ranks(group, call)):
        assert_bits_equal(gres, h, f"rank {r}: residual (h)")
        assert_bits_equal(gy, y, f"rank {r}: y")


def test_a_row_has_the_same_bits_alone_and_in_a_batch(group):
    world, hidden = len(group), 4096
    xs = [values("f32", (9, hidden), [3, r]) for r in range(world)]
    residual = values("f32", (9, hidden), [4])
    weight = values("f32", (hidden,), [5])

    def call(c, rows):
        x, res = xs[c.rank][rows].copy(), residual[rows].copy()
        return c.all_reduce_residual_rmsnorm(x, res, weight, eps=EPS)[0]

    batch = on_ranks(group, call, slice(0, 9))[0]
    alone = on_ranks(group, call, slice(6, 7))[0]
    assert_bits_equal(alone[0], batch[6], "row 6 alone vs in a batch of 9")


def test_refused_calls_write_nothing(group):
    x = values("f32", (2, 64), [1])
    residual = values("f32", (2, 64), [2])
    weight = values("f32", (64,), [3])
    cases = [
        ("a short weight", dict(weight=weight[:63]), detcoll.LengthMismatch),
        ("a residual of another dtype", dict(residual=residual.astype(np.float16)), detcoll.DtypeMismatch),
        ("a short residual", dict(residual=residual[:1]), detcoll.LengthMismatch),
        ("a negative eps", dict(eps=-1.0), detcoll.InvalidArgument),
        # Beyond f32: refused naming the value passed (it read "eps is inf" before).
        ("an eps beyond f32", dict(eps=1e300), detcoll.InvalidArgument),
        ("an out of another size", dict(out=np.zeros((1, 64), np.float32)), detcoll.LengthMismatch),
    ]
    for what, change, error in cases:
        args = dict(x=x.copy(), residual=residual.copy(), weight=weight, eps=EPS, out=None)
        args.update({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in change.items()})
        before = {k: v.copy() for k, v in args.items() if isinstance(v, np.ndarray)}

        def call(c):
            with pytest.raises(error):
                c.all_reduce_residual_rmsnorm(**args)

        # Every rank is refused by its own checks, before any collective work: one at a time.
        for c in group:
            call(c)
        for k, v in before.items():
            assert_bits_equal(args[k], v, f"{what}: {k} was written")


def test_residual_sharing_memory_with_x_and_an_out_is_refused(group):
    # ``residual`` is updated in place to ``h``; with ``out=`` given, ``x`` is read by the
    # all_reduce and not written, so a residual over ``x`` would write ``h`` where the
    # all_reduce may still read: refused as an overlap, nothing written.
    buf = values("f32", (3, 64), [1])
    weight = values("f32", (64,), [3])
    before = buf.copy()
    out = np.full((2, 64), -7.0, np.float32)
    for what, residual in (("the residual is x", buf[0:2]), ("the residual overlaps x", buf[1:3])):
        for c in group:
            with pytest.raises(detcoll.Overlap):
                c.all_reduce_residual_rmsnorm(buf[0:2], residual, weight, eps=EPS, out=out)
        assert_bits_equal(buf, before, f"{what}: x or the residual was written")
        assert (out == -7.0).all(), f"{what}: out was written"


def test_an_eps_beyond_f32_is_named_as_passed(group):
    x, residual, weight = values("f32", (2, 64), [1]), values("f32", (2, 64), [2]), values("f32", (64,), [3])
    with pytest.raises(detcoll.InvalidArgument, match="eps is 1e300"):
        group[0].all_reduce_residual_rmsnorm(x, residual, weight, eps=1e300)
