"""``DiffResult.save(path)`` / ``nbdiff.load(path)``: a result as JSON plus safetensors, no pickle.

::

    path/
      result.json          verdict, blame, warnings, every compared pair and its metrics
      tensors.safetensors  the recorded tensors the view shows (statistics, plots)

Events are written with the dump format's own event encoding, so a loaded result shows
in the view and the HTML report as the original did. Layer objects and replay are not
kept: a loaded result is for reading, not for re-running.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from nbdiff.align.arguments import ArgDiff
from nbdiff.errors import DumpError
from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.judge.metrics import TensorDiff
from nbdiff.judge.tolerance import Tolerance
from nbdiff.result import DiffResult
from nbdiff.trace.dump.codec import (
    event_from_json,
    event_json,
    json_float,
    load_dump_json,
    read_float,
    tensor_from_json,
    tensor_json,
    write_json_atomic,
)
from nbdiff.trace.dump.reading import read_payload
from nbdiff.trace.dump.schema import MAX_DEPTH
from nbdiff.trace.events import Event, Phase, TensorRecord
from nbdiff.trace.origin.cells import cells_of, remember_cells
from nbdiff.trace.origin.stack import Frame

__all__ = ["save_result", "load_result", "FORMAT"]

FORMAT = "nbdiff-result"
VERSION = 1
_JSON, _TENSORS = "result.json", "tensors.safetensors"
_FLOATS = ("max_abs", "max_rel", "mean_abs", "cosine", "ratio")


def _diff_json(t: TensorDiff) -> dict[str, Any]:
    d = {f.name: getattr(t, f.name) for f in fields(t) if f.name != "detail"}  # every metric, computed
    d["tolerance"] = asdict(t.tolerance)
    for k in _FLOATS:
        d[k] = json_float(d[k])
    return d


def _diff(d: dict[str, Any]) -> TensorDiff:
    d = dict(d)
    for k in _FLOATS:
        d[k] = read_float(d[k])
    d["tolerance"] = Tolerance(**d["tolerance"])
    d["base_shape"], d["raw_shape"] = tuple(d["base_shape"]), tuple(d["raw_shape"])
    return TensorDiff(**d)


def _plain(v: Any) -> Any:
    """JSON-safe copy of an option value (objects become their repr)."""
    if isinstance(v, float):
        return json_float(v)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return repr(v)


def save_result(result: DiffResult, path: str | os.PathLike[str]) -> Path:
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    replaced = _tensors_named(out)
    payload: dict[str, np.ndarray] = {}
    # A save over an older one, cut short, must read as the old or the new result, never a mix: the
    # tensors go to a file of their own name, then the JSON naming it replaces the old at once.
    tensors = f"tensors-{uuid.uuid4().hex[:12]}.safetensors"

    def records(items: tuple[TensorRecord, ...], prefix: str) -> list[dict[str, Any]]:
        """Tensors outside an event's groups (single-step's ``given``, a replay's evidence)."""
        out = []
        for i, t in enumerate(items):
            key = None if t.value is None else f"{prefix}{i}"
            if key is not None:
                payload[key] = np.require(t.value, requirements="C")
            out.append(tensor_json(t, key, {}, keep_stats=True))
        return out

    def event(e: Event, prefix: str) -> dict[str, Any]:
        mine: dict[str, np.ndarray] = {}
        j = event_json(e, mine, keep_values=True, keep_stats=True)
        for group in ("inputs", "outputs", "params"):
            for t in j[group]:
                if t["key"] is not None:
                    payload[prefix + t["key"]] = mine[t["key"]]
                    t["key"] = prefix + t["key"]
        return {"step": e.step, "rank": e.rank, **j, "given": records(e.given, prefix + "given.")}

    pairs = [
        {
            "base": event(d.base, f"{i}.b."),
            "raw": event(d.raw, f"{i}.r."),
            "tensors": [_diff_json(t) for t in d.tensors],
            "local": None if d.local is None else [_diff_json(t) for t in d.local],
            "evidence": records(d.evidence, f"{i}.evidence."),
        }
        for i, d in enumerate(result.events)
    ]
    div = result.first_divergence
    # A finding names its pair by index, so a loaded result's view marks it as the original did.
    at = {(d.base.phase, d.base.key, d.raw.key): i for i, d in enumerate(result.events)}

    def finding(f: Divergence) -> dict[str, Any]:
        e = f.event
        return {**_divergence_json(f), "event": None if e is None else at.get((e.base.phase, e.base.key, e.raw.key))}

    data = {
        "format": FORMAT,
        "version": VERSION,
        **{k: getattr(result, k) for k in ("base_framework", "raw_framework", "base_model", "raw_model", "steps")},
        "warnings": list(result.warnings),
        "notes": list(result.notes),
        "options": _plain(result.options),
        "first_divergence": None if div is None else finding(div),
        "findings": [finding(f) for f in result.findings],
        "events": pairs,
        "unmatched_base": [event(e, f"ub{i}.") for i, e in enumerate(result.unmatched_base)],
        "unmatched_raw": [event(e, f"ur{i}.") for i, e in enumerate(result.unmatched_raw)],
        "step_summary": [_plain(r) for r in result.step_summary],
        "tensors": tensors,
        "cells": cells_of(_frame_files(result)),
    }
    try:
        save_file(payload, str(out / tensors))
        write_json_atomic(out / _JSON, data)
    except (OSError, SafetensorError) as exc:
        (out / tensors).unlink(missing_ok=True)
        raise DumpError(f"{out}: cannot save the result there ({getattr(exc, 'strerror', None) or exc}).") from None
    except BaseException:  # Ctrl-C before the JSON named them: the new tensors are no one's
        (out / tensors).unlink(missing_ok=True)
        raise
    if replaced is not None and replaced != tensors:  # the tensors of the result this one replaced, only
        (out / replaced).unlink(missing_ok=True)
    return out


