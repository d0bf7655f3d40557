"""Metrics as pure functions of two arrays, and one tensor comparison built from them.

Nothing here loops over elements in Python.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from nbdiff.judge.shapes import fitted_shapes
from nbdiff.judge.tolerance import Tolerance

__all__ = [
    "COMPARE_MODES",
    "TensorDiff",
    "max_abs",
    "max_rel",
    "mean_abs",
    "cosine",
    "nan_count",
    "inf_count",
    "compare_tensors",
    "identical",
    "passed_lazily",
    "absolute_tolerance",
]

COMPARE_MODES = ("strict", "mean", "abs_mean")
"""``strict``: every element within tolerance. ``mean``: the means agree.
``abs_mean``: the means of absolute values agree."""

TINY = 1e-30
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays in one float dtype (as they are when already of one: the common case)."""
    if a.dtype == b.dtype and a.dtype in _FLOATS:
        return a, b
    wide = np.float64 if np.float64 in (a.dtype, b.dtype) else np.float32
    return np.asarray(a, dtype=wide), np.asarray(b, dtype=wide)


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    """Largest elementwise ``|a - b|``."""
    a, b = _pair(a, b)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest elementwise ``|a - b| / |b|`` (``b`` is the base)."""
    a, b = _pair(a, b)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), TINY))) if a.size else 0.0


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    """Mean elementwise ``|a - b|``."""
    a, b = _pair(a, b)
    return float(np.mean(np.abs(a - b))) if a.size else 0.0


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of the flattened arrays (1.0 when both are zero)."""
    a, b = _pair(a, b)
    a, b = a.ravel(), b.ravel()
    # BLAS dot products in the arrays' own dtype: no float64 copies; ample for a diagnostic.
    na, nb = float(np.sqrt(np.dot(a, a))), float(np.sqrt(np.dot(b, b)))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0 or not np.isfinite(na * nb):
        return 0.0
    return min(1.0, max(-1.0, float(np.dot(a, b)) / (na * nb)))


def nan_count(x: np.ndarray) -> int:
    """Number of NaN elements."""
    return int(np.count_nonzero(np.isnan(x))) if x.dtype.kind in "fc" else 0


def inf_count(x: np.ndarray) -> int:
    """Number of infinite elements."""
    return int(np.count_nonzero(np.isinf(x))) if x.dtype.kind in "fc" else 0


@dataclass(frozen=True)
class TensorDiff:
    """How one raw tensor differs from its base tensor."""

    name: str
    """Name of the tensor within its event (``out``, ``in[0]``, ``weight``...)."""
    base_shape: tuple[int, ...]
    raw_shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    mean_abs: float
    cosine: float
    nan_base: int
    nan_raw: int
    inf_base: int
    inf_raw: int
    ratio: float
    """Worst error divided by what the tolerance allows: above 1 means it diverges."""
    tolerance: Tolerance
    mode: str
    """The compare mode used."""
    note: str = ""
    """Why the comparison is special (shape mismatch, NaN mismatch)."""

    detail: _Detail | None = field(default=None, compare=False, repr=False)
    """For a tensor known to pass, what computes ``ratio``, ``max_rel``, ``mean_abs`` and
    ``cosine`` on first access: most tensors pass, and few are ever looked at closely."""

    def __post_init__(self) -> None:
        if self.detail is not None:
            # Deferred: the fields are left unset, and __getattr__ (asked only for an attribute
            # not set) computes them on first access. A __getattribute__ ran Python code on
            # every read of every field, 30,000 a step of a 1,000-layer model.
            for name in _DEFERRED:
                object.__delattr__(self, name)

    def __getattr__(self, name: str) -> Any:
        detail = self.__dict__.get("detail")
        if name in _DEFERRED and detail is not None:
            for field_name in _DEFERRED:
                object.__setattr__(self, field_name, detail.get(field_name))
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def passed(self) -> bool:
        return self.detail is not None or self.ratio <= 1.0

    @property
    def ratio_bound(self) -> float:
        """At least :attr:`ratio`, without computing a deferred one: a tensor decided lazily passed
        with every difference within ``atol``, so its ratio is at most ``max_abs / atol``."""
        if "ratio" not in self.__dict__ and self.detail is not None and self.detail.atol > 0:
            return self.max_abs / self.detail.atol
        return self.ratio

    def rebind_arrays(self, read: Callable[[np.ndarray], np.ndarray]) -> None:
        """Replace the arrays a passing comparison keeps for its deferred metrics by ``read(array)``,
        the same values held elsewhere (a result's tensors moved to a file)."""
        if self.detail is not None:
            self.detail.rebind(read)

    def renamed(self, name: str) -> TensorDiff:
        """This comparison under another name, its deferred metrics still deferred
        (``dataclasses.replace`` reads every field, and so computed them)."""
        values = {f.name: self.__dict__.get(f.name, 0.0) for f in fields(self)}
        return TensorDiff(**{**values, "name": name})


