"""Weight rules: how a rule's two sides are named."""

import pytest

from nbdiff.errors import OptionError
from nbdiff.weights.rules import RULES, find_rule, register_weight_rule, rename_rule


def test_a_class_in_place_of_its_name_matches_its_name():
    # ("torch", Cls) was accepted and never matched: the side was the class's repr.
    class MyBlock:
        pass

    convert, inverse = rename_rule({})
    rule = register_weight_rule(("torch", MyBlock), ("paddle", "MyBlock"), convert, inverse)
    try:
        assert rule.base == ("torch", "MyBlock")
        assert find_rule("torch", ["MyBlock"], "paddle", ["MyBlock"]) == (rule, False)
    finally:
        RULES.pop(("torch", "MyBlock", "paddle", "MyBlock"), None)


@pytest.mark.parametrize("side", [("jax", "Dense"), ("torch", 3), ("torch", "")])
def test_a_side_that_can_never_match_is_refused_with_the_form_to_use(side):
    convert, inverse = rename_rule({})
    with pytest.raises(OptionError, match=r"\('torch', 'Linear'\)"):
        register_weight_rule(side, ("paddle", "Linear"), convert, inverse)
