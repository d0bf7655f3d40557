"""A statistics dump's record of a tensor, summarised by its framework instead of copied.

A ``statistics`` dump keeps of each activation and gradient its statistics and 64 sampled
values. Copying every tensor to the host for that, and reducing the copy with numpy on the
writer's thread, cost the copy and competed with the framework's own threads for the cores
(a torch CNN recorded at 3.5x its bare step with default threads). The framework reduces the
tensor in place instead, with its own threads and on its own device, and only five sums and
the sample come back. Its float sums are cascaded: within about 1e-8 of float64's, as
numpy's chunked sums are. It pays on an accelerator and where the framework's threads take
every core (:meth:`~nbdiff.frameworks.base.Framework.prefers_reducing`); where a core is left
for the writer's thread, or the framework's reductions cost its thread more than a copy
(paddle on a CPU), the copy stays. So does it where reducing cannot serve (another dtype, a
NaN, a distributed tensor), or where compare needs the values themselves (a BatchNorm over
few values per channel, :func:`nbdiff.trace.capture.amplifies`).
"""

from __future__ import annotations

import math
from typing import Any

from nbdiff.frameworks import Framework
from nbdiff.trace.capture import few_per_channel
from nbdiff.trace.events import TensorRecord
from nbdiff.trace.stats import sample_positions, stats_from_sums

__all__ = ["summarized", "keeps_values"]


def summarized(fw: Framework, name: str, t: Any) -> TensorRecord | None:
    """``t``'s record with its statistics and sample and no values, or ``None`` (copy it instead)."""
    if not fw.prefers_reducing(t):
        return None
    shape = fw.shape_of(t)
    n = math.prod(shape)
    reduced = fw.reduced(t, sample_positions(n))
    if reduced is None:
        return None
    sums, sample, spread = reduced
    stats = stats_from_sums(*sums, n, spread)
    if stats is None:
        return None
    return TensorRecord(name, shape, fw.dtype_name(t), None, stats, fw.layout_of(t), sample)


def keeps_values(fw: Framework, layer: Any, first_input: Any) -> bool:
    """Whether a layer call's tensors must be copied whole: the call :func:`~nbdiff.trace.capture.amplifies`
    finds in the dump (a BatchNorm over few values per channel), which compare recomputes."""
    return first_input is not None and few_per_channel(type(layer).__name__, fw.shape_of(first_input))
