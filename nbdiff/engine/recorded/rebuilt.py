"""Layers rebuilt from tensor dumps: the local error ``auto_diff`` measures by replay, offline.

A tensor dump keeps how each layer was built (its class and literal constructor arguments,
:mod:`nbdiff.trace.origin.constructors`), its weights at the first recorded step of each run and
every update after it, and each call's inputs and outputs. That is enough to build the layer
again, give it the weights it had at step ``k`` (the first weights plus the updates up to
``k``), and run it on the other side's inputs, which is what a replay does live.

Raw's layer is rebuilt (base's recorded call is the reference); where it cannot be (a class
made inside a function) and the layer has no weights, base's is, and runs on raw's recorded
data, as a BatchNorm is recomputed. A rebuilt layer is trusted only once it gives back its own
side's recorded outputs from that side's own recorded inputs: a layer that
keeps state between calls, takes arguments the dump does not hold, or was rebuilt from another
class of the same name, fails that check and stays "not measured". Classes are looked up among
the modules already imported; only torch's and paddle's own modules are imported for it, and
only their layer classes are ever built (a dump is untrusted input).
"""

from __future__ import annotations

import importlib
import keyword
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbdiff.engine.backward import record_magnitude
from nbdiff.engine.replay import largest_shape, magnitude
from nbdiff.engine.types import Snapshot
from nbdiff.frameworks import Framework, known_frameworks
from nbdiff.judge.metrics import TensorDiff
from nbdiff.trace.dump.store import RankDump
from nbdiff.trace.events import Event, Phase, TensorRecord
from nbdiff.trace.layer_paths import relative
from nbdiff.trace.nest import flatten
from nbdiff.trace.origin.constructors import Constructor
from nbdiff.weights.plan import LayerWeights

__all__ = ["RebuiltSide", "plan_snapshot", "rebuilt_local", "rebuilt_local_backward", "mirrored", "weightless"]

_FRAMEWORKS = ("torch", "paddle")
"""Packages a rebuild may import: the frameworks themselves, which a dump of theirs needs anyway."""

_HELD = 4
"""Rebuilt layers kept at once."""

Weights = dict[str, dict[str, np.ndarray]]
Compare = Callable[..., list[TensorDiff]]
"""``(got, like, scale_hint=0.0)``: records ``got`` against ``like``, rounding judged at least at ``scale_hint``."""
CompareParams = Callable[[dict[str, np.ndarray], dict[str, np.ndarray], float, tuple[int, ...]], list[TensorDiff]]
"""``(base's, raw's, scale_hint, grad_out_shape)``: parameter gradients compared (:func:`compare_param_grads`)."""


