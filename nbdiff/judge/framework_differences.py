"""Where the two frameworks really differ, as data: what differs, how to verify it exactly, what to say.

No port can "fix" these by changing its model code, so a difference an entry explains is a
finding of its own kind ("framework difference"), not the port's bug. Each entry says which
layers and tensors it concerns, computes the value the *other* framework's rule gives from
what base computed (the same inputs), and the difference counts as explained only when raw's
value matches that within tolerance. Anything the entry does not explain stays a divergence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nbdiff.align.typemap import canonical_type

__all__ = ["StateUpdate", "FrameworkDifference", "FRAMEWORK_DIFFERENCES", "explaining", "momentum_of"]


@dataclass(frozen=True)
class StateUpdate:
    """One running statistic over one train-mode step, in raw's layout."""

    base_framework: str
    raw_framework: str
    layer_type: str
    """Base's layer class name."""
    tensor: str
    """Raw's name for the statistic (``running_var``, ``_variance``)."""
    before: np.ndarray
    """The value both sides began the step with (raw's is set to base's after every step)."""
    base_after: np.ndarray
    momentum: float | None
    """The weight of the batch's value, in torch's meaning (paddle's ``momentum`` is ``1 - m``)."""
    count: int | None
    """Values per channel the step's single call normalised over (``None``: not one call)."""
    raw_before: np.ndarray | None = None
    """What raw's began the step with, where it is not base's (a watched or recorded run keeps its own)."""


@dataclass(frozen=True)
class FrameworkDifference:
    """A documented difference between two frameworks' rules."""

    key: str
    layers: tuple[str, ...]
    """Canonical class names (or base class names) it concerns."""
    tensors: tuple[str, ...]
    """Names of the tensors it concerns, either framework's."""
    sentence: str
    """What to tell the user; ``{base}``/``{raw}`` are the frameworks."""
    expected: Callable[[StateUpdate], np.ndarray | None]
    """Raw's value under raw's framework rule, from base's; ``None``: cannot say."""


_BIASED = {"paddle": True, "torch": False}
"""Whether a framework's BatchNorm updates ``running_var`` with the biased batch variance."""


def _batchnorm_variance(u: StateUpdate) -> np.ndarray | None:
    biased_b, biased_r = _BIASED.get(u.base_framework), _BIASED.get(u.raw_framework)
    m, n = u.momentum, u.count
    if biased_b is None or biased_r is None or biased_b == biased_r or not m or n is None or n < 2:
        return None
    batch = (u.base_after.astype(np.float64) - (1 - m) * u.before) / m  # base's batch variance
    batch = batch * ((n - 1) / n if biased_r else n / (n - 1))
    start = u.before if u.raw_before is None else u.raw_before
    return ((1 - m) * start + m * batch).astype(u.base_after.dtype)


FRAMEWORK_DIFFERENCES: tuple[FrameworkDifference, ...] = (
    FrameworkDifference(
        key="batchnorm running_var",
        layers=("batchnorm", "batchnorm1d", "batchnorm2d", "batchnorm3d", "syncbatchnorm"),
        tensors=("running_var", "_variance", "_mean_variance"),
        sentence=(
            "paddle updates BatchNorm's running_var with the biased batch variance (divided by n), torch with the "
            "unbiased one (divided by n - 1); verified exactly: raw's value is base's batch variance under {raw}'s "
            "rule. A framework difference, not the port's bug; it shrinks as batches grow"
        ),
        expected=_batchnorm_variance,
    ),
)


def explaining(
    update: StateUpdate, raw_after: np.ndarray, agrees: Callable[[np.ndarray, np.ndarray], bool]
) -> FrameworkDifference | None:
    """The entry that explains raw's value exactly (``agrees(expected, raw_after)``), if any."""
    kind = canonical_type(update.layer_type)
    for entry in FRAMEWORK_DIFFERENCES:
        if update.tensor not in entry.tensors or not any(kind.endswith(k) for k in entry.layers):
            continue
        expected = entry.expected(update)
        if expected is not None and expected.shape == raw_after.shape and agrees(expected, raw_after):
            return entry
    return None


def momentum_of(framework: str, layer: object) -> float | None:
    """A BatchNorm's weight of the batch's statistics, in torch's meaning (paddle stores ``1 - m``)."""
    if framework == "paddle":
        p = getattr(layer, "_momentum", None)
        return None if not isinstance(p, (int, float)) else 1.0 - float(p)
    m = getattr(layer, "momentum", None)
    return float(m) if isinstance(m, (int, float)) else None
