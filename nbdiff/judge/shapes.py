"""Two tensors of different shapes that hold one tensor's values: one side not yet broadcast, a
generation step that kept the last positions only, or the same values in another shape."""

from __future__ import annotations

import numpy as np

__all__ = ["fitted_shapes", "broadcast_shape", "positions_cut"]


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
    return raw.reshape(base.shape), base, f"shape {raw.shape} vs base {base.shape}, compared flattened"


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