def _tensors_named(folder: Path) -> str | None:
    """The tensor file the result saved in ``folder`` names (its own file, nothing else of the folder's);
    ``None`` where there is none, or it cannot be read as a result: then nothing is deleted."""
    try:
        named = json.loads((folder / _JSON).read_text(encoding="utf-8")).get("tensors")
    except (OSError, ValueError, AttributeError):
        return None
    # A bare file name of the saved-result form only: never a path out of the folder.
    if isinstance(named, str) and named == Path(named).name and named.endswith(".safetensors"):
        return named if named.startswith("tensors") else None
    return None


def _divergence_json(d: Divergence) -> dict[str, Any]:
    return {
        **{f.name: getattr(d, f.name) for f in fields(d) if f.name in _DIV_PLAIN},
        "phase": d.phase.value,
        "metrics": _diff_json(d.metrics),
        "tolerance": asdict(d.tolerance),
        "local_error": None if d.local_error is None else _diff_json(d.local_error),
        "base_stack": [[f.filename, f.lineno, f.function] for f in d.base_stack],
        "raw_stack": [[f.filename, f.lineno, f.function] for f in d.raw_stack],
        "between": list(d.between),
        "arguments": [[a.name, _plain(a.base), _plain(a.raw)] for a in d.arguments],
        "explanation": d.explanation,
        "unpaired": list(d.unpaired),
        "local_by": d.local_by,
        "unmeasured": d.unmeasured,
        "shards": d.shards,
    }


_DIV_PLAIN = ("step", "base_path", "raw_path", "base_type", "raw_type", "inherited", "where", "parameter", "rank")


def _divergence(d: dict[str, Any], events: tuple[EventDiff, ...] = ()) -> Divergence:
    i = d.get("event")
    return Divergence(
        **{k: d[k] for k in _DIV_PLAIN},
        phase=Phase(d["phase"]),
        metrics=_diff(d["metrics"]),
        tolerance=Tolerance(**d["tolerance"]),
        local_error=None if d["local_error"] is None else _diff(d["local_error"]),
        base_stack=tuple(Frame(str(f[0]), int(f[1]), str(f[2])) for f in d["base_stack"]),
        raw_stack=tuple(Frame(str(f[0]), int(f[1]), str(f[2])) for f in d["raw_stack"]),
        between=tuple(d["between"]),  # type: ignore[arg-type]
        arguments=tuple(ArgDiff(n, _restore_args(b), _restore_args(r)) for n, b, r in d["arguments"]),
        explanation=str(d.get("explanation", "")),
        unpaired=tuple(str(x) for x in d.get("unpaired", [])),
        local_by=str(d.get("local_by", "replay")),
        unmeasured=str(d.get("unmeasured", "")),
        shards=str(d.get("shards", "")),
        event=events[i] if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(events) else None,
    )


