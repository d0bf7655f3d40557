"""What two calls of paired layers received, paired tensor by tensor.

By name first, then the rest in order among equal shapes: one side's extra argument (an attention
mask passed by keyword, positions passed by place) is left out rather than compared with another
argument. Offline blame (what an event received) and the replay's check of what a layer's own code
hands each sublayer both pair this way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from nbdiff.trace.events import TensorRecord

__all__ = ["received_pairs", "broadcasts"]


def received_pairs(
    raw: Sequence[TensorRecord],
    base: Sequence[TensorRecord],
    fits: Callable[[TensorRecord, TensorRecord], bool] | None = None,
) -> tuple[list[TensorRecord], list[TensorRecord]]:
    """What both sides received, paired by name, then the rest in order among those of the same kind
    that fit (``fits(base, raw)``; by default base's broadcasts to raw's: one side's position
    embeddings for the batch, the other's per sample): one side's extra argument (an attention mask
    passed by keyword, positions passed by place) is left out rather than compared with another."""
    fits = fits or broadcasts
    named = {t.name: t for t in base}
    # The same name with another kind of value (positions in one, a float mask in the other, both
    # passed by place) is not the same argument.
    named = {n: t for n, t in named.items() if all(r.floating == t.floating for r in raw if r.name == n)}
    pairs = [(r, named[r.name]) for r in raw if r.name in named]
    taken = {r.name for r, _ in pairs}
    left = [b for b in base if b.name not in taken]
    for r in raw:
        if r.name in named:
            continue
        b = next((b for b in left if b.floating == r.floating and fits(b, r)), None)
        if b is not None:
            left.remove(b)
            pairs.append((r, replace(b, name=r.name)))
    return [r for r, _ in pairs], [b for _, b in pairs]


def broadcasts(base: TensorRecord, raw: TensorRecord) -> bool:
    """Whether base's tensor stands for raw's: the same rank, each size equal or 1 on base's side."""
    return len(base.shape) == len(raw.shape) and all(a == b or a == 1 for a, b in zip(base.shape, raw.shape))
