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