def _restore_args(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _step_row(r: Any) -> dict[str, Any]:
    if not isinstance(r, dict):
        raise TypeError(f"a step_summary row is {type(r).__name__}, not an object")
    return {str(k): int(v) if k in ("step", "tokens") else None if v is None else read_float(v) for k, v in r.items()}


def _frame_files(result: DiffResult) -> set[str]:
    """Every file a frame of the result points into (the findings' stacks, every event's)."""
    frames = [x for f in result.findings for x in (*f.base_stack, *f.raw_stack)]
    events = [e for d in result.events for e in (d.base, d.raw)] + [*result.unmatched_base, *result.unmatched_raw]
    return {x.filename for x in frames} | {x.filename for e in events for x in e.stack}


def load_result(path: str | os.PathLike[str]) -> DiffResult:
    """Read a result written by :meth:`DiffResult.save`; a damaged one is a :class:`DumpError`."""
    folder = Path(path)
    where = folder / _JSON
    data = load_dump_json(where, "a saved nbdiff result", written_by="DiffResult.save")
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise DumpError(f'{where}: not a saved nbdiff result (no "format": "{FORMAT}", version {VERSION}).')
    name = data.get("tensors", _TENSORS)
    if not isinstance(name, str) or not name.startswith("tensors") or "/" in name or "\\" in name or ".." in name:
        raise DumpError(f"{where}: tensors is {name!r}; expected a file name in the result's folder.")
    # Checked as a dump's payload is: a regular file, its header inside it, no more than memory holds
    # (a FIFO in its place hung `nbdiff view`; a sparse file claiming 4 GiB was read whole).
    payload = read_payload(folder / name, "the saved tensors")
    remember_cells(data.get("cells"), str(where))
    try:

        def event(j: dict[str, Any]) -> Event:
            depth = j.get("depth")
            if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH:
                # a claimed depth of 1e9 made the view indent by it (5.9 GB)
                raise DumpError(
                    f"{where}: an event's depth is {depth!r}; no model nests calls deeper than {MAX_DEPTH}."
                )
            e = event_from_json(j, int(j["step"]), payload, where)
            given = tuple(tensor_from_json(t, payload, where, e.step) for t in j.get("given", ()))
            return replace(e, rank=int(j.get("rank") or 0), given=given) if j.get("rank") or given else e

        events = tuple(
            EventDiff(
                event(p["base"]),
                event(p["raw"]),
                tuple(_diff(t) for t in p["tensors"]),
                None if p["local"] is None else tuple(_diff(t) for t in p["local"]),
                tuple(tensor_from_json(t, payload, where, int(p["base"]["step"])) for t in p.get("evidence", ())),
            )
            for p in data["events"]
        )
        d = data["first_divergence"]
        div = None if d is None else _divergence(d, events)
        return DiffResult(
            **{k: data[k] for k in ("base_framework", "raw_framework", "base_model", "raw_model", "steps")},
            first_divergence=div,
            findings=tuple(_divergence(f, events) for f in data.get("findings", [])),
            events=events,
            unmatched_base=tuple(event(e) for e in data["unmatched_base"]),
            unmatched_raw=tuple(event(e) for e in data["unmatched_raw"]),
            warnings=tuple(data["warnings"]),
            notes=tuple(data["notes"]),
            options={**data["options"], "loaded_from": str(folder)},
            step_summary=tuple(_step_row(r) for r in data.get("step_summary", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DumpError(f"{where}: malformed saved result ({exc!r}).") from None