@dataclass
class RebuiltSide:
    """One side's dump, fed its steps in order (:meth:`saw`), able to rebuild its layers as they
    were at the step seen last."""

    dump: RankDump
    first: Weights | None = None
    """Every recorded layer's weights as the first recorded step began."""
    _held: tuple[int, Weights] | None = None
    """The weights as the step seen last began: (step position, weights by layer path)."""
    _pending: tuple[int, int | None, list[Event]] = (-1, None, [])
    """The step seen last: position, training number, its updates (they lead to the next one's weights)."""
    scales: dict[str, float] = field(default_factory=dict)
    """Each layer's largest weight magnitude, at most, after the step seen last: its recorded weights'
    (values or statistics) plus every update since. An update is the difference of two weights rounded
    at their magnitude, which its tolerance's floor allows for."""
    _classes: dict[str, Any] = field(default_factory=dict)
    _built: dict[tuple[str, int], tuple[Framework, Any] | str] = field(default_factory=dict)
    """The last layers rebuilt (a layer called several times in a row is built once)."""

    def saw(self, k: int, events: list[Event]) -> None:
        """Step position ``k``'s events, read for comparing: its weights are the recorded ones, or the
        previous step's plus that step's updates (``None`` after a step left out of the recording)."""
        number = _number(events)
        at, before, updates = self._pending
        held = None
        if self._held is not None and self._held[0] == at == k - 1 and before is not None and number == before + 1:
            held = _moved(self._held[1], updates)
        own = _weights_of(events)
        held = own if own is not None else held
        self._held = (k, held) if held is not None else None
        if k == 0:
            self.first = held
        self._pending = (k, number, [e for e in events if e.phase is Phase.OPTIMIZER])
        self._scaled(events)

    def _scaled(self, events: list[Event]) -> None:
        if any(e.phase is Phase.WEIGHTS for e in events):
            self.scales = {e.path: record_magnitude(e.outputs, {}) for e in events if e.phase is Phase.WEIGHTS}
        for e in events:
            if e.phase is Phase.OPTIMIZER:
                self.scales[e.path] = self.scales.get(e.path, 0.0) + record_magnitude(e.outputs, {})

    def weights_at(self, k: int) -> Weights | None:
        """Every recorded layer's weights as step position ``k`` began (the step seen last only)."""
        return self._held[1] if self._held is not None and self._held[0] == k else None

    def layer(self, path: str, k: int) -> tuple[Framework, Any] | str:
        """The layer at ``path`` rebuilt with its weights at step position ``k``; else why not."""
        if (path, k) not in self._built:
            while len(self._built) >= _HELD:  # a big model's layers are not all held at once
                del self._built[next(iter(self._built))]
            self._built[(path, k)] = self._build(path, k)
        return self._built[(path, k)]

    def _build(self, path: str, k: int) -> tuple[Framework, Any] | str:
        ctor = Constructor.from_json(self.dump.meta.get("layer_init", {}).get(path))
        if ctor is None:
            return "its constructor arguments were not recorded as plain values"
        cls = self._class(ctor)
        if isinstance(cls, str):
            return cls
        fw = next((f for f in known_frameworks() if f.name == self.dump.framework), None)
        if fw is None:
            return f"{self.dump.framework} is not imported here"
        if not fw.is_layer_class(cls):  # a dump is untrusted: build nothing but the framework's layers
            return f"{ctor.module}.{ctor.qualname} is not a {fw.name} layer class"
        weights = self.weights_at(k)
        if weights is None:
            kind = self.dump.meta.get("dump_type")
            if kind != "tensor":
                return f"a {kind} dump holds no values to rebuild the layer with (record with dump_type='tensor')"
            return (
                "the dump holds no weights for that step (a step before it was left out, or an older nbdiff wrote it)"
            )
        try:
            layer = cls(**ctor.kwargs)
            own = dict(fw.direct_params(layer)) | dict(fw.direct_buffers(layer))
            recorded = weights.get(path, {})
            if set(recorded) != {n for n, t in own.items() if fw.is_floating(t)} or fw.children(layer):
                return "its rebuilt parameters are not the recorded ones (or it has sublayers)"
            for name, value in recorded.items():
                if tuple(value.shape) != fw.shape_of(own[name]):
                    return f"its parameter {name!r} has another shape when rebuilt"
                fw.set_value(own[name], value)
        except Exception as exc:  # the user's class: whatever it raises means "cannot rebuild"
            return f"building {ctor.qualname} failed ({type(exc).__name__}: {exc})"
        return fw, layer

    @contextmanager
    def loaded(
        self, path: str, k: int, built: tuple[Framework, Any], weights: dict[str, np.ndarray] | None
    ) -> Iterator[None]:
        """The rebuilt layer on ``weights`` (those it has of them; the weights raw would have had on
        base's updates, :mod:`nbdiff.engine.training.drift`) while the block runs, then on its own again."""
        fw, layer = built
        own = dict(fw.direct_params(layer))
        swap = {n: v for n, v in (weights or {}).items() if n in own and tuple(v.shape) == fw.shape_of(own[n])}
        for name, value in swap.items():
            fw.set_value(own[name], value)
        try:
            yield
        finally:
            mine = (self.weights_at(k) or {}).get(path, {})
            for name in swap:
                fw.set_value(own[name], mine[name])

    def _class(self, ctor: Constructor) -> Any:
        key = f"{ctor.module}:{ctor.qualname}"
        if key not in self._classes:
            self._classes[key] = _find_class(ctor)
        return self._classes[key]


def _find_class(ctor: Constructor) -> Any:
    """The class among imported modules (the frameworks' own are imported); else why not."""
    module = sys.modules.get(ctor.module)
    if module is None and ctor.module.partition(".")[0] in _FRAMEWORKS:
        try:
            module = importlib.import_module(ctor.module)
        except Exception as exc:
            return f"{ctor.module} does not import here ({type(exc).__name__})"
    if module is None:
        return f"its module {ctor.module} is not imported here (import it before compare to measure it)"
    obj: Any = module
    for part in ctor.qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type):
        return f"{ctor.module} has no class {ctor.qualname}"
    return obj


def _moved(weights: Weights, updates: list[Event]) -> Weights:
    """``weights`` plus one step's recorded updates (new arrays: what ``first`` holds stays)."""
    held = {p: dict(w) for p, w in weights.items()}
    for e in updates:
        mine = held.get(e.path)
        if mine is None:
            continue
        for t in e.outputs:
            if t.value is None or t.name not in mine or mine[t.name].shape != t.value.shape:
                del held[e.path]  # its weights from here on are unknown
                break
            mine[t.name] = (mine[t.name] + t.value).astype(mine[t.name].dtype)
    return held


