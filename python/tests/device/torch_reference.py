"""The oracle of the GPU checks, in torch alone (the device host may have no numpy): seeded
contributions and the canonical rank tree on the CPU. Each f16/bf16 add goes through f32 with
one rounding to nearest even (exact: f32 has more than twice their precision plus two bits):
torch's own CPU adds for f16 and f32, integer rounding for bf16 (checked against ml_dtypes)."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tree import tree as _tree  # noqa: E402  (the oracle's order: tests/tree.py)

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


class _Bf16:
    """A bf16 value held in f32, added in f32 and rounded to nearest even with integer ops:
    bf16 adds that no CPU instruction can flush (AVX512-BF16 conversions flush subnormals)."""

    def __init__(self, f32):
        self.f32 = f32

    def __add__(self, other):
        s = (self.f32 + other.f32).view(torch.int32).to(torch.int64)
        rounded = ((s + 0x7FFF + ((s >> 16) & 1)) >> 16) << 16  # ties to even; overflow -> inf
        return _Bf16(rounded.to(torch.int32).view(torch.float32))

    def clone(self):
        return _Bf16(self.f32.clone())


def tree(parts):
    """The canonical tree over ``parts`` (tests/tree.py's order), every add in their dtype."""
    if parts[0].dtype != torch.bfloat16:
        return _tree(parts)  # f32, f16: torch's CPU adds (f16 through f32, one rounding)
    f32 = _tree([_Bf16(p.float()) for p in parts]).f32
    return (f32.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)  # exact: representable


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
