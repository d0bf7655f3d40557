"""Two tensors of different shapes that hold one tensor's values: one side not yet broadcast, a
generation step that kept the last positions only, the same values with their axes in another order
(attention heads as ``[batch, heads, positions, dim]`` against ``[batch, positions, heads, dim]``), or
in another shape."""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["fitted_shapes", "as_compared", "broadcast_shape", "positions_cut"]


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The common shape when one shape broadcasts to the other by size-1 axes only, else ``None``."""
    if len(a) != len(b):
        return None
    try:
        wide = tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None
    return wide if wide in (a, b) else None


def fitted_shapes(raw: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray, str] | None:
    """Two arrays of different shapes made comparable (broadcast, or flattened when as large), with a
    note saying how; None when they cannot be."""
    last = _last_positions(raw, base)
    if last is not None:
        return last
    wide = broadcast_shape(raw.shape, base.shape)
    if wide is not None:
        # (1, S, D) against (B, S, D): the same values, one side not yet expanded.
        note = f"shape {raw.shape} vs base {base.shape}, compared after broadcasting"
        return np.broadcast_to(raw, wide), np.broadcast_to(base, wide), note
    if raw.size != base.size:
        return None
    said = f"shape {raw.shape} vs base {base.shape}"
    ways = [(raw.reshape(base.shape), f"{said}, compared flattened")]
    for order in _axis_orders(raw.shape, base.shape):
        ways.append((raw.transpose(order), f"{said}, compared with raw's axes in the order {order}"))
    if len(ways) == 1:
        return ways[0][0], base, ways[0][1]
    # The layout that holds base's values is the one closest to them: a port's bug moves values, never
    # as far as reading them in another layout does.
    fitted, note = min(ways, key=lambda way: _gap(way[0], base))
    return fitted, base, note


_MOST_AXES = 6
"""Up to this many axes, every order of them is tried (720 at most, each a tuple compare)."""


def _axis_orders(raw: tuple[int, ...], base: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The orders of raw's axes, other than its own, that give base's shape."""
    if len(raw) != len(base) or len(raw) > _MOST_AXES or sorted(raw) != sorted(base):
        return []
    own = tuple(range(len(raw)))
    return [o for o in itertools.permutations(own) if o != own and tuple(raw[i] for i in o) == base]


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference, NaN apart (all NaN: infinitely far). In the arrays' own float type: a
    float64 copy of a large activation per layout tried cost more memory than the comparison itself."""
    d = np.abs(np.subtract(a, b, dtype=np.result_type(a, b, np.float32)))
    return float(np.nanmax(d)) if d.size and not np.isnan(d).all() else float("inf")


def as_compared(raw: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``raw`` and ``base`` as the comparison lays them side by side (pictures of the error draw
    what was judged), or ``None`` when they cannot be."""
    if raw.shape == base.shape:
        return raw, base
    fitted = fitted_shapes(raw, base)
    return None if fitted is None else (fitted[0], fitted[1])


def positions_cut(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """(batch, positions, features) shapes that differ in their positions only."""
    return len(a) == 3 and len(b) == 3 and a[::2] == b[::2] and a[1] != b[1]


def _last_positions(raw: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(batch, positions, features) against fewer positions: the last ones. A generation step
    computes the logits of the last position only (transformers' ``logits_to_keep=1``) where a port
    computes every position's; broadcasting would compare every position with the last one."""
    if not positions_cut(raw.shape, base.shape):
        return None
    n = min(raw.shape[1], base.shape[1])
    side = "base" if base.shape[1] == n else "raw"
    note = (
        f"shape {raw.shape} vs base {base.shape}: {side} keeps the last {n} position(s), compared with the other's last"
    )
    return raw[:, raw.shape[1] - n :], base[:, base.shape[1] - n :], note