def _shapes(records: tuple[TensorRecord, ...]) -> tuple[tuple[int, ...], ...]:
    return tuple(t.shape for t in records)


def _number(events: list[Event]) -> int | None:
    return events[0].step if events else None


def _weights_of(events: list[Event]) -> Weights | None:
    """The weights a step's dump keeps (``None``: none, or their statistics only)."""
    found = [e for e in events if e.phase is Phase.WEIGHTS and any(t.value is not None for t in e.outputs)]
    if not found:
        return None
    # The arrays are added to, never written: no copies.
    return {e.path: {t.name: t.value for t in e.outputs if t.value is not None} for e in found}


def _arguments(
    inputs: tuple[TensorRecord, ...], fw: Framework, differentiated: frozenset[str] = frozenset()
) -> tuple[list[Any], dict[str, Any], list[tuple[str, Any]]] | None:
    """Positional and keyword tensors of a recorded call (``in[0]``, ``in.mask``), and those named in
    ``differentiated`` (made to require gradients); ``None`` where the call cannot be made again from
    them (nested, missing positions, statistics only)."""
    args: dict[int, Any] = {}
    kwargs: dict[str, Any] = {}
    grads: list[tuple[str, Any]] = []
    for t in inputs:
        if t.value is None:
            return None
        name = t.name[2:]
        x = fw.from_numpy(t.value, requires_grad=t.name in differentiated)
        if t.name in differentiated:
            grads.append((t.name, x))
            x = fw.identity(x, copy=True)  # a layer working in place (ReLU(inplace=True)) may not write a leaf
        if name.startswith("[") and name.endswith("]") and name[1:-1].isdigit():
            args[int(name[1:-1])] = x
        elif name.startswith(".") and name[1:].isidentifier() and not keyword.iskeyword(name[1:]):
            kwargs[name[1:]] = x
        else:
            return None
    if sorted(args) != list(range(len(args))):
        return None
    return [args[i] for i in range(len(args))], kwargs, grads


def _run(fw: Framework, layer: Any, inputs: tuple[TensorRecord, ...], training: bool) -> list[TensorRecord] | str:
    called = _arguments(inputs, fw)
    if called is None:
        return "its inputs cannot be given to it again from the dump (nested, or statistics only)"
    args, kwargs, _ = called
    try:
        fw.set_training(layer, training)
        with fw.no_grad():
            out = layer(*args, **kwargs)
    except Exception as exc:
        return f"running it failed ({type(exc).__name__}: {exc})"
    leaves, _ = flatten(out, fw.is_tensor, "out")
    return [
        TensorRecord(name, fw.shape_of(t), fw.dtype_name(t), fw.to_numpy(t)) for name, t in leaves if fw.is_floating(t)
    ]


def _gradients(
    fw: Framework, layer: Any, inputs: tuple[TensorRecord, ...], grads: Event, training: bool
) -> tuple[list[TensorRecord], dict[str, np.ndarray]] | str:
    """The layer's gradients at its inputs and parameters for the gradients ``grads.outputs``
    arriving at its outputs, run on ``inputs``; the inputs differentiated are those ``grads`` has."""
    called = _arguments(inputs, fw, frozenset(t.name for t in grads.inputs))
    if called is None:
        return "its inputs cannot be given to it again from the dump (nested, or statistics only)"
    args, kwargs, ins = called
    params = [(n, p) for n, p in fw.direct_params(layer) if fw.is_trainable(p)]
    arriving = {t.name: t.value for t in grads.outputs}
    try:
        fw.set_training(layer, training)
        leaves, _ = flatten(layer(*args, **kwargs), fw.is_tensor, "out")
        outs, gouts = [], []
        for name, t in leaves:
            g = arriving.get(name)
            if g is not None and fw.requires_grad(t) and tuple(g.shape) == fw.shape_of(t):
                outs.append(t)
                gouts.append(fw.from_numpy(g.astype(fw.to_numpy(t).dtype, copy=False)))
        targets = [t for _, t in ins] + [p for _, p in params]
        if not outs or not targets:
            return "no gradient arriving at its outputs, or nothing to differentiate"
        found = fw.grad(outs, targets, gouts)
    except Exception as exc:
        return f"running its backward failed ({type(exc).__name__}: {exc})"
    in_grads = [
        TensorRecord(name, fw.shape_of(g), fw.dtype_name(g), fw.to_numpy(g))
        for (name, _), g in zip(ins, found)
        if g is not None
    ]
    return in_grads, {n: fw.to_numpy(g) for (n, _), g in zip(params, found[len(ins) :]) if g is not None}


