"""Events and tensor records: ``changed`` copies a record the way ``dataclasses.replace`` does."""

import dataclasses

import numpy as np
import pytest

from nbdiff.trace.events import Event, Kind, Phase, TensorRecord, changed


def _event() -> Event:
    t = TensorRecord("out", (2,), "float32", np.zeros(2, np.float32))
    return Event(0, Phase.FORWARD, Kind.LAYER, 3, "fc", "Linear", 0, 1, 0, True, (), (t,))


def test_changed_equals_dataclasses_replace_and_leaves_the_original_alone():
    e = _event()
    new = changed(e, parent=None, order=7)
    assert new == dataclasses.replace(e, parent=None, order=7)
    assert (e.parent, e.order) == (0, 3) and new.outputs is e.outputs
    assert type(new) is Event and hash(new) == hash(dataclasses.replace(e, parent=None, order=7))


def test_changed_refuses_a_field_the_record_does_not_have():
    with pytest.raises(TypeError, match="no field 'parnet'"):
        changed(_event(), parnet=None)
