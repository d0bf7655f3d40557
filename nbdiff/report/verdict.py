"""``DiffResult.to_json()``: the verdict as a document a CI job or a script can act on.

Not the saved result (``DiffResult.save`` keeps every event and tensor to reopen the view):
this is the answer alone, small and stable. Its ``format`` is ``"nbdiff-verdict"`` and its
``version`` is bumped whenever a key changes meaning or goes away (new keys may appear in
any version). Non-finite numbers are written as the strings ``"nan"``, ``"inf"`` and
``"-inf"``: JSON has no such numbers.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbdiff.judge.blame import Divergence
from nbdiff.judge.findings import grouped_findings
from nbdiff.judge.metrics import TensorDiff
from nbdiff.report.saved import _plain
from nbdiff.trace.dump.codec import json_float
from nbdiff.trace.origin.stack import Frame

if TYPE_CHECKING:
    from nbdiff.result import DiffResult

__all__ = ["FORMAT", "VERSION", "verdict", "write_verdict"]

FORMAT = "nbdiff-verdict"
VERSION = 2
"""2: an offline error judged from what an event received is `not measured`, never `local`; `not_measured`."""
_METRICS = ("max_abs", "max_rel", "mean_abs", "cosine", "ratio")


def verdict(result: DiffResult) -> dict[str, Any]:
    """The verdict as plain JSON data (see the README's "A verdict machines can read")."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "verdict": "aligned" if result else "diverged",
        "base": {"framework": result.base_framework, "model": result.base_model},
        "raw": {"framework": result.raw_framework, "model": result.raw_model},
        "steps": result.steps,
        "first_divergence": None if result.first_divergence is None else finding(result.first_divergence),
        "findings": [finding(f) for f in result.findings],
        "counts": _counts(result),
        "warnings": list(result.warnings),
        "notes": list(result.notes),
        "options": _plain(result.options),
        "unmatched": {
            "base": sorted({e.path for e in result.unmatched_base}),
            "raw": sorted({e.path for e in result.unmatched_raw}),
        },
    }


def _counts(result: DiffResult) -> dict[str, int]:
    """The count every place says (:mod:`nbdiff.judge.findings`): places at fault, the events with their own
    error they hold, and framework differences (which do not fail)."""
    groups = grouped_findings(result.findings)
    return {
        "findings": len(groups),
        "events": sum(len(g.events) for g in groups),
        "framework_differences": sum(1 for f in result.findings if f.where == "framework"),
    }


def finding(d: Divergence) -> dict[str, Any]:
    """One finding: where (phase, step, rank, both paths), how much (metrics) and why."""
    return {
        "description": d.describe(),
        "phase": d.phase.value,
        "step": d.step,
        "rank": d.rank,
        "where": d.where,
        "blame": _blame(d),
        "base": {"path": d.base_path, "type": d.base_type, "stack": _stack(d.base_stack)},
        "raw": {"path": d.raw_path, "type": d.raw_type, "stack": _stack(d.raw_stack)},
        "parameter": d.parameter,
        "between": list(d.between) if d.where == "between" else None,
        "metrics": _metrics(d.metrics),
        "local_error": None if d.local_error is None or not _measured(d) else _metrics(d.local_error),
        "local_by": d.local_by if d.local_error is not None and _measured(d) else None,
        "not_measured": d.unmeasured or None,
        "shards": d.shards or None,
        "why": d.why(),
        "arguments": [{"name": a.name, "base": _plain(a.base), "raw": _plain(a.raw)} for a in d.arguments],
    }


def _blame(d: Divergence) -> str:
    """``local`` (its own error: ``local_by`` says how it was found), ``inherited`` (no single event
    exceeds tolerance on its own) or ``not measured`` (it could not be run again: never called local)."""
    if d.inherited:
        return "inherited"
    return "local" if d.local_error is not None and _measured(d) else "not measured"


def _measured(d: Divergence) -> bool:
    """Whether the local error was measured (run again, or compared directly); offline, a layer's
    error judged from what it received is never called local."""
    return not d.unmeasured


def _metrics(t: TensorDiff) -> dict[str, Any]:
    return {
        "tensor": t.name,
        **{k: json_float(float(getattr(t, k))) for k in _METRICS},
        "nan": {"base": t.nan_base, "raw": t.nan_raw},
        "inf": {"base": t.inf_base, "raw": t.inf_raw},
        "shape": {"base": list(t.base_shape), "raw": list(t.raw_shape)},
        "tolerance": _plain(asdict(t.tolerance)),
        "mode": t.mode,
        "note": t.note,
    }


def _stack(frames: tuple[Frame, ...]) -> list[dict[str, Any]]:
    return [{"file": f.filename, "line": f.lineno, "function": f.function} for f in frames]


def write_verdict(result: DiffResult, path: str | os.PathLike[str] | None = None) -> str:
    """The verdict as JSON text; with ``path``, written there too (``-``: nowhere but the return value)."""
    text = json.dumps(verdict(result), indent=1, allow_nan=False)
    if path is not None and str(path) != "-":
        Path(path).write_text(text + "\n", encoding="utf-8")
    return text
