"""Run both models once and pair their layer calls: what pairing needs before a run starts.

One no-grad forward of each model, in eval mode, with the models' modes, running statistics
and Python-side state (a KV cache, a counter) put back afterwards (see
:func:`nbdiff.trace.structure.forward_structure`): the calls are nbdiff's, not the user's.
``LayerMap.auto``, ``check_config(inputs=...)`` and ``assign_weight(inputs=...)`` pair this
way, as ``auto_diff`` pairs a step.
"""

from __future__ import annotations

from typing import Any

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pairing, pair_forward
from nbdiff.frameworks import framework_of
from nbdiff.trace.inputs import split_inputs
from nbdiff.trace.structure import forward_structure

__all__ = ["pair_once"]


def pair_once(base: Any, raw: Any, inputs: Any, layer_map: LayerMap | None = None) -> Pairing:
    """The pairing of one forward of each model on ``inputs`` (a pair, or one input for both)."""
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    bcall, rcall = split_inputs(inputs, bfw, rfw, (base, raw))
    b = forward_structure(bfw, base, bcall, "base")
    r = forward_structure(rfw, raw, rcall, "raw")
    return pair_forward(b, r, layer_map, dict(bfw.named_layers(base)), dict(rfw.named_layers(raw)))
