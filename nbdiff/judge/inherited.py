"""What a result that agrees says of rows over their tolerance by inherited error only: a note per
row, and one warning where the user reads them (the view draws those rows as explained)."""

from __future__ import annotations

from collections.abc import Sequence

from nbdiff.judge.blame import EventDiff

__all__ = ["inherited_notes", "inherited_warning"]


def inherited_notes(diffs: Sequence[EventDiff]) -> list[str]:
    """Lines for events over tolerance only by what they inherited, in a step that agrees."""
    out = []
    for d in diffs:
        if not d.passed and d.local_ratio is not None and d.local_ratio <= 1.0:
            out.append(
                f"step {d.base.step}, {d.base.phase.value}: `{d.base.path or '<root>'}` is {d.ratio:.3g}x its "
                f"tolerance by inherited error only (local {d.local_ratio:.3g}x); the results stay within tolerance or "
                "within the model's own sensitivity to rounding"
            )
    return out


def inherited_warning(diffs: Sequence[EventDiff]) -> list[str]:
    """One line for a result that agrees while some rows exceed their tolerance: they are explained
    (inherited, no own error), and the view draws them so; say it where the user reads warnings."""
    over = [d for d in diffs if not d.passed and (d.local_ratio is None or d.local_ratio <= 1.0)]
    if not over:
        return []
    worst = max(over, key=lambda d: d.ratio)
    return [
        f"{len(over)} compared row(s) exceed their tolerance only by error inherited from earlier events (worst "
        f"`{worst.base.path or '<root>'}`, step {worst.base.step} {worst.base.phase.value}, {worst.ratio:.3g}x; no "
        "event's own error does): rounding that grew through the model, or weights that drifted through updates "
        "that agreed. They do not fail the result; the view draws them as explained"
    ]