def rebuilt_local(
    base: Event,
    raw: tuple[RebuiltSide, Event],
    k: int,
    compare: Compare,
    training: bool,
    weights: dict[str, np.ndarray] | None = None,
) -> tuple[TensorDiff, ...] | str:
    """Raw's layer, rebuilt at step position ``k``, run on base's recorded inputs, against base's
    recorded outputs: the local error. The rebuild must first give back raw's own recorded outputs
    from raw's own inputs (base's layer is never run: its recorded call is the reference). A string
    says why it was not measured."""
    (side, event), bevent = raw, base
    if _shapes(bevent.inputs) != _shapes(event.inputs):
        return "the two sides' inputs have other shapes"
    built = side.layer(event.path, k)
    if isinstance(built, str):
        return built
    again = _run(*built, event.inputs, training)
    if isinstance(again, str):
        return again
    if len(again) != len(event.outputs) or not all(t.passed for t in compare(again, event.outputs)):
        return "rebuilt, it does not give back its own recorded outputs (it keeps state, or takes more than the dump holds)"
    with side.loaded(event.path, k, built, weights):
        got = _run(*built, bevent.inputs, training)
    if isinstance(got, str):
        return got
    return tuple(compare(got, bevent.outputs))


def rebuilt_local_backward(
    base: tuple[Event, Event],
    raw: tuple[RebuiltSide, Event, Event],
    k: int,
    compare: Compare,
    compare_params: CompareParams,
    training: bool,
    weights: dict[str, np.ndarray] | None = None,
) -> tuple[TensorDiff, ...] | str:
    """Raw's layer, rebuilt, run forward on base's recorded inputs and backward from the gradients
    arriving at base's outputs: its gradients at the inputs and parameters against base's (each
    parameter's converted to raw's layout). The rebuild first gives back raw's own recorded
    gradients from raw's own inputs. (``forward event, backward event`` of base; raw's side too.)"""
    (side, fwd, bwd), (bfwd, bbwd) = raw, base
    if _shapes(bfwd.inputs) != _shapes(fwd.inputs):
        return "the two sides' inputs have other shapes"
    built = side.layer(fwd.path, k)
    if isinstance(built, str):
        return built
    again = _gradients(*built, fwd.inputs, bwd, training)
    if isinstance(again, str):
        return again
    in_grads, params = again
    as_records = [TensorRecord(n, tuple(v.shape), str(v.dtype), v) for n, v in params.items()]
    got = compare(in_grads, bwd.inputs) + compare(as_records, bwd.params)
    if (
        len(in_grads) != len(bwd.inputs)
        or set(params) != {t.name for t in bwd.params}
        or not all(t.passed for t in got)
    ):
        return "rebuilt, its backward does not give back its own recorded gradients (it keeps state, or takes more than the dump holds)"
    with side.loaded(fwd.path, k, built, weights):
        measured = _gradients(*built, bfwd.inputs, bbwd, training)
    if isinstance(measured, str):
        return measured
    in_grads, params = measured
    base_params = {t.name: t.value for t in bbwd.params if t.value is not None}
    # Rounding relative to the gradients arriving, as a live replay judges it (replay.Replayer._grad_diffs): an
    # activation's input gradient is the arriving one times its slope, which can be far smaller (GELU near -0.75).
    hint = magnitude(
        [t.value for t in (*bbwd.outputs, *bbwd.inputs) if t.value is not None] + list(base_params.values())
    )
    return tuple(
        compare(in_grads, bbwd.inputs, hint) + compare_params(base_params, params, hint, largest_shape(bbwd.outputs))
    )


def weightless(base: Event, raw: Event) -> bool:
    """Neither side's layer has parameters (nor parameter gradients): base's runs on raw's data as it is."""
    return not (base.weights or raw.weights or base.params or raw.params)


def mirrored(compare: Compare) -> Compare:
    """``compare`` for base's layer run on raw's data: raw's recorded results against its (the reference)."""
    return lambda got, like, scale_hint=0.0: compare(list(like), tuple(got), scale_hint)


def plan_snapshot(weights: Weights, plans: dict[str, LayerWeights], side: str) -> Snapshot:
    """Recorded weights as :func:`nbdiff.engine.training.updates.snapshot` takes them from live layers: by
    base path, each plan's tensors (a recursive rule's with its sublayers', ``q_proj.weight``)."""
    out: Snapshot = {}
    for key, plan in plans.items():
        path = plan.base_path if side == "base" else plan.raw_path
        arrays: dict[str, np.ndarray] = {}
        for at, held in weights.items():
            rel = relative(at, path)
            if rel == "" or (rel is not None and plan.recursive):
                arrays.update({f"{rel}.{n}" if rel else n: v for n, v in held.items()})
        if arrays:
            out[key] = arrays
    return out
