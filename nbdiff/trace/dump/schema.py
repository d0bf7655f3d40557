"""The dump manifest's schema, checked once when it is read: a dump is untrusted input.

Every malformed field is a :class:`~nbdiff.errors.DumpError` naming the file and the key
(``steps[2].events[5].parent``), before anything else reads it. Payload file names are
confined to the rank folder, parent links must form a tree, and claimed shapes are plain
non-negative integers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from nbdiff.errors import DumpError
from nbdiff.trace.events import Kind, Phase
from nbdiff.trace.mesh import LAYOUT, Mesh
from nbdiff.trace.stats import check_sample_json

__all__ = ["validate_manifest", "validate_step", "payload_path", "FRAMEWORKS", "MAX_DEPTH"]

FRAMEWORKS = ("torch", "paddle")
_PHASES = {p.value for p in Phase}
_KINDS = {k.value for k in Kind}
_STAT_KEYS = ("min", "max", "mean", "std", "abs_mean")


class _Check:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, what: str) -> DumpError:
        return DumpError(f"{self.path}: {key} {what}; the dump was edited or damaged.")

    def type(self, value: Any, kind: type | tuple[type, ...], key: str, what: str) -> Any:
        # bool is an int in Python: a count or an index must not be True.
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
            raise self.fail(key, f"must be {what}, not {type(value).__name__} {value!r:.60}")
        return value

    def int(self, value: Any, key: str, low: int = 0) -> int:
        self.type(value, int, key, "an integer")
        if value < low:
            raise self.fail(key, f"must be at least {low}, not {value}")
        return value

    def strs(self, value: Any, key: str) -> None:
        for i, s in enumerate(self.type(value, list, key, "a list")):
            self.type(s, str, f"{key}[{i}]", "a string")


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def payload_path(folder: Path, name: Any, key: str, where: Path | None = None) -> Path:
    """``folder / name``, refused unless it is a plain file name that stays inside ``folder``
    (no ``..``, no absolute path, no symlink pointing out). ``where``: the file that names it."""
    check = _Check(where or folder / "manifest.json")
    check.type(name, str, key, "a file name")
    if not name or Path(name).name != name or name in (".", ".."):
        raise check.fail(key, f"is {name!r}: payloads must be plain file names inside {folder}")
    file = folder / name
    if file.resolve().parent != folder.resolve():
        raise check.fail(key, f"is {name!r}, which leads outside {folder}")
    return file


_ARGUMENT = (bool, int, float, str, type(None))  # a constructor argument's value, as a dump keeps it


def validate_manifest(data: Any, path: Path) -> None:
    """Raise :class:`DumpError` at the first field of ``data`` that does not fit the schema."""
    c = _Check(path)
    c.type(data, dict, "the manifest", "a JSON object")
    framework = data.get("framework")
    if framework not in FRAMEWORKS:
        raise c.fail("framework", f"is {framework!r}; nbdiff reads dumps of {', '.join(FRAMEWORKS)}")
    c.type(data.get("model"), str, "model", "a string")
    c.int(data.get("rank"), "rank")
    if data.get("mesh") is not None:
        Mesh.from_json(c.type(data["mesh"], dict, "mesh", "an object"), str(path))
    if data.get("complete") is not None:
        c.type(data["complete"], bool, "complete", "true or false")
    layers = c.type(data.get("layers", {}), dict, "layers", "an object of layer path to class names")
    for name, classes in layers.items():
        c.strs(classes, f"layers[{name!r}]")
    facts = c.type(data.get("layer_facts", {}), dict, "layer_facts", "an object of layer path to an object")
    for name, known in facts.items():
        for k, v in c.type(known, dict, f"layer_facts[{name!r}]", "an object").items():
            if not isinstance(v, (str, int)) or isinstance(v, bool):
                raise c.fail(f"layer_facts[{name!r}][{k!r}]", f"is {v!r}; expected a string or a whole number")
    args = c.type(data.get("layer_args", {}), dict, "layer_args", "an object of layer path to an object")
    for name, known in args.items():
        for k, v in c.type(known, dict, f"layer_args[{name!r}]", "an object").items():
            if not all(isinstance(x, _ARGUMENT) for x in (v if isinstance(v, list) else [v])):
                raise c.fail(
                    f"layer_args[{name!r}][{k!r}]",
                    f"is {v!r}; expected a number, a string, true/false or a list of them",
                )
    modes = c.type(
        data.get("batch_norm_training", {}), dict, "batch_norm_training", "an object of layer path to true/false"
    )
    for name, training in modes.items():
        c.type(training, bool, f"batch_norm_training[{name!r}]", "true or false")
    layouts = c.type(data.get("param_layouts", {}), dict, "param_layouts", "an object of layer path to an object")
    for name, own in layouts.items():
        for k, v in c.type(own, dict, f"param_layouts[{name!r}]", "an object").items():
            _layout(c, v, f"param_layouts[{name!r}][{k!r}]")
    steps = data.get("steps")
    if data.get("version") == 1:  # every step inline
        for k, step in enumerate(c.type(steps, list, "steps", "a list")):
            _step(c, step, f"steps[{k}]")
    elif steps is not None:  # the number of step files, once the recording closed
        c.int(steps, "steps")


def validate_step(data: Any, path: Path) -> None:
    """One step file of a version 2 dump (``step3.json``)."""
    _step(_Check(path), data, "the step")


def _step(c: _Check, step: Any, key: str) -> None:
    c.type(step, dict, key, "an object")
    if step.get("complete") is not None:
        c.type(step["complete"], bool, f"{key}.complete", "true or false")
    if step.get("payload") is not None:
        c.type(step["payload"], str, f"{key}.payload", "a file name")
    if step.get("number") is not None:
        c.int(step["number"], f"{key}.number")
    events = c.type(step.get("events"), list, f"{key}.events", "a list")
    for i, e in enumerate(events):
        _event(c, e, f"{key}.events[{i}]")
    _tree(c, events, key)


MAX_DEPTH = 10_000
"""Deeper than Python's own recursion allows: a dump or result that claims more was edited."""