_DEFERRED = frozenset({"ratio", "max_rel", "mean_abs", "cosine"})


def identical(
    name: str, shapes: tuple[tuple[int, ...], tuple[int, ...]], tol: Tolerance, mode: str, note: str
) -> TensorDiff:
    """A bit-identical pair's comparison (``shapes``: base's, raw's). Made by ``__init__``: its fields then stay
    in the object (no ``__dict__`` made: 225 bytes against 528), and one that passes at once is kept in full."""
    return TensorDiff(name, shapes[0], shapes[1], 0.0, 0.0, 0.0, 1.0, 0, 0, 0, 0, 0.0, tol, mode, note)


def passed_lazily(
    name: str, shapes: tuple[tuple[int, ...], tuple[int, ...]], worst: float, tol: Tolerance, mode: str, note: str,
    a: np.ndarray, b: np.ndarray, atol: float,
) -> TensorDiff:  # fmt: skip
    """The comparison of a pair every difference of which (at most ``worst``) is within ``atol``: it passes,
    and its other metrics are computed from ``a`` (raw) and ``b`` (base) when first read."""
    # Made without the frozen dataclass's __init__, which sets all 16 fields through object.__setattr__ and
    # (__post_init__) deletes the four deferred again: 5.9 µs against 1.0, for most tensors of every step.
    diff = object.__new__(TensorDiff)
    diff.__dict__.update(
        name=name, base_shape=shapes[0], raw_shape=shapes[1], max_abs=worst, nan_base=0, nan_raw=0, inf_base=0,
        inf_raw=0, tolerance=tol, mode=mode, note=note, detail=_Detail(a, b, atol, tol.rtol),
    )  # fmt: skip
    return diff


def absolute_tolerance(tol: Tolerance, scale: float) -> float:
    """The ``atol`` a tensor of magnitude ``scale`` is allowed (a scaled one is relative to it)."""
    return (tol.atol * max(scale, TINY) if tol.scaled else tol.atol) + tol.floor


def worst_ratio(tensors: Iterable[TensorDiff], at_least: float = 0.0) -> float:
    """``max(at_least, *(t.ratio for t in tensors))``, computing a deferred ratio only where its bound
    (:attr:`TensorDiff.ratio_bound`) could beat the rest: the step chart and the update check ask it
    of every event of every step, and most tensors pass lazily, far below the worst."""
    best = at_least
    # The likeliest worst first; a known ratio is its own bound.
    for bound, t in sorted(((t.ratio_bound, t) for t in tensors), key=lambda x: -x[0]):
        if bound <= best:
            break
        best = max(best, t.ratio)
    return best


