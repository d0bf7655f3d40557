"""engine/outside: an update finding whose parameter was written outside the optimizer is told as that write."""

import numpy as np

from nbdiff.engine.training.outside import Writes, as_outside, recorded_writes
from nbdiff.judge.blame import Divergence
from nbdiff.judge.metrics import compare_tensors
from nbdiff.judge.tolerance import resolve_tolerance
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord


def _update_finding(parameter="blocks.0.fc.weight", raw_name="weight"):
    tol = resolve_tolerance(None, None, "float32", "float32")
    metrics = compare_tensors(raw_name, np.ones(3) * 1.1, np.ones(3), tol)
    return Divergence(
        phase=Phase.OPTIMIZER, step=1, base_path="blocks.0.fc", raw_path="layers.0.proj", base_type="Linear",
        raw_type="Linear", metrics=metrics, tolerance=tol, local_error=None, inherited=False, base_stack=(),
        raw_stack=(), where="parameter", parameter=parameter,
    )  # fmt: skip


def test_a_write_on_one_side_is_that_sides_finding_named_as_that_side_names_it():
    found = [_update_finding()]
    raw = as_outside(found, Writes({}, {"layers.0.proj.weight": 1.05}))[0]
    assert raw.where == "outside" and raw.parameter == "blocks.0.fc.weight"
    assert (
        "raw's `layers.0.proj.weight` changed outside the optimizer between step 1's update and step 2"
        in raw.describe()
    )
    assert "(norm x1.05)" in raw.describe() and "no optimizer setting" in raw.why()
    base = as_outside(found, Writes({"blocks.0.fc.weight": 0.5}, {}))[0]
    assert base.where == "outside" and "base's `blocks.0.fc.weight`" in base.describe() and "x0.5" in base.describe()


def test_the_same_write_on_both_sides_leaves_the_update_to_blame_and_another_parameters_write_changes_nothing():
    found = [_update_finding()]
    alike = Writes({"blocks.0.fc.weight": 1.05}, {"layers.0.proj.weight": 1.05})
    assert as_outside(found, alike) == found
    apart = as_outside(found, Writes({"blocks.0.fc.weight": 1.0}, {"layers.0.proj.weight": 1.05}))[0]
    assert (
        apart.where == "outside" and "both sides wrote" in apart.describe() and "base x1, raw x1.05" in apart.describe()
    )
    assert as_outside(found, Writes({}, {"layers.0.proj.bias": 2.0})) == found
    assert as_outside(found, Writes({}, {})) == found


def test_a_dump_keeps_the_writes_with_its_optimizer_events_as_values_or_statistics():
    from nbdiff.trace.stats import tensor_stats

    kept = TensorRecord("weight", (), "float64", np.array(1.05))
    summarized = TensorRecord("bias", (), "float64", None, tensor_stats(np.array(0.9)))
    update = TensorRecord("weight", (2, 2), "float32", np.zeros((2, 2), "float32"))

    def event(path, params):
        return Event(1, Phase.OPTIMIZER, Kind.PARAM, 0, path, "Linear", 0, 1, None, True, (), (update,), params)

    writes = recorded_writes([event("fc", (kept,))], [event("proj", (summarized,)), event("", ())])
    assert writes.base == {"fc.weight": 1.05}
    assert writes.raw == {"proj.bias": 0.9}
