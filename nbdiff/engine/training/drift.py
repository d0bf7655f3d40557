"""Weights that drift apart over a watched run, and the weights raw's replays use instead.

``watch`` compares the steps the user's own loop ran: each optimizer stepped from its own
model's gradients, so after step 0 the two models' weights differ by whatever their updates
did. Those updates were compared step by step (:mod:`nbdiff.engine.training.updates`), and an update that agrees
within what its gradients explain can still move an element by a visible amount: Adam turns a
gradient that is rounding noise around zero into a step of ``±lr``. The steps after it then
inherit that difference. So raw's layers are replayed on the weights raw would have had if its
updates had been base's ("followed"), which keeps each layer's own error apart from the drift,
and an error that no layer makes on its own is the drift's, not a new divergence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nbdiff.engine.types import Snapshot
from nbdiff.judge.blame import Divergence
from nbdiff.judge.metrics import compare_tensors
from nbdiff.judge.tolerance import Tolerance
from nbdiff.weights.plan import LayerWeights

__all__ = ["Explanation", "followed", "drift_note"]


def followed(plans: dict[str, LayerWeights], base0: Snapshot, base_k: Snapshot, raw0: Snapshot) -> Snapshot:
    """Raw's weights at step 0 moved as base's moved since (converted to raw's layout).

    Differences raw started with stay (they are not the updates' doing); a layer whose arrays
    cannot be converted is left out, and keeps raw's own weights."""
    out: Snapshot = {}
    for key, plan in plans.items():
        b0, bk, r0 = base0.get(key, {}), base_k.get(key, {}), raw0.get(key, {})
        moved_by = {n: bk[n] - b0[n] for n in bk if n in b0}
        try:
            moved = plan.convert(moved_by) if moved_by else {}
        except (KeyError, ValueError):
            continue
        out[key] = {n: r0[n] + moved[n] for n in r0 if n in moved and np.shape(moved[n]) == np.shape(r0[n])}
    return out


@dataclass(frozen=True)
class Explanation:
    """What explains an error no layer makes on its own: weights that drifted, a layer that amplifies
    rounding. Its note is said instead of a divergence."""

    note: str
    any_accumulated: bool = True
    """Explains every accumulated error; else only one whose layer's own error was measured."""
    drifted: bool = False
    """Weights beyond their tolerance: an error no one could measure is explained too."""

    def explains(self, found: Divergence) -> bool:
        """Whether ``found`` is this one's: an accumulated error. Weights drifted within their tolerance
        explain it only where the layer's own error was measured (a replay, a rebuild) and passed:
        training that amplifies rounding (a 256-step SGD run of equivalent models whose trajectories
        part by x1.4 a step from step ~170) is told from a layer nothing could measure. Once they
        drifted beyond it, a layer judged only from what it received (not measured) is theirs too:
        its inputs carry the drift, and nothing tells its own error from it."""
        measured = found.local_error is not None and bool(found.local_by) and not found.unmeasured
        if found.where == "accumulated":
            return self.any_accumulated or measured
        return self.drifted and bool(found.unmeasured)


def drift_note(
    step: int, follow: Snapshot, raw_k: Snapshot, tol: Callable[[str, str], Tolerance]
) -> Explanation | None:
    """How far raw's weights at ``step`` are from where base's updates would have taken them;
    ``None`` where they are exactly there."""
    worst = None
    for key, arrays in follow.items():
        for name, want in arrays.items():
            have = raw_k.get(key, {}).get(name)
            if have is None or have.shape != want.shape or not want.size:
                continue
            d = compare_tensors(f"{key}.{name}" if key else name, have, want, tol(str(want.dtype), str(have.dtype)))
            if d.max_abs > 0 and (worst is None or d.ratio > worst.ratio):
                worst = d
    if worst is None:
        return None
    where = f"raw's weights differ from where base's updates would have taken them (`{worst.name}` by {worst.max_abs:.3g}, max abs"
    if not worst.passed:
        return Explanation(
            f"from step {step} on, {where}): the earlier updates each agreed within what their gradients explain, and "
            "the differences they left add up. No layer differs on its own, so what the outputs inherit from that "
            "drift is not reported as a divergence",
            True,
            True,
        )
    return Explanation(
        f"from step {step} on, {where}, {worst.ratio:.2g} of its tolerance): the earlier updates each agreed within "
        "what their gradients explain, and training amplifies the little they left (the two runs part as any two "
        "runs whose rounding differs do). Every layer's own error was measured within tolerance, so what the "
        "steps inherit from that drift is not reported as a divergence",
        False,
    )
