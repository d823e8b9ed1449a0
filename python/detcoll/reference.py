"""The bits detcoll computes, in Python, for checking results and writing TP-invariant layers.

``tree(parts)``: the canonical rank tree. It adds with the parts' own ``+`` (numpy arrays, torch
tensors, scalars), so every add is in their dtype, exactly as detcoll's reductions evaluate it.
One part is a leaf; otherwise the first ``m`` parts (``m`` the largest power of two below their
number) form the left subtree, the rest the right one: for 8 parts
``((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))``.

``residual_rmsnorm(xs, residual, weight, eps)``: the fused all_reduce + residual + RMSNorm
(``Collective.all_reduce_residual_rmsnorm``), on numpy arrays, in the contract's order
(docs/contract.md, "Fused all_reduce + residual + RMSNorm"; the Rust reference is
``fixed_tree::residual_rmsnorm``).
"""

# The sum of squares' lanes and the contiguous elements a lane takes at a time
# (fixed_tree::RMSNORM_LANES, RMSNORM_VECTOR): element j belongs to lane (j // 8) % 256.
LANES = 256
VECTOR = 8


def tree(parts):
    """The canonical tree over ``parts`` (rank order); a copy when there is one part."""
    parts = list(parts)
    if not parts:
        raise ValueError("tree of no parts")
    if len(parts) == 1:
        p = parts[0]
        return p.clone() if hasattr(p, "clone") else (p.copy() if hasattr(p, "copy") else p)
    m = 1
    while m * 2 < len(parts):
        m *= 2
    return tree(parts[:m]) + tree(parts[m:])


def residual_rmsnorm(xs, residual, weight, eps):
    """``(h, y)`` of the fused call whose ranks' inputs are ``xs`` (rank order): ``h = residual +
    tree(xs)`` in the dtype, then every row of ``y`` the RMSNorm of ``h``'s row times ``weight``.

    numpy arrays of one dtype, ``float32``, ``float16`` or ``ml_dtypes.bfloat16``: ``xs`` and
    ``residual`` of one shape ``[..., hidden]``, ``weight`` of ``[hidden]``; ``eps`` a finite
    number, 0 or more, taken as float32. For torch tensors pass ``t.cpu().numpy()`` (float32,
    float16) or ``t.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)`` (bfloat16). Per
    row: ``q``, the float32 sum of squares (lane ``t`` adds the squares of its elements
    ``c * 2048 + 8t + v`` in increasing order, then ``p_t = p_t + p_{t+s}`` for ``s = 128 .. 1``),
    ``inv = 1 / sqrt(q / hidden + eps)`` and ``y = dtype((h * inv) * weight)``, every operation a
    float32 one rounded once (numpy's are IEEE operations; none is fused)."""
    import numpy as np

    residual, weight = np.asarray(residual), np.asarray(weight)
    xs = [np.asarray(x) for x in xs]
    dtype = residual.dtype
    if dtype.name not in ("float32", "float16", "bfloat16"):
        raise TypeError(f"dtype {dtype}: expected float32, float16 or bfloat16")
    for what, a in [("weight", weight)] + [(f"xs[{r}]", x) for r, x in enumerate(xs)]:
        if a.dtype != dtype:
            raise TypeError(f"{what} is {a.dtype}, the residual {dtype}: one dtype for every tensor")
    if not xs or any(x.shape != residual.shape for x in xs):
        raise ValueError("xs: one array per rank (at least one), each of the residual's shape")
    hidden = weight.shape[0] if weight.ndim == 1 else -1
    if residual.ndim == 0 or residual.shape[-1] != hidden or not 1 <= hidden <= 1 << 24:
        raise ValueError(
            f"weight of {weight.shape} and residual of {residual.shape}: "
            "expected [hidden] and [..., hidden], 1 <= hidden <= 2^24"
        )
    eps = np.float32(eps)
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps is {eps}; expected a finite value, 0 or more")
    with np.errstate(all="ignore"):  # infinities and NaN are values like any other here
        h = (residual + tree(xs)).astype(dtype, copy=False)
        return h, _rmsnorm(h, weight, eps)


def _rmsnorm(h, weight, eps):
    """Steps 3-5 of the contract on every row of ``h`` (numpy, any dtype above)."""
    import numpy as np

    hidden = weight.shape[0]
    rows = h.reshape(-1, hidden).astype(np.float32)
    chunk = LANES * VECTOR
    chunks = -(-hidden // chunk)
    # Squares beyond the row are +0: adding them leaves a lane's partial (never -0) unchanged.
    padded = np.zeros((rows.shape[0], chunks * chunk), np.float32)
    padded[:, :hidden] = rows
    squares = (padded * padded).reshape(rows.shape[0], chunks, LANES, VECTOR)
    part = np.zeros((rows.shape[0], LANES), np.float32)
    for c in range(chunks):
        for v in range(VECTOR):
            part = part + squares[:, c, :, v]
    s = LANES // 2
    while s >= 1:
        part = part[:, :s] + part[:, s : 2 * s]
        s //= 2
    inv = np.float32(1.0) / np.sqrt(part[:, 0] / np.float32(hidden) + eps)
    y = (rows * inv[:, None]) * weight.astype(np.float32)
    return y.astype(h.dtype).reshape(h.shape)
