"""Recording: events, the recorder, user stacks, nested structures, inputs and modes."""

from __future__ import annotations

from nbdiff.trace.events import Event, Kind, Phase, TensorRecord, Trace
from nbdiff.trace.recorder import Feed, Recorder

__all__ = ["Event", "Feed", "Kind", "Phase", "Recorder", "TensorRecord", "Trace"]
