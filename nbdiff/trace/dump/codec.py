"""How events and their tensors are written as JSON and read back: the one encoding every dump
(:mod:`nbdiff.trace.dump.writer`, :mod:`nbdiff.trace.dump.store`) and every saved result
(:mod:`nbdiff.report.saved`) uses. Nothing is pickled: JSON, with the values in a payload by key."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from nbdiff.errors import DumpError
from nbdiff.trace.dump.reading import load_json, read_text
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.trace.origin.stack import Frame
from nbdiff.trace.stats import Stats, decoded_sample, sample_json, tensor_sample

__all__ = [
    "json_float", "tensor_json", "event_json", "write_json_atomic",
    "read_float", "load_dump_json", "tensor_from_json", "event_from_json",
]  # fmt: skip

_SAMPLED_PHASES = (Phase.FORWARD, Phase.BACKWARD)


def json_float(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)  # "nan", "inf", "-inf": JSON has no such numbers


def tensor_json(
    t: TensorRecord,
    key: str | None,
    seen: dict[int, Stats | None],
    keep_stats: bool,
    samples: dict[int, dict[str, str] | None] | None = None,
) -> dict[str, Any]:
    # A tensor recorded as one layer's output and the next one's input shares its values: the
    # statistics are computed once (``seen``: id of the values -> statistics, for one step), and
    # the sample too (``samples``, given where the tensor is sampled).
    if not keep_stats:
        st = None
    elif t.stats is not None or t.value is None:
        st = t.stats
    else:
        st = seen.get(id(t.value))
        if st is None:
            st = seen[id(t.value)] = t.statistics()
    stats = None if st is None else {k: json_float(v) if isinstance(v, float) else v for k, v in st.as_dict().items()}
    out = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "stats": stats, "key": key}
    if t.layout:
        out["layout"] = t.layout
    # The sample is drawn from the values, or was drawn by the framework as it summarised them.
    source = t.value if t.value is not None else t.sample
    if samples is None or st is None or key is not None or source is None:
        return out
    if id(source) not in samples:
        sample = tensor_sample(source) if source is t.value else source
        samples[id(source)] = None if sample is None else sample_json(sample)
    if samples[id(source)] is not None:
        out["sample"] = samples[id(source)]
    return out


def event_json(
    e: Event,
    payload: dict[str, np.ndarray],
    keep_values: bool,
    keep_stats: bool,
    seen: dict[int, Stats | None] | None = None,
    keys: dict[int, str] | None = None,
    samples: dict[int, dict[str, str] | None] | None = None,
) -> dict[str, Any]:
    seen = {} if seen is None else seen
    keys = {} if keys is None else keys  # id of the values -> payload key: shared values are stored once
    samples = {} if samples is None else samples

    # Activations and their gradients keep a sample where their values are not kept; a parameter's
    # (its gradient, its update) are compared in raw's layout, which a sample's positions do not follow.
    sampled = keep_stats and e.phase in _SAMPLED_PHASES and e.kind is not Kind.PARAM

    def tensors(group: str, items: tuple[TensorRecord, ...]) -> list[dict[str, Any]]:
        out = []
        for t in items:
            key = None
            if keep_values and t.value is not None:
                key = keys.get(id(t.value))
                if key is None:
                    key = keys[id(t.value)] = f"{e.phase.value}.{e.order}.{group}.{t.name}"
                    payload[key] = np.require(t.value, requirements="C")  # ascontiguousarray makes 0-d arrays 1-d
            out.append(tensor_json(t, key, seen, keep_stats, samples if sampled and group != "param" else None))
        return out

    return {
        "phase": e.phase.value,
        "kind": e.kind.value,
        "order": e.order,
        "path": e.path,
        "type": e.type_name,
        "call": e.call,
        "depth": e.depth,
        "parent": e.parent,
        "library": e.library,
        "bases": list(e.bases),
        "weights": [list(w) for w in e.weights],
        "inputs": tensors("in", e.inputs),
        "outputs": tensors("out", e.outputs),
        "params": tensors("param", e.params),
        "args": list(e.args),
        "stack": [[f.filename, f.lineno, f.function] for f in e.stack],
    }


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """A reader never sees half a file, and a crash or kill right after leaves the whole one.

    No ``fsync``: what a killed process wrote stays in the page cache and reaches the disk, and
    an fsync made ext4 flush the step's whole payload with it (44 ms per step of the benchmark
    CNN, three times the step). Only an operating-system crash can lose the last steps."""
    # A name of its own: two writers of one file at once (two saves into one folder) wrote one shared
    # ".tmp" over each other, and the file renamed into place was a mix of both.
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_float(x: Any) -> float:
    return float(x)  # float("nan"/"inf") reads the strings back


def load_dump_json(path: Path, what: str, written_by: str = "nbdiff.record") -> Any:
    try:
        return load_json(read_text(path))
    except FileNotFoundError:
        raise DumpError(f"{path}: missing; is this a folder written by {written_by}?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DumpError(f"{path}: not valid JSON ({exc}); the dump is truncated or was edited.") from None
    except RecursionError:
        raise DumpError(f"{path}: JSON nested too deeply to be {what}; the dump was edited.") from None
    except OSError as exc:
        raise DumpError(f"{path}: cannot be read ({exc.strerror or exc}).") from None


def tensor_from_json(t: dict[str, Any], payload: dict[str, np.ndarray], where: Path, step: int) -> TensorRecord:
    value = None
    if t.get("key") is not None:
        if t["key"] not in payload:
            raise DumpError(f"{where}: step {step} refers to tensor {t['key']!r}, missing from its payload file.")
        value = payload[t["key"]]
        if list(value.shape) != list(t["shape"]):
            raise DumpError(
                f"{where}: tensor {t['key']!r} has shape {list(value.shape)} but the manifest says {t['shape']}."
            )
    st = t.get("stats")
    stats = None
    if st is not None:
        m = [read_float(st[f]) for f in ("min", "max", "mean", "std", "abs_mean")]
        stats = Stats(m[0], m[1], m[2], m[3], m[4], int(st["nan"]), int(st["inf"]))
    shape = tuple(int(n) for n in t["shape"])
    sample = None
    if t.get("sample") is not None:
        sample = decoded_sample(t["sample"])  # checked by validate_step
    return TensorRecord(str(t["name"]), shape, str(t["dtype"]), value, stats, str(t.get("layout", "")), sample)


def event_from_json(e: dict[str, Any], step: int, payload: dict[str, np.ndarray], where: Path) -> Event:
    return Event(
        step=step,
        phase=Phase(e["phase"]),
        kind=Kind(e["kind"]),
        order=int(e["order"]),
        path=str(e["path"]),
        type_name=str(e["type"]),
        call=int(e["call"]),
        depth=int(e["depth"]),
        parent=None if e["parent"] is None else int(e["parent"]),
        library=bool(e["library"]),
        inputs=tuple(tensor_from_json(t, payload, where, step) for t in e["inputs"]),
        outputs=tuple(tensor_from_json(t, payload, where, step) for t in e["outputs"]),
        params=tuple(tensor_from_json(t, payload, where, step) for t in e["params"]),
        args=tuple(str(a) for a in e.get("args", ())),
        stack=tuple(Frame(str(f[0]), int(f[1]), str(f[2])) for f in e.get("stack", ())),
        bases=tuple(str(b) for b in e.get("bases", ())),
        weights=tuple(tuple(int(n) for n in w) for w in e.get("weights", ())),
    )