class _Detail:
    """The full metrics of a passing comparison, computed once, when first asked for."""

    def __init__(self, a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> None:
        self._arrays: tuple[np.ndarray, np.ndarray] | None = (a, b)
        self.atol, self._rtol = atol, rtol
        self._values: dict[str, float] = {}

    def rebind(self, read: Callable[[np.ndarray], np.ndarray]) -> None:
        arrays = self._arrays
        if arrays is not None:
            self._arrays = (read(arrays[0]), read(arrays[1]))

    def get(self, name: str) -> float:
        if self._arrays is not None:
            a, b = self._arrays
            d = np.abs(a - b)
            absb = np.abs(b)
            self._values = {
                "ratio": float((d / (absb * self._rtol + max(self.atol, TINY))).max()),
                "mean_abs": float(d.mean()),
                "cosine": cosine(a, b),
            }
            with np.errstate(divide="ignore", invalid="ignore"):
                self._values["max_rel"] = float(np.fmax.reduce(d / absb, axis=None))
            self._arrays = None  # the values are kept, the arrays let go
        return self._values[name]


FRESH_MAX = 1 << 16
"""Elements up to which a comparison's work arrays are made fresh (below a page fault's cost)."""
_SCRATCH: dict[np.dtype, np.ndarray] = {}
_SCRATCH_MAX = 1 << 22
"""Elements; larger tensors get fresh arrays so the cache never holds more than ~100 MB."""


def _scratch(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three work arrays of ``shape``, reused across calls.

    Fresh multi-megabyte arrays cost more in page faults than the arithmetic on them;
    nothing returned by :func:`compare_tensors` keeps a reference to these.
    """
    n = math.prod(shape)
    if n > _SCRATCH_MAX:
        return np.empty(shape, dtype), np.empty(shape, dtype), np.empty(shape, dtype)
    pool = _SCRATCH.get(dtype)
    if pool is None or pool.shape[1] < n:
        pool = _SCRATCH[dtype] = np.empty((3, n), dtype)
    return pool[0, :n].reshape(shape), pool[1, :n].reshape(shape), pool[2, :n].reshape(shape)


def compare_tensors(
    name: str,
    raw: np.ndarray,
    base: np.ndarray,
    tol: Tolerance,
    mode: str = "strict",
    scale_hint: float = 0.0,
    lazy: bool = False,
    hint_covers: bool = False,
) -> TensorDiff:
    """Compare ``raw`` against ``base`` under ``tol`` and ``mode`` (see :data:`COMPARE_MODES`).

    ``lazy``: the arrays are never written again (recorded copies), so a tensor that certainly
    passes (every difference within ``atol``) is decided in three passes and its other metrics
    are computed only when read.

    ``scale_hint`` is the magnitude of the quantities this tensor was summed from,
    when larger than the tensor itself (a bias gradient in front of a BatchNorm is
    rounding noise of much larger terms); a scaled ``atol`` uses the larger one.
    ``hint_covers``: the hint is known to be at least ``max |base|``, which is then not measured.
    """
    note = ""
    shapes = (tuple(base.shape), tuple(raw.shape))
    if raw.shape != base.shape:
        fitted = fitted_shapes(raw, base)
        if fitted is None:
            inf = np.inf
            return TensorDiff(
                name, *shapes, inf, inf, inf, 0.0, 0, 0, 0, 0, inf, tol, mode, f"shape {raw.shape} vs base {base.shape}"
            )
        raw, base, note = fitted
    a, b = _comparable(raw, base)
    if a.size == 0:
        return TensorDiff(name, *shapes, 0.0, 0.0, 0.0, 1.0, 0, 0, 0, 0, 0.0, tol, mode, note)
    d, absb, buf = _differences(a, b)
    worst = float(d.max())
    if worst == 0.0 and mode == "strict":
        # Bit-identical (common within one framework): nothing else to measure.
        return identical(name, shapes, tol, mode, note)
    counts = (0, 0, 0, 0)
    finite = math.isfinite(worst)
    if not finite:
        counts = (nan_count(b), nan_count(a), inf_count(b), inf_count(a))
        a, b, d, said = _finite_parts(a, b, d)
        note = note or said
        worst = float(d.max())
    if hint_covers:
        scale = scale_hint
    elif absb is None:  # small: |b| made once, read here and (if it does not pass at once) below
        absb = np.abs(b)
        scale = max(float(absb.max()), scale_hint)
    else:  # large: two reads, nothing written (most pass at once)
        scale = max(float(b.max()), -float(b.min()), scale_hint)
    atol = absolute_tolerance(tol, scale)
    if lazy and mode == "strict" and worst <= atol and finite:
        # Every |a - b| <= atol <= atol + rtol|b|: it passes, whatever the rest says.
        return passed_lazily(name, shapes, worst, tol, mode, note, a, b, atol)
    ratio, rel = _ratio_and_relative(mode, a, b, d, absb, buf, worst, atol, tol.rtol)
    return TensorDiff(name, *shapes, worst, rel, float(d.mean()), cosine(a, b), *counts, ratio, tol, mode, note)


def _comparable(raw: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays in one float dtype, at least one-dimensional (the passes below work in place)."""
    a, b = _pair(raw, base)
    if a.dtype.kind not in "fc":
        a, b = a.astype(np.float64), b.astype(np.float64)
    if a.ndim == 0:
        a, b = a.reshape(1), b.reshape(1)
    return a, b


def _differences(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``|a - b|``, and two work arrays of its shape for later passes (``None`` for a small tensor:
    made fresh only if needed, which costs less than slicing the scratch pool)."""
    if a.size <= FRESH_MAX:
        d = np.subtract(a, b)
        absb = buf = None
    else:
        d, absb, buf = _scratch(a.shape, a.dtype)
        np.subtract(a, b, out=d)
    np.abs(d, out=d)  # written in place: this runs on every recorded tensor, and most pass at once
    return d, absb, buf


def _ratio_and_relative(
    mode: str, a: np.ndarray, b: np.ndarray, d: np.ndarray, absb: np.ndarray | None, buf: np.ndarray | None,
    worst: float, atol: float, rtol: float,
) -> tuple[float, float]:  # fmt: skip
    """The largest error over its tolerance, and the largest relative error, of a tensor that does not
    pass at once (``d``: ``|a - b|``; ``absb``: ``|b|`` if already made; ``buf``: scratch, or ``None``)."""
    if buf is None:  # small
        buf = np.empty_like(d)
        if absb is None:
            absb = np.abs(b)
    else:
        assert absb is not None
        np.abs(b, out=absb)
    if mode == "strict":
        ratio = 0.0
        if worst > 0:
            np.multiply(absb, rtol, out=buf)
            buf += max(atol, TINY)
            ratio = float(np.divide(d, buf, out=buf).max())
    elif mode in ("mean", "abs_mean"):
        ma, mb = (a.mean(), b.mean()) if mode == "mean" else (np.abs(a).mean(), absb.mean())
        err = abs(float(ma) - float(mb)) if np.isfinite(worst) else np.inf
        ratio = err / max(atol + rtol * abs(float(mb)), TINY) if err > 0 else 0.0
    else:
        raise ValueError(f"compare_mode {mode!r} is not one of {COMPARE_MODES}")
    if worst <= 0:
        return ratio, 0.0
    # 0/0 (equal zeros) is NaN and skipped by fmax; x/0 is inf: an error where base is exactly 0.
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(d, absb, out=absb)
    return ratio, float(np.fmax.reduce(absb, axis=None))


MASK_VALUE = 1e4
"""A finite value at least this large stands for an infinity where the other side has one of the same
sign: ``masked_fill(-inf)`` against ``masked_fill(-1e9)`` (or ``finfo.min``) is the same mask."""


def elementwise_error(raw: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, int]:
    """``|raw - base|`` per element as the comparison judges it (float64): 0 where both hold the same
    NaN/Inf or an infinity meets a mask value of its sign, ``inf`` where NaN/Inf differ; and how many
    elements were masked alike (what a picture of the error must agree with)."""
    a, b = np.asarray(raw, np.float64), np.asarray(base, np.float64).reshape(np.shape(raw))
    with np.errstate(invalid="ignore"):  # inf - inf
        d = a - b
        if np.isfinite(d).all():
            return np.abs(d), 0
        _, _, err, _ = _finite_parts(a, b, d)
        masked = (
            (np.isinf(a) | np.isinf(b)) & (np.sign(a) == np.sign(b)) & (np.minimum(np.abs(a), np.abs(b)) >= MASK_VALUE)
        )
    return err, int((masked & (a != b)).sum())


def _finite_parts(a: np.ndarray, b: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Where NaN/Inf are: the same on both sides counts as agreement (0), and so does an infinity
    against a mask value of its sign (:data:`MASK_VALUE`); else an infinite error. Returns the values
    with NaN/Inf read as 0, ``|a - b|`` so judged, and a note saying what differs or was taken as a mask."""
    np.abs(d, out=d)
    same = (np.isnan(a) & np.isnan(b)) | (a == b)
    masked = (np.isinf(a) | np.isinf(b)) & (np.sign(a) == np.sign(b)) & (np.minimum(np.abs(a), np.abs(b)) >= MASK_VALUE)
    masked &= ~same
    same |= masked
    differ = not np.all(same)
    d = np.where(same, 0.0, np.where(np.isfinite(d), d, np.inf)).astype(d.dtype) if differ else np.zeros_like(d)
    keep = np.isfinite(a) & np.isfinite(b) & ~masked
    note = "NaN/Inf differ" if differ and not np.all(same | keep) else ""
    n = int(masked.sum())
    if n:
        at = np.flatnonzero(masked)[0]
        fa, fb = a.reshape(-1)[at], b.reshape(-1)[at]
        mask = f"masked alike at {n} position(s): base {fb:g}, raw {fa:g} (an infinity and a mask value of its sign are the same mask)"
        note = f"{note}; {mask}" if note else mask
    return np.where(keep, a, 0.0), np.where(keep, b, 0.0), d, note
