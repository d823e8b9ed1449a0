"""The oracle of the GPU checks, in torch alone (the device host may have no numpy): seeded
contributions and the canonical rank tree evaluated by torch on the CPU, whose f16/bf16 adds
go through f32 with one rounding to nearest even (exact: f32 has more than twice their
precision plus two bits)."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tree import tree  # noqa: E402,F401  (the oracle: tests/tree.py)

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
_TINY = {"f32": 1e-45, "f16": 6e-8, "bf16": 1e-40}  # subnormals of each dtype
_BIG = {"f32": 3.0e38, "f16": 60000.0, "bf16": 3.0e38}  # two of them overflow to inf
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def contribution(name, rank, n, seed=0):
    """Rank ``rank``'s ``n`` inputs (CPU): mixed magnitudes, with ±0, subnormals and values
    whose sum overflows (never inf - inf, so no NaN)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + n)
    vals = torch.randn(n, generator=g, dtype=torch.float64)
    vals *= torch.pow(10.0, torch.randint(-3, 4, (n,), generator=g).double())
    x = vals.float().to(DTYPES[name])
    if n >= 8:
        t, b = _TINY[name], _BIG[name]
        x[:8] = torch.tensor([0.0, -0.0, t, -t, b, b, 1.0, -1.0], dtype=torch.float32).to(DTYPES[name])
    return x


def bits(t):
    """The bit patterns of ``t`` as integers of its width (CPU)."""
    t = t.detach().contiguous().cpu()
    return t.view(_INT[t.element_size()])


def differing(got, want):
    """How many elements differ in their bits (0: bit-identical)."""
    g, w = bits(got).flatten(), bits(want).flatten()
    if g.shape != w.shape:
        return max(g.numel(), w.numel())
    return int((g != w).sum())
