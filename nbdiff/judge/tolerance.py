"""Tolerances: dtype-aware defaults, and the user's explicit values.

Default ``atol`` is *relative to the tensor's magnitude* (``max |base|``): the
rounding error of a sum is proportional to the size of its terms, so elements
near zero (common in gradients, where large terms cancel) would otherwise raise
false alarms, which is what PaDiff's fixed ``atol`` does. An explicit ``atol`` is
absolute, as users expect.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Tolerance", "DEFAULTS", "resolve_tolerance", "summed_terms", "loosest"]

DEFAULTS: dict[str, tuple[float, float]] = {
    # dtype: (atol relative to max|base|, rtol)
    "float64": (1e-9, 1e-7),
    "float32": (2e-5, 1e-4),
    "float16": (2e-3, 1e-2),
    "bfloat16": (1e-2, 5e-2),
}
"""Looser than one rounding of the dtype by the error a few hundred fp ops of
different order accumulate; calibrated on the fault suite (see benchmarks/README.md)."""

_EXACT = (0.0, 0.0)


@dataclass(frozen=True)
class Tolerance:
    """How far apart two tensors may be and still agree."""

    atol: float
    """Absolute tolerance (scaled by the tensor's magnitude when ``scaled``)."""
    rtol: float
    """Relative tolerance, elementwise against the base value."""
    scaled: bool = False
    """Whether ``atol`` is multiplied by ``max |base|`` before use (the default)."""
    floor: float = 0.0
    """Absolute amount always allowed on top (rounding of quantities the tensor derives from)."""

    def describe(self) -> str:
        a = f"atol={self.atol:g}" + ("·max|base|" if self.scaled else "")
        return f"{a}, rtol={self.rtol:g}" + (f", floor={self.floor:.3g}" if self.floor else "")


def _default(dtype: str) -> tuple[float, float]:
    if dtype in DEFAULTS:
        return DEFAULTS[dtype]
    if dtype.startswith(("int", "uint", "bool")):
        return _EXACT
    return DEFAULTS["float32"]


@functools.lru_cache(maxsize=256)
def resolve_tolerance(atol: float | None, rtol: float | None, *dtypes: str) -> Tolerance:
    """The tolerance for tensors of ``dtypes``: the loosest dtype's default, overridden by explicit values.

    Remembered (a :class:`Tolerance` is frozen): a check asks it for every tensor it compares."""
    defaults = [_default(d) for d in dtypes] or [DEFAULTS["float32"]]
    d_atol = max(a for a, _ in defaults)
    d_rtol = max(r for _, r in defaults)
    if atol is None:
        return Tolerance(d_atol, d_rtol if rtol is None else float(rtol), scaled=True)
    return Tolerance(float(atol), d_rtol if rtol is None else float(rtol), scaled=False)


def loosest(dtypes: list[str]) -> str:
    """The floating dtype with the loosest default tolerance (``float32`` when there is none):
    a float32 result computed from float16 inputs carries float16 rounding."""
    floats = [d for d in dtypes if d in DEFAULTS]
    return max(floats, key=lambda d: DEFAULTS[d][0], default="float32")


def summed_terms(param_shape: tuple[int, ...], grad_out_shape: tuple[int, ...]) -> int:
    """How many output-gradient elements add up into one element of a parameter's gradient.

    A parameter gradient sums over every output position its element touches: the
    batch (and spatial) positions of its output channel. Rounding noise grows with
    the square root of that count, so a bias gradient in front of a BatchNorm (an
    exact zero computed from 30,000 terms) would otherwise read as a divergence.
    The channel is the largest parameter dimension found in the output's shape.
    """
    total = 1
    for n in grad_out_shape:
        total *= int(n)
    channels = max((int(n) for n in param_shape if int(n) in grad_out_shape), default=0)
    return max(1, total // channels) if channels else 1
