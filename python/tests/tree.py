"""The tests' oracle of the reduction order, written independently of detcoll's: the canonical
tree evaluated level by level (adjacent pairs added, an odd last part carried up), which equals
"largest power of two on the left" for every count. Adds use the parts' own ``+`` (numpy,
torch), so every add is in their dtype. No imports: the device host may lack numpy."""


def tree(parts):
    level = list(parts)
    if len(level) == 1:
        p = level[0]
        return p.clone() if hasattr(p, "clone") else p.copy()
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]