def _event(c: _Check, e: Any, key: str) -> None:
    c.type(e, dict, key, "an object")
    if e.get("phase") not in _PHASES:
        raise c.fail(f"{key}.phase", f"is {e.get('phase')!r}, not one of {sorted(_PHASES)}")
    if e.get("kind") not in _KINDS:
        raise c.fail(f"{key}.kind", f"is {e.get('kind')!r}, not one of {sorted(_KINDS)}")
    for field in ("order", "call", "depth"):
        c.int(e.get(field), f"{key}.{field}")
    if e["depth"] > MAX_DEPTH:  # a claimed depth of 1e9 made the view indent by it (5.9 GB)
        raise c.fail(f"{key}.depth", f"is {e['depth']}; no model nests calls deeper than {MAX_DEPTH}")
    if e.get("parent") is not None:
        c.int(e["parent"], f"{key}.parent")
    for field in ("path", "type"):
        c.type(e.get(field), str, f"{key}.{field}", "a string")
    c.type(e.get("library"), bool, f"{key}.library", "true or false")
    for group in ("inputs", "outputs", "params"):
        for j, t in enumerate(c.type(e.get(group), list, f"{key}.{group}", "a list")):
            _tensor(c, t, f"{key}.{group}[{j}]")
    c.strs(e.get("args", []), f"{key}.args")
    c.strs(e.get("bases", []), f"{key}.bases")
    for j, f in enumerate(c.type(e.get("stack", []), list, f"{key}.stack", "a list")):
        fk = f"{key}.stack[{j}]"
        if not (isinstance(f, list) and len(f) == 3):
            raise c.fail(fk, "must be [file, line, function]")
        c.type(f[0], str, fk, "a file name first")
        c.int(f[1], fk)
        c.type(f[2], str, fk, "a function name last")
    for j, w in enumerate(c.type(e.get("weights", []), list, f"{key}.weights", "a list")):
        for n in c.type(w, list, f"{key}.weights[{j}]", "a shape"):
            c.int(n, f"{key}.weights[{j}]")


def _tensor(c: _Check, t: Any, key: str) -> None:
    c.type(t, dict, key, "an object")
    c.type(t.get("name"), str, f"{key}.name", "a string")
    c.type(t.get("dtype"), str, f"{key}.dtype", "a string")
    for n in c.type(t.get("shape"), list, f"{key}.shape", "a list of sizes"):
        c.int(n, f"{key}.shape")
    if t.get("key") is not None:
        c.type(t["key"], str, f"{key}.key", "a string")
    if t.get("layout") is not None:
        _layout(c, t["layout"], f"{key}.layout")
    stats = t.get("stats")
    if stats is not None:
        c.type(stats, dict, f"{key}.stats", "an object")
        for s in _STAT_KEYS:
            v = stats.get(s)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool)) and v not in ("nan", "inf", "-inf"):
                raise c.fail(f"{key}.stats.{s}", f"must be a number, not {v!r:.60}")
        for s in ("nan", "inf"):
            c.int(stats.get(s), f"{key}.stats.{s}")
    if t.get("sample") is not None:
        try:
            check_sample_json(c.type(t["sample"], dict, f"{key}.sample", "an object"), math.prod(t["shape"]))
        except ValueError as exc:
            raise c.fail(f"{key}.sample", str(exc)) from None


def _layout(c: _Check, value: Any, key: str) -> None:
    if not LAYOUT.fullmatch(c.type(value, str, key, "a string")):
        raise c.fail(
            key,
            f"must be shard(d), strided(d,k), replicate or partial per mesh dimension (each @name or not), not {value!r:.60}",
        )


def _tree(c: _Check, events: list[dict[str, Any]], key: str) -> None:
    """Parent links within each phase point at events that exist and never loop."""
    by_phase: dict[str, dict[int, Any]] = {}
    for e in events:
        by_phase.setdefault(e["phase"], {})[e["order"]] = e.get("parent")
    for phase, parents in by_phase.items():
        ends: set[int] = set()  # events whose chain is known to end: each link is walked once
        for order in parents:
            chain: list[int] = []
            on: set[int] = set()
            p: Any = order
            while p is not None and p in parents and p not in ends:  # a missing parent counts as none
                if p in on:
                    raise c.fail(f"{key}: {phase} event {order}'s parent chain", f"loops back to event {p}")
                on.add(p)
                chain.append(p)
                p = parents[p]
            ends.update(chain)
