"""detcoll.reference.tree (the package's, used by the examples and the benchmark) against the
tests' own level-by-level formulation, for every count of parts, bit for bit."""

import numpy as np
import pytest

from detcoll.reference import tree as package_tree
from reference import assert_bits_equal, contribution
from tree import tree as oracle_tree


@pytest.mark.parametrize("count", range(1, 17))
def test_both_trees_agree(count):
    parts = [contribution("f16", r, 512, seed=3) for r in range(count)]
    with np.errstate(over="ignore", invalid="ignore"):  # inf and inf - inf are test values
        assert_bits_equal(package_tree(parts), oracle_tree(parts), f"{count} parts")


def test_the_shape_is_canonical():
    # Strings make the grouping visible: + concatenates with the parentheses written out.
    class Sym(str):
        def __add__(self, other):
            return Sym(f"({self}+{other})")

        def copy(self):
            return self

    leaves = [Sym(f"r{i}") for i in range(8)]
    assert oracle_tree(leaves) == "(((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)))"
    assert package_tree(leaves[:6]) == "(((r0+r1)+(r2+r3))+(r4+r5))"
    assert oracle_tree(leaves[:6]) == package_tree(leaves[:6])
    assert package_tree(leaves[:3]) == oracle_tree(leaves[:3]) == "((r0+r1)+r2)"


# detcoll.reference.residual_rmsnorm (the package's, for users checking a fused call) against the
# tests' own row-by-row evaluation of the contract and against the CPU twin's fused call (whose
# bits the Rust tests hold equal to fixed_tree::residual_rmsnorm), on adversarial rows.

import detcoll  # noqa: E402
from conftest import close_all, need_dtype, on_ranks  # noqa: E402
from detcoll.reference import residual_rmsnorm as package_norm  # noqa: E402
from reference import REDUCE_DTYPES, np_dtype, rmsnorm, tree  # noqa: E402

NORM_SHAPES = ((1, 8), (3, 2049), (7, 4096), (2, 24), (5, 100))


def adversarial(name, shape, seed, rank):
    """Rows of kinds chosen per row (the same kind in every rank's tensor): moderate values;
    specials sprinkled in (NaN, ±inf, ±0, the largest finite: sums overflowing, subnormals);
    zeros (with eps = 0: NaN rows); huge values (f32/bf16: squares overflowing f32, inv = +0);
    tiny ones (squares underflowing: with eps = 0, inv = inf)."""
    rows, hidden = shape
    kinds = np.random.default_rng([seed, 1]).integers(0, 5, rows)
    rng = np.random.default_rng([seed, 2, rank])
    big = {"f32": 3.0e38, "f16": 60000.0, "bf16": 3.0e38}[name]
    huge = {"f32": 1.0e30, "f16": 15000.0, "bf16": 1.0e30}[name]  # squares overflow f32, sums do not
    tiny = {"f32": 1e-45, "f16": 6e-8, "bf16": 1e-40}[name]
    out = np.empty(shape, np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, big, -big, tiny, -tiny, 1.0], np.float32)
    for r, k in enumerate(kinds):
        m = rng.uniform(-1.0, 1.0, hidden).astype(np.float32)
        if k == 0:
            out[r] = m * np.float32(2.0) ** rng.integers(-4, 5, hidden)
        elif k == 1:
            out[r] = np.where(rng.integers(0, 8, hidden) == 0, rng.choice(specials, hidden), m)
        elif k == 2:
            out[r] = np.where(rng.integers(0, 2, hidden) == 0, np.float32(0.0), np.float32(-0.0))
        elif k == 3:
            out[r] = m * np.float32(huge)
        else:
            out[r] = m * np.float32(tiny) * np.float32(64.0)
    return out.astype(np_dtype(name))


def norm_inputs(name, shape, seed, world):
    xs = [adversarial(name, shape, seed, r) for r in range(world)]
    residual = adversarial(name, shape, seed, 100)
    weight = adversarial(name, (1, shape[1]), seed + 7, 200)[0]
    return xs, residual, weight


@pytest.mark.parametrize("eps", [1e-6, 0.0], ids=["eps1e-6", "eps0"])
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", REDUCE_DTYPES)
def test_residual_rmsnorm_equals_the_tests_own_evaluation(name, shape, eps):
    need_dtype(name)
    for world in (1, 2, 3, 5):
        xs, residual, weight = norm_inputs(name, shape, world * 31 + shape[1], world)
        h, y = package_norm(xs, residual, weight, eps)
        with np.errstate(all="ignore"):
            want_h = residual + tree(xs)
        assert_bits_equal(h, want_h, f"world {world}: h")
        assert_bits_equal(y, rmsnorm(want_h, weight, eps), f"world {world}: y")


@pytest.mark.parametrize("name", REDUCE_DTYPES)
def test_residual_rmsnorm_equals_the_cpu_twins_fused_call(name):
    need_dtype(name)
    comms = detcoll.thread_group(3, capacity=64 << 10)
    try:
        for shape in NORM_SHAPES:
            for eps in (1e-6, 0.0):
                xs, residual, weight = norm_inputs(name, shape, shape[0] * 7 + shape[1], 3)

                def call(c):
                    return c.all_reduce_residual_rmsnorm(xs[c.rank].copy(), residual.copy(), weight, eps=eps)

                h, y = package_norm(xs, residual, weight, eps)
                for r, (gy, gh) in enumerate(on_ranks(comms, call)):
                    assert_bits_equal(gh, h, f"{shape} eps {eps} rank {r}: h")
                    assert_bits_equal(gy, y, f"{shape} eps {eps} rank {r}: y")
    finally:
        close_all(comms)


def test_residual_rmsnorm_refuses_what_the_call_refuses():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(TypeError):
        package_norm([x], x.astype(np.float16), np.ones(8, np.float16), 1e-6)
    with pytest.raises(ValueError):
        package_norm([x], x, np.ones(7, np.float32), 1e-6)
    with pytest.raises(ValueError):
        package_norm([x], x, np.ones(8, np.float32), -1.0)
    with pytest.raises(ValueError):
        package_norm([x[:1]], x, np.ones(8, np.float32), 1e-6)
