"""Local error by replay: run one paired layer on the *base* side's inputs.

Forward: the raw layer on base inputs, against base outputs. Backward: both layers
on base inputs with base output gradients, comparing input and parameter
gradients. Running state (BatchNorm statistics) is restored after every replay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.received import received_pairs
from nbdiff.engine.types import TolFn
from nbdiff.frameworks import Framework
from nbdiff.frameworks.interrupts import interrupts_deferred
from nbdiff.judge.bulk import largest_magnitudes
from nbdiff.judge.metrics import TensorDiff, compare_tensors
from nbdiff.judge.tolerance import summed_terms
from nbdiff.trace.calls import input_name
from nbdiff.trace.events import Event, TensorRecord, dtype_name
from nbdiff.trace.modes import kept_state
from nbdiff.trace.nest import flatten, flatten_call, unflatten
from nbdiff.trace.user_state import kept_user_state
from nbdiff.weights.plan import LayerWeights, layer_tensors

__all__ = [
    "Replayer",
    "compare_param_grads",
    "paired_param_grads",
    "compare_paired_grads",
    "largest_shape",
    "magnitude",
    "array_magnitude",
    "param_grad_hint",
]


def magnitude(arrays: list[np.ndarray], cache: dict[int, tuple[np.ndarray, float]] | None = None) -> float:
    """Largest absolute value over several arrays (NaN ignored): the scale a backward event's
    rounding is relative to. ``cache`` keeps each array's value (and the array: its ``id`` stays
    unique) for arrays seen again, as one layer's input gradient is the next one's output gradient."""
    out = 0.0
    for a in arrays:
        m = array_magnitude(a, cache)
        if m > out:
            out = m
    return out


_SMALL = 1 << 16
"""Values up to which a magnitude is read from ``|a|`` made once (beyond: max and -min, nothing written)."""


def array_magnitude(a: np.ndarray, cache: dict[int, tuple[np.ndarray, float]] | None = None) -> float:
    """Largest absolute value of one array (NaN ignored; 0 for an empty or non-float one); see :func:`magnitude`."""
    hit = cache.get(id(a)) if cache is not None else None
    if hit is not None:
        return hit[1]
    if not a.size or a.dtype.kind != "f":
        return 0.0
    if a.size <= _SMALL:  # |a| made and read once: one numpy call fewer than max and min
        m = float(np.abs(a).max())
    else:  # max and -min: two reads, no temporary array
        m = max(float(a.max()), -float(a.min()))
    if m != m:  # NaN: the largest of the rest
        m = max(float(np.fmax.reduce(a, axis=None)), -float(np.fmin.reduce(a, axis=None)))
    if cache is not None:
        cache[id(a)] = (a, m)
    return m


def read_magnitudes(arrays: Iterable[np.ndarray], cache: dict[int, tuple[np.ndarray, float]]) -> None:
    """Each array's :func:`array_magnitude` put in ``cache``, read in one pass over them all (a step's
    gradients: one small numpy call each otherwise); those it leaves out are read alone when asked."""
    todo = list({id(a): a for a in arrays if id(a) not in cache}.values())
    for a, m in zip(todo, largest_magnitudes(todo)):
        if m is not None:
            cache[id(a)] = (a, m)


def largest_shape(records: tuple[TensorRecord, ...]) -> tuple[int, ...]:
    """Shape of the largest of these tensors (a layer's main output), ``()`` if none."""
    return max((tuple(t.shape) for t in records), key=math.prod, default=())


def param_grad_hint(scale_hint: float, param_shape: tuple[int, ...], grad_out_shape: tuple[int, ...]) -> float:
    """The rounding scale of one parameter gradient: the layer's magnitude times the square root
    of the number of terms summed into each element (``()``: no output shape known)."""
    return scale_hint * math.sqrt(summed_terms(param_shape, grad_out_shape)) if grad_out_shape else scale_hint


def compare_param_grads(
    base: dict[str, np.ndarray],
    raw: dict[str, np.ndarray],
    plan: LayerWeights | None,
    tol: TolFn,
    mode: str,
    scale_hint: float = 0.0,
    grad_out_shape: tuple[int, ...] = (),
) -> list[TensorDiff]:
    """Compare parameter gradients (or updates) in raw's layout, converting base's with the layer's rule.
    The arrays are not written again (copies, or results of their own): comparisons that pass
    keep them to compute their metrics when read.

    With ``grad_out_shape`` (the layer's output gradient), ``scale_hint`` grows with the
    square root of the number of terms summed into each gradient element.
    """
    return compare_paired_grads(paired_param_grads(base, raw, plan), tol, mode, scale_hint, grad_out_shape)


def paired_param_grads(
    base: dict[str, np.ndarray], raw: dict[str, np.ndarray], plan: LayerWeights | None
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(name, raw, base converted to raw's layout)`` for every parameter both sides have, contiguous:
    a transposed view (Linear across frameworks) is read 3x slower by every pass than one copy costs."""
    if not base or not raw:
        return []
    try:
        converted = plan.convert(dict(base)) if plan is not None else dict(base)
    except (KeyError, ValueError):
        return []
    return [
        (name, np.ascontiguousarray(r), np.ascontiguousarray(converted[name]))
        for name, r in raw.items()
        if converted.get(name) is not None
    ]


def compare_paired_grads(
    paired: list[tuple[str, np.ndarray, np.ndarray]],
    tol: TolFn,
    mode: str,
    scale_hint: float = 0.0,
    grad_out_shape: tuple[int, ...] = (),
    hint_covers: bool = False,
) -> list[TensorDiff]:
    """:func:`compare_param_grads` of :func:`paired_param_grads`; ``hint_covers``: ``scale_hint`` is
    at least every base gradient's magnitude (see :func:`compare_tensors`)."""
    out = []
    for name, r, b in paired:
        hint = param_grad_hint(scale_hint, tuple(r.shape), grad_out_shape)
        out.append(compare_tensors(name, r, b, tol(dtype_name(b), dtype_name(r)), mode, hint, True, hint_covers))
    return out


def _forced(fw: Framework, t: Any, mine: TensorRecord | None, theirs: TensorRecord | None) -> Any:
    """The base value in place of ``t`` when its shape fits (broadcast if needed), else ``t``."""
    if mine is None or theirs is None or theirs.value is None:
        return t
    shape = fw.shape_of(t)
    try:
        value = np.broadcast_to(theirs.value, shape)
    except ValueError:
        return t
    return fw.from_numpy(value.astype(fw.to_numpy(t).dtype, copy=False), device=fw.device_of(t))


def _fits(theirs: TensorRecord, mine: TensorRecord, same_kind: bool = True) -> bool:
    """Whether base's tensor can stand in for the layer's own: same rank (and kind), broadcastable."""
    if theirs.value is None or mine.value is None or len(theirs.shape) != len(mine.shape):
        return False
    if same_kind and theirs.value.dtype.kind != mine.value.dtype.kind:
        return False
    return all(a == b or a == 1 for a, b in zip(theirs.shape, mine.shape))


class Replayer:
    """Measures local errors of paired events."""

    def __init__(self, bfw: Framework, rfw: Framework, plans: dict[str, LayerWeights], tol: TolFn, mode: str) -> None:
        self.bfw, self.rfw, self.plans, self.tol, self.mode = bfw, rfw, plans, tol, mode
        self.evidence: tuple[TensorRecord, ...] = ()
        """The last :meth:`forward`'s failing sublayer inputs, as raw's own code computed them."""
        self.kept_state = False
        """Whether the last :meth:`forward` was not measured because the layer keeps state between calls."""

    def _args(
        self, fw: Framework, template_event: Event, base_inputs: Event, grad: bool
    ) -> tuple[Any, list[Any], list[np.ndarray]] | None:
        """The layer's call with base's inputs in place of its own, the values given, and those of
        its own inputs kept.

        Inputs pair by name, else in order among those that fit. Forward only, an input base has no
        counterpart for (paddle's attention mask, where transformers passes ``None``) keeps the
        layer's own recorded value; gradients need every input from base.
        """
        mine_all, theirs_all = template_event.inputs, base_inputs.inputs
        # By name, then in order among those that fit (not by place: positions passed by place on one
        # side fed the other's sine into its cosine).
        paired = dict((r.name, b) for r, b in zip(*received_pairs(mine_all, theirs_all, _fits)))
        values, fed, kept = [], 0, []
        device = fw.device_of(template_event.layer) if template_event.layer is not None else None
        for mine in mine_all:
            theirs = paired.get(mine.name)
            if theirs is not None and not _fits(theirs, mine, same_kind=False):
                theirs = None  # same name, but a shape this layer cannot take (a wrong pairing)
            if theirs is None:
                if grad:
                    return None
                values.append(fw.from_numpy(mine.data, device=device))
                kept.append(mine.data)
                continue
            arr = np.broadcast_to(theirs.data, mine.shape).astype(mine.data.dtype)
            values.append(fw.from_numpy(arr, requires_grad=grad, device=device))
            fed += 1
        if not fed or (grad and len(mine_all) != len(theirs_all)):
            return None
        return unflatten(template_event.template, values), values, kept

    def forward(
        self,
        base: Event,
        raw: Event,
        children: list[tuple[Event, Event]] = (),  # type: ignore[assignment]
    ) -> tuple[TensorDiff, ...] | None:
        """Raw layer on base inputs, compared with base outputs.

        ``children``: ``(base, raw)`` events of the paired sublayers called inside this call.
        Their outputs are forced to the base values, so what remains is the error of this
        layer's own code, not the sum of its sublayers' rounding.
        """
        fw = self.rfw
        self.evidence, self.kept_state = (), False
        built = self._args(fw, raw, base, grad=False)
        if built is None or raw.layer is None:
            return None
        (args, kwargs), _, own = built
        # Inputs base has no counterpart for keep raw's own values: what the layer hands on of them
        # unchanged (position embeddings in another layout) is not its own code's difference.
        handles: list[Any] = []  # filled inside the try: a Ctrl-C once one is on still removes it
        try:
            fed, given = self._force_outputs(children, own, handles)
            with kept_state(fw, raw.layer), kept_user_state(fw, raw.layer) as state, fw.no_grad():
                out = raw.layer(*args, **kwargs)
        except Exception:
            return None
        finally:
            for h in handles:
                h.remove()
        if state.changed:
            self.kept_state = True
            return None  # it keeps state between calls (a KV cache): run again, it is not the call of the step
        self.evidence = tuple(given)
        leaves, _ = flatten(out, fw.is_tensor, "out")
        diffs = list(fed)
        for (_, t), b in zip(leaves, base.outputs):
            r = fw.to_numpy(t)
            diffs.append(compare_tensors(b.name, r, b.data, self.tol(b.dtype, fw.dtype_name(t)), self.mode))
        return tuple(diffs) if diffs else None

    def _force_outputs(
        self,
        children: list[tuple[Event, Event]],
        own: list[np.ndarray],
        handles: list[Any],
    ) -> tuple[list[TensorDiff], list[TensorRecord]]:
        """Hooks (their handles added to ``handles``) making each paired sublayer return the base side's
        recorded outputs, call by call.

        What the layer's own code hands each sublayer is compared with what base handed it
        (the second list, filled as the replay runs): code between two sublayers shows there.
        The third keeps the values of those that fail, named as compared: the evidence.
        A value handed on exactly as one of ``own`` (raw's inputs not fed from base) is left out.
        """
        fw = self.rfw
        fed: list[TensorDiff] = []
        failing: list[TensorRecord] = []
        queue: dict[int, list[tuple[Event, Event]]] = {}
        layers: dict[int, Any] = {}
        for b, r in sorted(children, key=lambda br: br[1].order):
            if r.layer is not None:
                queue.setdefault(id(r.layer), []).append((b, r))
                layers[id(r.layer)] = r.layer

        given_now: dict[int, list[Any]] = {}

        def pre(layer: Any, args: tuple, kwargs: dict) -> None:
            # What the sublayer is handed, copied before it runs: an in-place layer (ReLU(inplace=True))
            # writes its output over its input.
            if queue.get(id(layer)):
                given, _ = flatten_call(args, kwargs, fw.is_tensor)
                given_now.setdefault(id(layer), []).append(
                    [
                        TensorRecord(input_name(key), fw.shape_of(t), fw.dtype_name(t), fw.to_numpy(t).copy())
                        for key, t in given
                        if fw.is_floating(t)
                    ]
                )

        def post(layer: Any, args: tuple, kwargs: dict, output: Any) -> Any:
            todo = queue.get(id(layer))
            if not todo:
                return None
            b, r = todo.pop(0)
            stack = given_now.get(id(layer))
            given = stack.pop() if stack else []
            # Paired by name, then by shape: the two sides may pass other arguments (positions, a mask).
            for got, want in zip(*received_pairs(given, b.inputs)):
                if got.value is not None and any(_same_array(got.value, o) for o in own):
                    continue
                if want.value is not None and got.value is not None:
                    tol = self.tol(want.dtype, str(got.value.dtype))
                    name = f"{b.path}{f'#{b.call}' if b.call else ''}:{want.name}"
                    fed.append(compare_tensors(name, got.value, want.value, tol, self.mode))
                    if not fed[-1].passed:
                        failing.append(replace(got, name=fed[-1].name))
            leaves, template = flatten(output, fw.is_tensor, "out")
            values = []
            for i, (_, t) in enumerate(leaves):
                mine = r.outputs[i] if i < len(r.outputs) else None
                theirs = b.outputs[i] if i < len(b.outputs) else None
                values.append(_forced(fw, t, mine, theirs))
            return unflatten(template, values)

        with interrupts_deferred():  # each hook with its handle kept, or neither
            for layer in layers.values():
                handles += fw.hook_forward(layer, pre, post)
        return fed, failing

    def _grads(
        self, fw: Framework, fwd: Event, base_fwd: Event, grad_out: Event, plan_recursive: bool
    ) -> tuple[list, dict] | None:
        built = self._args(fw, fwd, base_fwd, grad=True)
        if built is None or fwd.layer is None:
            return None
        _, ins, _ = built
        # Copies, not the leaves themselves: an in-place layer (ReLU(inplace=True)) cannot write a leaf.
        args, kwargs = unflatten(fwd.template, [fw.identity(x, copy=True) if fw.requires_grad(x) else x for x in ins])
        params = {n: p for n, p in layer_tensors(fw, fwd.layer, plan_recursive).items() if fw.is_trainable(p)}
        # Gradients inside kept_state: restoring a train-mode BatchNorm's running statistics writes
        # tensors its backward still holds ("modified by an inplace operation").
        with kept_state(fw, fwd.layer), kept_user_state(fw, fwd.layer) as state:
            out = fwd.layer(*args, **kwargs)
            leaves, _ = flatten(out, fw.is_tensor, "out")
            by_name = {t.name: t.data for t in grad_out.outputs}
            in_order = [t.data for t in grad_out.outputs]
            outs, gouts = [], []
            for i, (name, t) in enumerate(leaves):
                # By name, else by position: a tuple on one side, a tensor on the other (attention).
                g = by_name.get(name, in_order[i] if len(leaves) == 1 and i < len(in_order) else None)
                if g is not None and fw.requires_grad(t) and tuple(g.shape) == fw.shape_of(t):
                    outs.append(t)
                    gouts.append(fw.from_numpy(g.astype(fw.to_numpy(t).dtype, copy=False), device=fw.device_of(t)))
            targets = [x for x in ins if fw.requires_grad(x)] + list(params.values())
            if not outs or not targets:
                return None
            grads = fw.grad(outs, targets, gouts)
        if state.changed:
            return None  # it keeps state between calls: run again, it is not the call of the step
        k = sum(1 for x in ins if fw.requires_grad(x))
        in_grads = [None if g is None else fw.to_numpy(g) for g in grads[:k]]
        p_grads = {n: fw.to_numpy(g) for n, g in zip(params, grads[k:]) if g is not None}
        return in_grads, p_grads

    def backward(self, base_fwd: Event, raw_fwd: Event, base_bwd: Event) -> tuple[TensorDiff, ...] | None:
        """Both layers on base inputs and base output gradients; input and parameter gradients compared."""
        plan = self.plans.get(base_fwd.path)
        recursive = bool(plan and plan.recursive)
        try:
            b = self._grads(self.bfw, base_fwd, base_fwd, base_bwd, recursive)
            r = self._grads(self.rfw, raw_fwd, base_fwd, base_bwd, recursive)
        except Exception:
            return None
        if b is None or r is None:
            return None
        return self._grad_diffs(b, r, base_bwd, plan)

    def _grad_diffs(
        self, b: tuple[list, dict], r: tuple[list, dict], base_bwd: Event, plan: LayerWeights | None
    ) -> tuple[TensorDiff, ...] | None:
        """Input gradients (in order) and parameter gradients (by name) of base and raw, compared."""
        hint = magnitude([t.value for t in base_bwd.outputs] + [g for g in b[0] if g is not None] + list(b[1].values()))
        diffs = [
            compare_tensors(f"in[{i}]", gr, gb, self.tol(str(gb.dtype), str(gr.dtype)), self.mode, hint)
            for i, (gb, gr) in enumerate(zip(b[0], r[0]))
            if gb is not None and gr is not None
        ]
        diffs += compare_param_grads(b[1], r[1], plan, self.tol, self.mode, hint, largest_shape(base_bwd.outputs))
        return tuple(diffs) or None

    def backward_on_raw_inputs(
        self, base_fwd: Event, raw_fwd: Event, base_bwd: Event, raw_bwd: Event
    ) -> tuple[TensorDiff, ...] | None:
        """Base's layer run on raw's forward inputs and base's arriving gradients; the input and parameter
        gradients it makes compared with raw's. Passing: what raw's layer did is what base's would do on
        raw's inputs (a ReLU's mask where an input sits within rounding of 0; a weight gradient summed
        from inputs that differ within their tolerance), so the forward inputs' differences make the
        backward's."""
        plan = self.plans.get(base_fwd.path)
        try:
            b = self._grads(self.bfw, base_fwd, raw_fwd, base_bwd, bool(plan and plan.recursive))
        except Exception:
            return None
        if b is None:
            return None
        recorded = [t.value for t in raw_bwd.inputs], {t.name: t.value for t in raw_bwd.params if t.value is not None}
        return self._grad_diffs(b, recorded, base_bwd, plan)


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
