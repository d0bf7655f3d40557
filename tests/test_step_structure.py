"""How one step's calls nest for blame: an unpaired block between two paired calls is looked through."""

from types import SimpleNamespace

from nbdiff.engine.step_structure import paired_children, paired_parents
from nbdiff.trace.events import Kind


def _call(order, parent):
    return SimpleNamespace(order=order, parent=parent, kind=Kind.LAYER)


def test_a_block_left_unpaired_is_looked_through_to_the_nearest_paired_ancestor():
    # root (0) > block (1, unpaired: torchvision's Sequential that paddle.vision lacks) > conv (2), relu (3)
    calls = [_call(0, None), _call(1, 0), _call(2, 1), _call(3, 1)]
    diffs = [SimpleNamespace(base=c, raw=c) for c in (calls[0], calls[2], calls[3])]
    up = paired_parents(diffs, calls)
    assert up == {0: None, 2: 0, 3: 0}
    assert [b.order for b, _ in paired_children(diffs, up)[0]] == [2, 3]
