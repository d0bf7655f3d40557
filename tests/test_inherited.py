"""judge/inherited: rows over tolerance by inherited error only, in a result that agrees."""

import numpy as np

from nbdiff.judge.blame import EventDiff
from nbdiff.judge.inherited import inherited_notes, inherited_warning
from nbdiff.judge.metrics import compare_tensors
from nbdiff.judge.tolerance import resolve_tolerance
from nbdiff.trace.events import Event, Kind, Phase


def _row(path, accumulated, local):
    tol = resolve_tolerance(None, None, "float32", "float32")
    ones = np.ones(4, "float32")
    diff = lambda by: compare_tensors("out", ones * (1 + by), ones, tol)  # noqa: E731
    event = Event(0, Phase.FORWARD, Kind.LAYER, 0, path, "Linear", 0, 1, None, True, (), ())
    return EventDiff(event, event, (diff(accumulated),), None if local is None else (diff(local),))


def test_only_rows_over_tolerance_whose_own_error_passes_are_told_as_inherited():
    rows = [_row("fc1", 0.0, 0.0), _row("fc2", 0.01, 0.0), _row("fc3", 0.01, 0.01), _row("head", 0.02, None)]
    notes = inherited_notes(rows)
    assert len(notes) == 1 and "`fc2`" in notes[0] and "inherited error only" in notes[0]
    (warning,) = inherited_warning(rows)
    assert warning.startswith("2 compared row(s)") and "worst `head`" in warning
    assert inherited_warning([_row("fc1", 0.0, 0.0)]) == []
