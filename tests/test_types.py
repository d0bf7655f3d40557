"""engine/types: a recorded step finds the forward call of each of its backward events."""

from nbdiff.engine.types import StepRecord
from nbdiff.trace.events import Event, Kind, Phase


def _event(phase, path, call, order):
    return Event(0, phase, Kind.LAYER, order, path, "Linear", call, 1, None, True, (), ())


def test_a_backward_event_finds_its_own_call_of_a_layer_called_twice_and_a_fused_group_none():
    first, second = _event(Phase.FORWARD, "fc", 0, 0), _event(Phase.FORWARD, "fc", 1, 1)
    record = StepRecord([first, second], [], [])
    assert record.forward_of(_event(Phase.BACKWARD, "fc", 1, 0)) is second
    assert record.forward_of(_event(Phase.BACKWARD, "fc", 0, 1)) is first
    assert record.forward_of(_event(Phase.BACKWARD, "fc+proj", 0, 2)) is None
