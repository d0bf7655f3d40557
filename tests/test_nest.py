"""Nested arguments and outputs: flattened to named tensor leaves and back, without reference cycles."""

import gc
from collections import OrderedDict

import numpy as np

from nbdiff.trace.nest import describe_non_tensors, flatten, flatten_call, unflatten


def _is_tensor(x):
    return isinstance(x, np.ndarray)


def test_round_trip_keeps_structure_names_and_non_tensors():
    a, b, c = np.zeros(1), np.ones(2), np.full(3, 2.0)
    obj = ((a, {"mask": b, "scale": 0.5}), [c, None], OrderedDict(h=a))
    leaves, template = flatten(obj, _is_tensor, "in")
    assert [k for k, _ in leaves] == ["in[0][0]", "in[0][1].mask", "in[1][0]", "in[2].h"]
    rebuilt = unflatten(template, [v * 10 for _, v in leaves])
    assert rebuilt[0][1]["scale"] == 0.5 and rebuilt[1][1] is None and isinstance(rebuilt[2], OrderedDict)
    np.testing.assert_array_equal(rebuilt[0][1]["mask"], b * 10)
    assert describe_non_tensors(template) == ("[0][1].scale=0.5", "[1][1]=None")


def test_flattening_leaves_no_reference_cycle_holding_the_tensors():
    # A recursive closure is a cycle: its cell kept every leaf (a layer's output, with its
    # autograd graph) alive until the cyclic collector ran.
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        leaves, template = flatten(((np.zeros(1000), [np.ones(3)]), {"x": np.ones(2)}), _is_tensor)
        unflatten(template, [v for _, v in leaves])
        describe_non_tensors(template)
        del leaves, template
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


def test_the_one_tensor_call_template_is_what_flatten_makes_of_one_positional_tensor():
    # The recorder takes this template without flattening (most layer calls): it must stay the same.
    from nbdiff.trace.nest import ONE_TENSOR_CALL

    x = np.ones(3)
    leaves, template = flatten(((x,), {}), lambda v: isinstance(v, np.ndarray))
    assert leaves == [("[0][0]", x)] and template == ONE_TENSOR_CALL
    assert unflatten(ONE_TENSOR_CALL, ["y"]) == (("y",), {}) and describe_non_tensors(ONE_TENSOR_CALL) == ()
    is_array = lambda v: isinstance(v, np.ndarray)  # noqa: E731
    assert flatten_call((x,), {}, is_array) == ([("[0][0]", x)], ONE_TENSOR_CALL)
    assert flatten_call((x, 2), {"m": x}, is_array) == flatten(((x, 2), {"m": x}), is_array)
