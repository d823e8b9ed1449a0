"""The oracle of the Python tests: the canonical rank tree written out here in numpy, and
bitwise comparison. Shared by the test modules and the rank processes they start."""

import numpy as np

from tree import tree as _tree

try:
    import ml_dtypes

    BF16 = ml_dtypes.bfloat16
except ImportError:  # the bf16 tests skip and say so
    BF16 = None

REDUCE_DTYPES = ("f32", "f16", "bf16")
GATHER_DTYPES = ("f64", "u8", "i8", "i16", "u32", "i64", "bool")
_NP = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "u8": np.uint8, "i8": np.int8,
       "i16": np.int16, "u32": np.uint32, "i64": np.int64, "bool": np.bool_}


def np_dtype(name):
    """numpy dtype of a detcoll dtype name (None: bf16 without ml_dtypes)."""
    return BF16 if name == "bf16" else _NP[name]


def tree(parts):
    """The canonical tree (tree.py), every add in the parts' dtype (numpy adds f16/bf16 via f32
    then rounds once to nearest even: exact, since f32 has more than twice their precision plus
    two bits); inf and inf - inf are test values, so numpy's warnings about them are silenced."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _tree(parts)


def contribution(name, rank, n, seed=0):
    """Rank ``rank``'s input of ``n`` elements: mixed magnitudes (so the order of adds shows in
    the bits), with ±0, subnormals, ±inf and values that overflow when added."""
    rng = np.random.default_rng([seed, rank, n])
    dt = np_dtype(name)
    if name == "bool":
        return rng.integers(0, 2, n).astype(np.bool_)
    if name in ("u8", "i8", "i16", "u32", "i64"):
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dt)
    vals = rng.standard_normal(n) * np.float64(10.0) ** rng.integers(-3, 4, n)
    x = vals.astype(np.float32).astype(dt)
    if name in REDUCE_DTYPES and n >= 8:
        big = {"f32": 3.0e38, "f16": 60000.0, "bf16": 3.0e38}[name]
        tiny = {"f32": 1e-45, "f16": 6e-8, "bf16": 1e-40}[name]
        special = np.array([0.0, -0.0, tiny, -tiny, big, np.inf if rank % 2 else -np.inf, big, 1.0], np.float64)
        x[: len(special)] = special.astype(np.float32).astype(dt)
    return x


def bits(a):
    """The bit patterns of ``a`` (unsigned integers of its width)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bits_equal(got, want, what=""):
    """Bit for bit, except that a NaN only has to be a NaN (payloads are not in the contract)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape}/{got.dtype} vs {want.shape}/{want.dtype}"
    if got.dtype.kind in "fV" or got.dtype == BF16:
        gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
        assert (gn == wn).all(), f"{what}: NaN positions differ"
        keep = ~wn
        diff = np.flatnonzero(bits(got)[keep] != bits(want)[keep])
    else:
        diff = np.flatnonzero(bits(got) != bits(want))
    assert diff.size == 0, f"{what}: {diff.size} elements differ, first at {diff[:5]}"


# The fused norm's lanes (docs/contract.md, "Fused all_reduce + residual + RMSNorm").
LANES, VECTOR = 256, 8
CHUNK = LANES * VECTOR


def rmsnorm(h, weight, eps):
    """``y = dtype(f32(h) * inv * f32(w))`` with ``inv = 1 / sqrt(q / hidden + eps)``, ``q`` the sum
    of squares: lane ``t`` adds the squares of elements ``c * 2048 + 8t + v`` in increasing order
    into its f32 partial, then ``p_t = p_t + p_{t+s}`` for ``s = 128 .. 1``."""
    rows, hidden = h.shape
    hf, wf = h.astype(np.float32), weight.astype(np.float32)
    y = np.empty_like(h)
    lane = np.arange(LANES)
    with np.errstate(all="ignore"):
        for r in range(rows):
            part = np.zeros(LANES, np.float32)
            for c in range(-(-hidden // CHUNK)):
                for v in range(VECTOR):
                    j = c * CHUNK + VECTOR * lane + v
                    inside = j < hidden
                    e = hf[r, np.where(inside, j, 0)]
                    part = np.where(inside, part + e * e, part)
            s = LANES // 2
            while s >= 1:
                part[:s] = part[:s] + part[s : 2 * s]
                s //= 2
            inv = np.float32(1.0) / np.sqrt(part[0] / np.float32(hidden) + np.float32(eps))
            y[r] = ((hf[r] * inv) * wf).astype(h.dtype)
    return y
