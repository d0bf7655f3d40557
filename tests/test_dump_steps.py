"""A recorded step's events looked up by layer: updates, and parameter gradients."""

import numpy as np

from nbdiff.align.fused import FusedGroup
from nbdiff.engine.recorded.dump_steps import step_param_grads, subtree_params
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord


def _grad(path: str, call: int, value: float) -> Event:
    g = TensorRecord("weight", (2,), "float32", np.full(2, value, "float32"))
    return Event(0, Phase.BACKWARD, Kind.LAYER, call, path, "Linear", call, 1, None, True, (), (), params=(g,))


def test_a_layers_gradients_are_summed_over_its_calls_and_a_fused_group_names_its_members():
    events = [_grad("a.q", 0, 1.0), _grad("a.q", 1, 2.0), _grad("a.k", 0, 5.0)]
    group = FusedGroup("a.q+k", ("a.q", "a.k"), (0, 0), "a.qk", None)
    grads = step_param_grads(events, (group,), "base")
    assert grads["a.q"]["weight"].tolist() == [3.0, 3.0]
    assert set(grads["a.q+k"]) == {"q.weight", "k.weight"}
    assert step_param_grads(events, (group,), "raw").keys() == {"a.q", "a.k"}  # the group is base's


def test_a_layers_subtree_gradients_are_named_relative_to_it():
    events = [_grad("a", 0, 1.0), _grad("a.q", 0, 2.0), _grad("ab", 0, 3.0)]
    assert [t.name for t in subtree_params(events, "a")] == ["weight", "q.weight"]
