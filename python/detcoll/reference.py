"""The canonical rank tree in Python, for checking results and writing TP-invariant layers:
``tree(parts)`` adds with the parts' own ``+`` (numpy arrays, torch tensors, scalars), so
every add is in their dtype, exactly as detcoll's reductions evaluate it.

One part is a leaf; otherwise the first ``m`` parts (``m`` the largest power of two below their
number) form the left subtree, the rest the right one: for 8 parts
``((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))``.
"""


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
